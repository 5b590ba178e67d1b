"""bench/peers/accelerate_opt.py on the CPU: the HF model it builds (OPT and Mixtral), Accelerate's map under a
budget, the random materialisation, greedy decoding with a KV cache against HF's own `generate`, and a whole
`--device cpu` run."""

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("accelerate")
transformers = pytest.importorskip("transformers")

import accelerate_opt as acc  # noqa: E402
import peer_common as pc  # noqa: E402

TINY = {"model_type": "opt", "architectures": ["OPTForCausalLM"], "hidden_size": 64, "num_hidden_layers": 4,
        "ffn_dim": 256, "num_attention_heads": 4, "vocab_size": 512, "max_position_embeddings": 256,
        "word_embed_proj_dim": 64, "do_layer_norm_before": True, "enable_bias": True, "activation_function": "relu",
        "tie_word_embeddings": True, "pad_token_id": 1, "bos_token_id": 2, "eos_token_id": 2}


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny") / "config.json"
    path.write_text(json.dumps(TINY))
    return str(path)


def test_hf_model_has_the_zoo_shapes_param_count():
    shapes = pc.opt_shapes("opt-30b")
    model = acc._meta_model(acc.model_config("opt-30b"))
    assert sum(p.numel() for p in model.parameters()) == shapes.params
    assert model.lm_head.weight is model.model.decoder.embed_tokens.weight
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


def test_device_for_takes_the_longest_prefix():
    device_map = {"model.decoder.layers.1": "cpu", "model.decoder.layers.10": 0, "model.decoder": 0}
    assert acc.device_for("model.decoder.layers.1.fc1.weight", device_map) == "cpu"
    assert acc.device_for("model.decoder.layers.10.fc1.weight", device_map) == 0
    assert acc.device_for("model.decoder.embed_tokens.weight", device_map) == 0
    assert acc.device_for("anything", {"": "cpu"}) == "cpu"
    with pytest.raises(KeyError):
        acc.device_for("lm_head.weight", device_map)


def test_accelerate_map_bounds_gpu_weights_by_the_budget():
    shapes = pc.opt_shapes("opt-30b")
    model = acc._meta_model(acc.model_config("opt-30b"))
    budget = 24 * 2**30
    device_map = acc.plan_device_map(model, budget, 400 * 2**30)
    on_gpu = sum(p.numel() * 2 for name, p in model.named_parameters() if acc.device_for(name, device_map) == 0)
    offloaded = sum(p.numel() * 2 for name, p in model.named_parameters()
                    if acc.device_for(name, device_map) == "cpu")
    assert 0 < on_gpu <= budget
    assert on_gpu + offloaded == 2 * shapes.params
    layer_bytes = 2 * (12 * 7168**2 + 13 * 7168)
    assert offloaded >= 20 * layer_bytes  # most of the 60 GB model is left to cross PCIe every token


def test_materialise_fills_every_weight_once_in_bf16(tiny_config):
    shapes = pc.opt_shapes(tiny_config)
    model = acc._meta_model(acc.model_config(tiny_config))
    placed = acc.materialise(model, {"": "cpu"}, pinned=False, seed=3)
    assert placed == {"cpu": 2 * shapes.params}
    assert all(p.device.type == "cpu" and p.dtype == torch.bfloat16 for p in model.parameters())
    assert model.lm_head.weight is model.model.decoder.embed_tokens.weight
    fc1 = model.model.decoder.layers[0].fc1.weight.float()
    assert 0.015 < fc1.std().item() < 0.025 and abs(fc1.mean().item()) < 0.005


def test_greedy_decoding_matches_hf_generate(tiny_config):
    shapes = pc.opt_shapes(tiny_config)
    model = acc._meta_model(acc.model_config(tiny_config))
    acc.materialise(model, {"": "cpu"}, pinned=False, seed=0)
    model.float()  # fp32: greedy ties cannot differ by rounding between the two loops
    ids = torch.tensor(pc.random_token_ids(2, 12, shapes.vocab_size, seed=1))
    prefill, steps, tokens = acc.generate_timed(model, ids, 6, sync=lambda: None)
    assert prefill > 0 and len(steps) == 5 and tokens.shape == (2, 6)
    reference = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False,
                               min_new_tokens=6, pad_token_id=1)
    assert torch.equal(tokens, reference[:, 12:])


def test_cpu_run_end_to_end(tiny_config, tmp_path, capsys):
    out = tmp_path / "acc.json"
    code = acc.main(["--model", tiny_config, "--device", "cpu", "--batch", "2", "--prompt-len", "8", "--gen-len",
                     "3", "--json-out", str(out)])
    assert code == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed == json.loads(out.read_text())
    assert printed["error"] is None and printed["peer"] == "accelerate"
    assert printed["decode_steps"] == 2
    total_s = (printed["prefill_ms"] + 2 * printed["decode_ms_per_token"]) / 1e3
    assert printed["tokens_per_second"] == pytest.approx(2 * 3 / total_s)
    assert printed["settings"]["weight_bytes_by_device"] == {"cpu": 2 * pc.opt_shapes(tiny_config).params}


def test_no_cuda_is_an_error_in_the_json_not_a_traceback(tiny_config, capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert acc.main(["--model", tiny_config, "--gen-len", "2"]) == 1
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["error"].startswith("RuntimeError: CUDA is not available")


# A tiny Mixtral: 8 experts of 96, top-2, GQA 4/2 (HF's field names, as a user's config.json).
TINY_MIXTRAL = {"model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "hidden_size": 64,
                "intermediate_size": 96, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
                "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 112, "max_position_embeddings": 64,
                "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False}


@pytest.fixture(scope="module")
def mixtral_config(tmp_path_factory):
    path = tmp_path_factory.mktemp("mixtral") / "config.json"
    path.write_text(json.dumps(TINY_MIXTRAL))
    return str(path)


@pytest.mark.parametrize("model", ["mixtral-8x7b", "llama-3.1-8b", "qwen2.5-7b", "opt-30b"])
def test_hf_config_reads_back_to_liacs_config(model):
    """The HF config the driver builds is the model liac compiles for: liac's own reader gives the config back."""
    from liac.models import resolve_model
    from liac.models.config import from_hf_config

    cfg = resolve_model(model)
    back = from_hf_config(acc.hf_config(cfg).to_dict(), name=cfg.name)
    assert back == cfg


def test_mixtral_has_liacs_parameter_count_and_keeps_experts_in_its_decoder_layers():
    """HF's Mixtral built from liac's 16-layer Mixtral-8x7B holds as many parameters as liac's model of it, and
    Accelerate may not split a decoder layer (router and experts travel together)."""
    from liac.models import build_model

    cfg = acc.model_config("mixtral-8x7b", layers=16)
    assert cfg.num_layers == 16
    model = acc._meta_model(cfg)
    with torch.device("meta"):
        ours = build_model(cfg)
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in ours.parameters())
    assert acc.no_split_modules(model) == ["MixtralDecoderLayer"]
    device_map = acc.plan_device_map(model, 12 * 2**30, 400 * 2**30)
    layers = {k: v for k, v in device_map.items() if k.startswith("model.layers.")}
    assert set(layers.values()) == {0, "cpu"}  # some layers on the GPU, the others offloaded whole
    assert all(k.count(".") == 2 for k in layers)  # whole layers: model.layers.N


def test_layers_beyond_the_model_are_refused():
    with pytest.raises(ValueError, match="--layers: 'mixtral-8x7b' has 32 decoder layers, got 40"):
        acc.model_config("mixtral-8x7b", layers=40)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mixtral_greedy_decoding_matches_hf_generate(mixtral_config, dtype):
    """The driver's timed loop (prefill, then one token per step through the KV cache) gives HF generate's greedy
    tokens on a tiny Mixtral, on the same weights, in fp32 and in bf16."""
    cfg = acc.model_config(mixtral_config)
    model = acc._meta_model(cfg)
    acc.materialise(model, {"": "cpu"}, pinned=False, seed=0)
    model.to(dtype)
    ids = torch.tensor(pc.random_token_ids(2, 10, cfg.vocab_size, seed=1))
    prefill, steps, tokens = acc.generate_timed(model, ids, 6, sync=lambda: None)
    assert prefill > 0 and len(steps) == 5 and tokens.shape == (2, 6)
    reference = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False,
                               min_new_tokens=6, pad_token_id=0)
    assert torch.equal(tokens, reference[:, 10:])


def test_mixtral_cpu_run_end_to_end(mixtral_config, tmp_path, capsys):
    out = tmp_path / "acc.json"
    code = acc.main(["--model", mixtral_config, "--layers", "2", "--device", "cpu", "--batch", "1", "--prompt-len",
                     "8", "--gen-len", "3", "--json-out", str(out)])
    assert code == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["error"] is None and printed["decode_steps"] == 2
    assert printed["settings"]["no_split_module_classes"] == ["MixtralDecoderLayer"]
    h, f, e, v = 64, 96, 8, 112
    layer = 2 * h * h + 2 * 32 * h + e * h + e * 3 * h * f + 2 * h  # q,o; k,v (2 KV heads of 16); router; experts; norms
    assert printed["settings"]["weight_bytes_by_device"] == {"cpu": 2 * (2 * v * h + 2 * layer + h)}
