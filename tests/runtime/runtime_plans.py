"""Hand-made plans and tiny HF checkpoints for the runtime tests (no compiler involved).

    cfg = save_hf_checkpoint("llama", tmp_path / "ckpt")          # random HF model → safetensors + config.json
    plan = make_plan(cfg, "partial", kv_tier="ddr")               # valid per liac.plan.check_semantics

Policies (for the decoder layers from `resident_layers` on; layers before it are all-GPU with weights and KV in
HBM):
    'gpu'      every sublayer on the GPU
    'cpu'      every sublayer on the CPU, embedding and LM head too (weights and KV in a host tier)
    'partial'  LIA's partial policy: attention (score and context) on the CPU, the GEMMs on the GPU
    'mixed'    prefill all on the GPU; decode splits the layer across devices (qkv, score, fc1 on the GPU,
               context, out_proj, fc2 on the CPU), weights streamed from DDR, the embedding on the GPU over a DDR
               table (rows gathered on the host), the LM head streamed to the GPU; with `cxl_layers` the last
               layers form a third group in the 'cxl' tier
    'crossed'  weights and KV in DDR: prefill qkv on the GPU (its K/V written into the host cache through PCIe),
               attention on the CPU; decode qkv and score on the CPU (over the cache's whole capacity), context on
               the GPU over a streamed window; the GEMMs alternate between the devices
    'split'    (plan v2) every weight GEMM unit and the LM head split by output features in both phases, the CPU
               taking `permille` of them (an int, or unit → int); weights in DDR, GPU parts streamed; attention
               on the GPU at prefill and on the CPU at decode (KV in DDR), or on the GPU in both phases
               (`split_attention='gpu'`: the decode KV window is streamed); the embedding gathers on the host
Any of them may cut its prefill into micro-batches (`microbatch=(sequences, prompt tokens)`, plan v3).
With `experts` (an `ExpertPlacement`, MoE models), the offloaded groups' experts sublayer places its experts by
count instead: so many resident in HBM, so many on the CPU per phase, the rest streamed (its placements, permille
and tier follow from the counts, as `liac.plan.check_semantics` wants them).
`spec.memory` and `spec.execution` are filled from closed-form byte counts (parameter numels, the KV formula), an
upper bound of what the runtime allocates; `status` carries made-up but valid predictions.
"""

from __future__ import annotations

import json

import pytest
import torch

from liac.models import SUBLAYERS, build_model
from liac.models.config import ModelConfig, from_hf_config
from liac.plan import (API_VERSION, EXPERT_SLOTS, Budgets, Execution, ExpertPlacement, HardwareSpec, LayerGroup,
                       Metadata, ModelSpec, OffloadPlan, PlanSpec, PlanStatus, Predicted, SolverReport,
                       SublayerPlacement, SublayerTime, TierBytes, TierUsage, Workload, expert_placement,
                       experts_permille, Serving, ServingStatus)
from liac.runtime.backend import EmulatedBackend

__all__ = ["FAMILIES", "POLICIES", "BACKENDS", "NEW_TOKENS", "PROMPT", "PinningBackend", "make_test_backend",
           "hf_config", "save_hf_checkpoint", "make_plan", "hf_model_class", "hf_greedy", "assert_bf16_logits_close",
           "placement", "with_experts", "TINY", "TEXT", "CHAT_TEMPLATE", "train_tokenizer", "save_text_checkpoint",
           "hf_text_generate"]

# The CPU-backed emulation always; CUDA marked `gpu` (deselected by default, run with `pytest -m gpu`).
BACKENDS = [pytest.param("emulated", id="emulated"), pytest.param("cuda", marks=pytest.mark.gpu, id="cuda")]
FAMILIES = ("opt", "llama", "qwen2")
POLICIES = ("gpu", "cpu", "partial", "mixed", "crossed")
_NO_WEIGHTS = ("attn_score", "attn_context")


class PinningBackend(EmulatedBackend):
    """The emulation, but with page-locking calls recorded (their tensors' element counts), refused on demand."""

    pin_memory = True

    def __init__(self, refuse: bool = False):
        super().__init__()
        self.refuse, self.pinned, self.unpinned = refuse, [], []

    def pin(self, tensor):
        self.pinned.append(tensor.numel())
        return not self.refuse

    def unpin(self, tensor):
        self.unpinned.append(tensor.numel())


def make_test_backend(name: str):
    from liac.runtime.backend import CudaBackend

    return EmulatedBackend() if name == "emulated" else CudaBackend()


# Tiny MoE shapes: (experts, top-k) of the 'mixtral' checkpoints, and a second routing for 'mixtral-k3'.
MOE_SHAPES = {"mixtral": (8, 2), "mixtral-k3": (6, 3)}


def hf_config(family: str, layers: int = 3):
    """A tiny HF config: 64 wide, 4 heads (2 KV heads for Llama, Qwen2 and Mixtral: GQA), vocab 112, 64 positions;
    Mixtral with 8 experts of 96, top-2 ('mixtral-k3': 6 experts, top-3)."""
    import transformers

    common = dict(hidden_size=64, num_hidden_layers=layers, num_attention_heads=4, vocab_size=112,
                  max_position_embeddings=64, initializer_range=0.2)
    if family in MOE_SHAPES:
        experts, top_k = MOE_SHAPES[family]
        return transformers.MixtralConfig(intermediate_size=96, num_key_value_heads=2, rms_norm_eps=1e-5,
                                          rope_theta=10000.0, tie_word_embeddings=False, num_local_experts=experts,
                                          num_experts_per_tok=top_k, **common)
    if family == "opt":
        return transformers.OPTConfig(ffn_dim=128, word_embed_proj_dim=64, **common)
    if family == "llama":
        return transformers.LlamaConfig(intermediate_size=96, num_key_value_heads=2, rms_norm_eps=1e-5,
                                        rope_theta=10000.0, tie_word_embeddings=False, **common)
    return transformers.Qwen2Config(intermediate_size=96, num_key_value_heads=2, rms_norm_eps=1e-6,
                                    rope_theta=10000.0, tie_word_embeddings=True, use_sliding_window=False, **common)


# A tiny OPT for CLI and metrics tests that need no checkpoint (random weights).
TINY = ModelConfig(name="tiny-opt", family="opt", hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=4,
                   head_dim=8, ffn_dim=64, vocab_size=50, max_position=64, norm="layernorm", norm_eps=1e-5,
                   activation="relu", qkv_bias=True, proj_bias=True, tie_embeddings=True)

# The prompt and length of the parity tests (test_parity.py, test_split.py) against HF's greedy tokens.
NEW_TOKENS = 16
PROMPT = torch.randint(0, 112, (2, 8), generator=torch.Generator().manual_seed(7))


def hf_greedy(model, ids: torch.Tensor, new_tokens: int):
    """Greedy decoding by full recomputation: tokens [B, n], logits [B, n, V] (float32)."""
    sequence, tokens, logits = ids, [], []
    with torch.no_grad():
        for _ in range(new_tokens):
            last = model(sequence).logits[:, -1].float()
            nxt = last.argmax(-1, keepdim=True)
            tokens.append(nxt)
            logits.append(last)
            sequence = torch.cat([sequence, nxt], dim=1)
    return torch.cat(tokens, dim=1), torch.stack(logits, dim=1)


def assert_bf16_logits_close(out, fp32, bf16) -> None:
    """The runtime's bf16 logits, teacher-forced on the tokens it generated, must be as close to HF's fp32 logits as
    HF's own bf16 runs are (`bf16`: one model or several, e.g. SDPA and eager attention; the larger error counts,
    plus a margin), and within 5 % of the logit range or HF's own bf16 error, whichever is larger."""
    sequence = torch.cat([PROMPT, out.token_ids], dim=1)
    positions = slice(PROMPT.shape[1] - 1, -1)  # the logits each generated token was picked from
    models = bf16 if isinstance(bf16, (tuple, list)) else (bf16,)
    with torch.no_grad():
        truth = fp32(sequence).logits[:, positions].float()
        hf_error = max((model(sequence).logits[:, positions].float() - truth).abs().max().item() for model in models)
    ours_error = (out.logits - truth).abs().max().item()
    assert ours_error <= 1.5 * hf_error + 0.02, (ours_error, hf_error)
    assert ours_error <= max(0.05 * truth.abs().max().item(), hf_error), (ours_error, hf_error,
                                                                          truth.abs().max().item())


def hf_model_class(family: str):
    import transformers

    return {"opt": transformers.OPTForCausalLM, "llama": transformers.LlamaForCausalLM,
            "qwen2": transformers.Qwen2ForCausalLM, "mixtral": transformers.MixtralForCausalLM,
            "mixtral-k3": transformers.MixtralForCausalLM}[family]


def save_hf_checkpoint(family: str, directory, seed: int = 0, layers: int = 3,
                       max_shard_size: str | None = None) -> ModelConfig:
    """Save a randomly initialised HF model (fp32 safetensors) to `directory`; return its liac ModelConfig."""
    torch.manual_seed(seed)
    model = hf_model_class(family)(hf_config(family, layers)).eval()
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(directory, safe_serialization=True, **kwargs)
    data = json.loads((directory / "config.json").read_text())
    return from_hf_config(data, name=directory.name)


def placement(name: str, prefill: str, decode: str, tier: str, prefill_permille: int | None = None,
              decode_permille: int | None = None) -> SublayerPlacement:
    """A SublayerPlacement; permille defaults to 1000 on the CPU and 0 on the GPU (a split must give its own)."""
    whole = {"cpu": 1000, "gpu": 0}
    return SublayerPlacement(name, prefill, decode, tier,
                             whole[prefill] if prefill_permille is None else prefill_permille,
                             whole[decode] if decode_permille is None else decode_permille)


def _units(names, prefill, decode, tier, permille=None):
    if isinstance(prefill, str):
        prefill = {n: prefill for n in names}
    if isinstance(decode, str):
        decode = {n: decode for n in names}
    permille = permille or {}
    return tuple(placement(n, prefill[n], decode[n], "none" if n in _NO_WEIGHTS else tier,
                           permille.get(n) if prefill[n] == "split" else None,
                           permille.get(n) if decode[n] == "split" else None) for n in names)


def _placements(cfg: ModelConfig, policy: str):
    """(prefill devices, decode devices, embed (prefill, decode), head (prefill, decode)) of the offloaded group."""
    qkv, score, context, out_proj, up, down = SUBLAYERS[cfg.family]
    if policy == "gpu":
        return "gpu", "gpu", ("gpu", "gpu"), ("gpu", "gpu")
    if policy == "cpu":
        return "cpu", "cpu", ("cpu", "cpu"), ("cpu", "cpu")
    if policy == "partial":
        devices = {qkv: "gpu", score: "cpu", context: "cpu", out_proj: "gpu", up: "gpu", down: "gpu"}
        return devices, devices, ("gpu", "gpu"), ("gpu", "gpu")
    if policy == "mixed":
        decode = {qkv: "gpu", score: "gpu", context: "cpu", out_proj: "cpu", up: "gpu", down: "cpu"}
        return "gpu", decode, ("gpu", "gpu"), ("gpu", "gpu")
    if policy == "crossed":
        prefill = {qkv: "gpu", score: "cpu", context: "cpu", out_proj: "gpu", up: "cpu", down: "gpu"}
        decode = {qkv: "cpu", score: "cpu", context: "gpu", out_proj: "gpu", up: "gpu", down: "cpu"}
        return prefill, decode, ("gpu", "gpu"), ("gpu", "gpu")
    if policy == "split":
        gemms = {n: "split" for n in (qkv, out_proj, up, down)}
        return ({**gemms, score: "gpu", context: "gpu"}, {**gemms, score: "cpu", context: "cpu"}, ("gpu", "gpu"),
                ("split", "split"))
    raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")


def with_experts(cfg: ModelConfig, group: LayerGroup, placed: ExpertPlacement) -> LayerGroup:
    """`group` with its experts sublayer placed by `placed`'s counts (the other sublayers as they were)."""
    import dataclasses

    experts, host = cfg.num_experts, next(s.weights for s in group.sublayers if s.name == "experts")
    device = {}
    for phase in ("prefill", "decode"):
        cpu = placed.cpu(phase)
        device[phase] = "cpu" if cpu == experts else "gpu" if cpu == 0 else "split"
    tier = "hbm" if placed.hbm == experts else host if host != "hbm" else "ddr"
    sub = SublayerPlacement("experts", device["prefill"], device["decode"], tier,
                            experts_permille(placed.prefill_cpu, experts), experts_permille(placed.decode_cpu, experts),
                            placed)
    return dataclasses.replace(group, sublayers=tuple(sub if s.name == "experts" else s for s in group.sublayers))


def _param_numels(cfg: ModelConfig) -> dict[str, int]:
    with torch.device("meta"):
        model = build_model(cfg.with_layers(1))
    out = {"embed": sum(p.numel() for p in model.embed.parameters()),
           "lm_head": sum(p.numel() for p in model.lm_head.parameters())}
    layer = model.layers[0]
    for unit in SUBLAYERS[cfg.family]:
        module = getattr(layer, "attn" if unit in _NO_WEIGHTS else unit)
        out[unit] = sum(p.numel() for p in module.parameters())
    return out


def make_plan(cfg: ModelConfig, policy: str = "gpu", *, weights_tier: str | None = None, kv_tier: str | None = None,
              resident_layers: int = 0, cxl_layers: int = 0, batch: int = 2, prompt_len: int = 8, gen_len: int = 20,
              prefetch_depth: int = 1, memory: TierBytes | None = None, staging_bytes: int | None = None,
              permille: int | dict[str, int] = 500, split_attention: str = "cpu",
              microbatch: tuple[int, int] | None = None, experts: ExpertPlacement | None = None,
              layer_groups: tuple[LayerGroup, ...] | None = None) -> OffloadPlan:
    """A valid plan for `cfg` (see the module docstring); `microbatch`: the prefill's (sequences, prompt tokens)
    per micro-batch (default: the whole batch at once); `layer_groups`: these groups instead of the policy's (e.g. a
    compiled plan's, over a smaller model of its shape), sized the same way."""
    names = SUBLAYERS[cfg.family]
    prefill, decode, embed_dev, head_dev = _placements(cfg, policy)
    if policy == "split" and split_attention == "gpu":
        decode = {**decode, names[1]: "gpu", names[2]: "gpu"}
    if isinstance(permille, int):
        permille = {n: permille for n in names + ("lm_head",)}
    on_cpu = policy in ("cpu", "partial", "mixed", "crossed", "split")
    weights_tier = weights_tier or ("ddr" if policy in ("cpu", "mixed", "crossed", "split") else "hbm")
    kv_tier = kv_tier or ("ddr" if on_cpu else "hbm")
    host_embed = "ddr" if "cpu" in embed_dev or policy in ("mixed", "split") else "hbm"
    host_head = "ddr" if "cpu" in head_dev or policy in ("mixed", "split") else "hbm"
    groups = [LayerGroup("embed", "embed", 0, 1, "none", _units(("embed",), *embed_dev, host_embed))]
    offloaded = cfg.num_layers - resident_layers - cxl_layers
    if resident_layers:
        groups.append(LayerGroup("resident", "decoder", 0, resident_layers, "hbm", _units(names, "gpu", "gpu", "hbm")))
    if offloaded:
        groups.append(LayerGroup("offload", "decoder", resident_layers, offloaded, kv_tier,
                                 _units(names, prefill, decode, weights_tier, permille)))
    if cxl_layers:
        groups.append(LayerGroup("cxl", "decoder", cfg.num_layers - cxl_layers, cxl_layers, "cxl",
                                 _units(names, prefill, decode, "cxl", permille)))
    groups.append(LayerGroup("head", "head", 0, 1, "none", _units(("lm_head",), *head_dev, host_head, permille)))
    if experts is not None:
        groups = [with_experts(cfg, g, experts) if g.name in ("offload", "cxl") else g for g in groups]
    if layer_groups is not None:
        groups = list(layer_groups)

    # Closed-form sizes (bf16): weights per tier, KV per tier, one staging buffer = the most one layer streams.
    numels = _param_numels(cfg)
    tokens = prompt_len + gen_len - 1
    kv_one = batch * tokens * cfg.num_kv_heads * cfg.head_dim * 2  # K (or V) of one layer
    tier_bytes = {"hbm": 0, "ddr": 0, "cxl": 0}
    staging = 0
    for group in groups:
        streamed = 0
        for sub in group.sublayers:
            if sub.name == "experts" and cfg.num_experts:  # by expert: resident ones in HBM, up to two slots
                placed = expert_placement(sub, cfg.num_experts)
                one = numels["experts"] * 2 // cfg.num_experts
                tier_bytes["hbm"] += placed.hbm * one * group.layer_count
                if placed.hbm < cfg.num_experts:
                    tier_bytes[sub.weights] += (cfg.num_experts - placed.hbm) * one * group.layer_count
                streamed += min(EXPERT_SLOTS, max(placed.streamed(p, cfg.num_experts) for p in ("prefill", "decode"))) \
                    * one
            elif sub.weights != "none":
                tier_bytes[sub.weights] += numels[sub.name] * 2 * group.layer_count
                if sub.weights != "hbm" and {"gpu", "split"} & {sub.prefill, sub.decode} and sub.name != "embed":
                    streamed += numels[sub.name] * 2
            elif sub.decode == "gpu" and group.kv_cache in ("ddr", "cxl"):  # (an upper bound for split units)
                streamed += kv_one
        if group.kv_cache != "none":
            tier_bytes[group.kv_cache] += 2 * kv_one * group.layer_count
        staging = max(staging, streamed)
    staging = staging_bytes if staging_bytes is not None else staging
    tier_bytes["hbm"] += (prefetch_depth + 1) * staging
    slack = 1 << 20
    memory = memory or TierBytes(tier_bytes["hbm"] + slack, tier_bytes["ddr"] + slack, tier_bytes["cxl"])
    spec = PlanSpec(
        model=ModelSpec(cfg.name, cfg.family, cfg.sha256(), cfg.to_dict()),
        hardware=HardwareSpec("test-host", "0" * 64),
        workload=Workload(batch, prompt_len, gen_len, "latency"),
        budgets=Budgets(memory.hbm_bytes * 2, memory.ddr_bytes * 2, memory.cxl_bytes * 2),
        memory=memory,
        execution=Execution(prefetch_depth, staging, *(microbatch or (batch, prompt_len))),
        layer_groups=tuple(groups),
        serving=Serving(()),
    )
    times = tuple(SublayerTime(g.name, s.name, phase, getattr(s, phase), 1e-4 * (rank + 1), 1e-6, 0.0)
                  for rank, (g, s) in enumerate((g, s) for g in groups for s in g.sublayers)
                  for phase in ("prefill", "decode"))
    prefill_s = sum(t.compute_seconds for t in times if t.phase == "prefill")
    per_token = sum(t.compute_seconds for t in times if t.phase == "decode")
    total = prefill_s + per_token * gen_len
    status = PlanStatus(SolverReport("fixed", "fixed", total, 0.0),
                        Predicted(prefill_s, per_token * gen_len, per_token, total, batch * gen_len / total, times),
                        tuple(TierUsage(t, b, b * 2) for t, b in tier_bytes.items()), ServingStatus(()))
    name = f"{cfg.name}.test-host.b{batch}-p{prompt_len}-g{gen_len}"
    return OffloadPlan(API_VERSION, "OffloadPlan", Metadata(name, "0.1.0"), spec, status)



# A tokenizer trained here with the `tokenizers` library (no download), for the text tests.
TEXT = ["the cat sat on the mat", "a dog ran in the park", "the sun is warm today", "birds sing in the morning",
        "the plan says where each layer runs"]
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def train_tokenizer():
    """A byte-level BPE (vocabulary 300) trained on TEXT: '<pad>' 0, '<s>' 1 (starts every text), '</s>' 2."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(TEXT, trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>", "<s>", "</s>"],
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                      show_progress=False))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    wrapped.chat_template = CHAT_TEMPLATE
    return wrapped


def save_text_checkpoint(directory, seed: int = 0):
    """A random 2-layer Llama over `train_tokenizer()`, saved with the tokenizer files → (ModelConfig, HF model)."""
    import transformers

    tokenizer = train_tokenizer()
    config = transformers.LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=96,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=64, initializer_range=0.2, tie_word_embeddings=False,
                                      bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).eval()
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)
    return from_hf_config(json.loads((directory / "config.json").read_text()), name=directory.name), model


def hf_text_generate(model, tokenizer, prompts, new_tokens, eos=None, chat=False):
    """HF generate on the tokenizer's own left-padded batch → the decoded new text per prompt."""
    import transformers

    if chat:
        prompts = [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                                 add_generation_prompt=True) for p in prompts]
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=not chat)
    config = transformers.GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=eos,
                                           pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    with torch.no_grad():
        out = model.generate(**enc, generation_config=config)[:, enc["input_ids"].shape[1]:]
    return [tokenizer.decode(row, skip_special_tokens=True) for row in out], out
