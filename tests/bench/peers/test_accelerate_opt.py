"""bench/peers/accelerate_opt.py on the CPU: the HF model it builds, Accelerate's map under a budget, the random
materialisation, greedy decoding with a KV cache against HF's own `generate`, and a whole `--device cpu` run."""

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
    model = acc._meta_model(shapes)
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
    model = acc._meta_model(shapes)
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
    model = acc._meta_model(shapes)
    placed = acc.materialise(model, {"": "cpu"}, pinned=False, seed=3)
    assert placed == {"cpu": 2 * shapes.params}
    assert all(p.device.type == "cpu" and p.dtype == torch.bfloat16 for p in model.parameters())
    assert model.lm_head.weight is model.model.decoder.embed_tokens.weight
    fc1 = model.model.decoder.layers[0].fc1.weight.float()
    assert 0.015 < fc1.std().item() < 0.025 and abs(fc1.mean().item()) < 0.005


def test_greedy_decoding_matches_hf_generate(tiny_config):
    shapes = pc.opt_shapes(tiny_config)
    model = acc._meta_model(shapes)
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
