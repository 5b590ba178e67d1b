"""Peer: HF Accelerate offload (`device_map` from `max_memory`) running a causal LM with random bf16 weights.

    python3 bench/peers/accelerate_opt.py --model opt-30b --batch 1 --prompt-len 128 --gen-len 4 \
        --gpu-budget-gib 24 [--pinned] --json-out acc.json
    python3 bench/peers/accelerate_opt.py --model mixtral-8x7b --layers 16 --gpu-budget-gib 12 --pinned ...

Any model liac reads (a zoo name or an HF config.json of family opt, llama, qwen2 or mixtral; `--layers N` keeps its
first N decoder layers) is built as the HF class of its family (`hf_config`: liac's config in HF's field names; the
file keeps the name it had when it drove OPT only). What it does, as a user of Accelerate would:
  1. builds `AutoModelForCausalLM.from_config(...)` on the meta device (`init_empty_weights`), in bf16;
  2. `infer_auto_device_map(model, max_memory={0: budget, 'cpu': ...}, no_split_module_classes=<the model's
     decoder layer class>)`;
  3. materialises random weights where the map puts them (GPU tensors drawn there; CPU tensors filled from one
     random chunk, copied block by block, since HF's initialisers take minutes at this size), pinned with `--pinned`;
  4. `dispatch_model`: CPU-mapped layers are offloaded, their weights copied to the GPU at every forward (for an MoE
     layer: all of its experts, routed or not: Accelerate moves modules, not the rows a step reads);
  5. greedy generation with a KV cache, by hand: one timed prefill forward, then `gen_len - 1` timed decode steps,
     each between two `torch.cuda.synchronize()`.

Accelerate's `max_memory` covers weights only: the KV cache, activations and the copied-in offloaded layers come on
top, so the peak can exceed the budget. The result reports the real peak (allocated and reserved) and says so.
Default (pageable) CPU weights cross PCIe at a few GB/s, so the default `--gen-len` is small (4): numbers are per
token. `--device cpu` runs the same code path without CUDA (everything on the CPU), for tests.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # peer_common beside this script

from peer_common import GIB, PeerResult, base_parser, gpu_peak_bytes, positive_float, positive_int, \
    random_token_ids, reset_gpu_peak  # noqa: E402

__all__ = ["build_parser", "model_config", "hf_config", "device_for", "plan_device_map", "materialise", "probe_h2d",
           "generate_timed", "main"]

_CHUNK_ELEMENTS = 1 << 24  # 32 MiB of bf16: the random block CPU tensors are filled from


def build_parser():
    parser = base_parser("accelerate_opt.py", "HF Accelerate offload baseline (random bf16 weights).",
                         gen_len_default=4)
    parser.add_argument("--layers", type=positive_int, default=None,
                        help="keep the model's first N decoder layers (default: all)")
    parser.add_argument("--pinned", action="store_true",
                        help="pin the CPU-offloaded weights (page-locked: faster host-to-device copies)")
    parser.add_argument("--cpu-mem-gib", type=positive_float, default=400.0,
                        help="max_memory for 'cpu' in GiB (default 400: as much as the host has)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="'cpu': no CUDA, the whole model on the CPU (tests only)")
    return parser


def model_config(model: str, layers: int | None = None):
    """liac's ModelConfig of `--model` (a zoo name or an HF config.json), cut to `layers` decoder layers.

    Raises:
        ValueError: a model liac does not read (one line naming what is wrong)."""
    from liac.errors import LiacError
    from liac.models import resolve_model

    try:
        cfg = resolve_model(model)
    except LiacError as e:
        raise ValueError(f"--model: {e.line()}") from None
    if layers is not None and layers != cfg.num_layers:
        if layers > cfg.num_layers:
            raise ValueError(f"--layers: '{cfg.name}' has {cfg.num_layers} decoder layers, got {layers}")
        cfg = cfg.with_layers(layers)
    return cfg


def hf_config(cfg):
    """The HF config of liac's ModelConfig `cfg` (HF's field names; `liac.models.config.from_hf_config` reads it back
    to `cfg`)."""
    from transformers import AutoConfig

    common = dict(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
                  num_attention_heads=cfg.num_heads, max_position_embeddings=cfg.max_position,
                  tie_word_embeddings=cfg.tie_embeddings, use_cache=True)
    if cfg.family == "opt":  # pre-norm, biases, ReLU, no projected embedding (what liac models)
        return AutoConfig.for_model("opt", ffn_dim=cfg.ffn_dim, word_embed_proj_dim=cfg.hidden_size,
                                    do_layer_norm_before=True, enable_bias=cfg.qkv_bias, activation_function="relu",
                                    pad_token_id=1, bos_token_id=2, eos_token_id=2, dropout=0.0,
                                    attention_dropout=0.0, **common)
    common.update(intermediate_size=cfg.ffn_dim, num_key_value_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                  rms_norm_eps=cfg.norm_eps, rope_theta=cfg.rope_theta, hidden_act="silu")
    if cfg.rope_type == "llama3":
        common["rope_scaling"] = {"rope_type": "llama3", "factor": cfg.rope_factor,
                                  "low_freq_factor": cfg.rope_low_freq_factor,
                                  "high_freq_factor": cfg.rope_high_freq_factor,
                                  "original_max_position_embeddings": cfg.rope_original_max_position}
    elif cfg.rope_type != "default":
        raise ValueError(f"--model: rope_type '{cfg.rope_type}' is not built by this driver (default, llama3)")
    if cfg.family == "llama":
        return AutoConfig.for_model("llama", attention_bias=cfg.qkv_bias, mlp_bias=cfg.proj_bias, **common)
    if cfg.family == "qwen2":
        return AutoConfig.for_model("qwen2", use_sliding_window=False, **common)
    if cfg.family == "mixtral":
        return AutoConfig.for_model("mixtral", num_local_experts=cfg.num_experts,
                                    num_experts_per_tok=cfg.experts_top_k, sliding_window=None, **common)
    raise ValueError(f"--model: family '{cfg.family}' is not built by this driver")


def _meta_model(cfg):
    import torch
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(hf_config(cfg))
    model.tie_weights()  # built untied under init_empty_weights: tie now, so the map and the fill see one tensor
    model.to(torch.bfloat16)
    model.eval()
    return model


def no_split_modules(model) -> list[str]:
    """The module classes Accelerate must not split across devices: the model's own list (its decoder layer)."""
    return sorted(getattr(model, "_no_split_modules", None) or [])


def device_for(name: str, device_map: dict):
    """The device of tensor `name` under `device_map` (its longest matching module prefix; '' matches all)."""
    best, device = -1, None
    for prefix, target in device_map.items():
        if prefix == "" or name == prefix or name.startswith(prefix + "."):
            if len(prefix) > best:
                best, device = len(prefix), target
    if device is None:
        raise KeyError(f"no device for '{name}' in the device map")
    return device


def plan_device_map(model, gpu_budget_bytes: int, cpu_bytes: int) -> dict:
    """Accelerate's own placement for the budget (weights only: see the module docstring)."""
    import torch
    from accelerate import infer_auto_device_map

    return infer_auto_device_map(model, max_memory={0: gpu_budget_bytes, "cpu": cpu_bytes},
                                 no_split_module_classes=no_split_modules(model), dtype=torch.bfloat16)


def _fill_random(tensor, block) -> None:
    """Fill with N(0, 0.02²) values: on the GPU drawn in place; on the CPU copied from `block` over and over."""
    if tensor.device.type != "cpu":
        tensor.normal_(0.0, 0.02)
        return
    flat = tensor.view(-1)
    for start in range(0, flat.numel(), block.numel()):
        stop = min(start + block.numel(), flat.numel())
        flat[start:stop].copy_(block[:stop - start])


def materialise(model, device_map: dict, pinned: bool, seed: int) -> dict:
    """Replace every meta parameter by random bf16 data on its mapped device; returns bytes per device.

    Tied parameters (OPT's LM head is the token embedding) are one tensor: filled once, re-tied after.
    """
    import torch

    torch.manual_seed(seed)  # the GPU tensors' draws (CUDA generators too)
    block = (torch.randn(_CHUNK_ELEMENTS, generator=torch.Generator().manual_seed(seed)) * 0.02).to(torch.bfloat16)
    placed: dict[str, int] = {}
    for name, param in list(model.named_parameters(remove_duplicate=True)):
        device = device_for(name, device_map)
        target = "cpu" if device in ("cpu", "disk") else (f"cuda:{device}" if isinstance(device, int) else device)
        data = torch.empty(param.shape, dtype=torch.bfloat16, device=target,
                           pin_memory=pinned and target == "cpu")
        _fill_random(data, block)
        module_name, _, leaf = name.rpartition(".")
        module = model.get_submodule(module_name) if module_name else model
        module._parameters[leaf] = torch.nn.Parameter(data, requires_grad=False)
        placed[str(device)] = placed.get(str(device), 0) + data.numel() * data.element_size()
    for name, buffer in list(model.named_buffers()):
        if buffer.device.type == "meta":
            raise ValueError(f"buffer '{name}' is on the meta device: this driver only fills parameters")
    model.tie_weights()
    return placed


def probe_h2d(model, device_map: dict) -> dict | None:
    """Copy the largest CPU-offloaded weight to the GPU three times: the rate this run's offload path can reach,
    and whether that weight is pinned (a check that --pinned took effect). None when nothing is offloaded."""
    import torch

    offloaded = [(p.numel() * p.element_size(), name, p) for name, p in model.named_parameters()
                 if device_for(name, device_map) in ("cpu", "disk") and p.device.type == "cpu"]
    if not offloaded:
        return None
    nbytes, name, param = max(offloaded, key=lambda item: item[:2])
    seconds = []
    for _ in range(3):
        torch.cuda.synchronize()
        start = time.perf_counter()
        param.data.to("cuda:0")
        torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    return {"weight": name, "bytes": nbytes, "pinned": bool(param.data.is_pinned()),
            "best_gb_per_s": round(nbytes / min(seconds) / 1e9, 2)}


def generate_timed(model, input_ids, new_tokens: int, sync):
    """Greedy decoding with a KV cache: (prefill seconds, [seconds of each decode step], token ids [B, new_tokens]).

    Like `model.generate`, it asks for the last position's logits only (`logits_to_keep=1`) where the model takes it.
    """
    import inspect

    import torch

    forward = getattr(model, "_old_forward", model.forward)  # Accelerate's hook wraps forward
    keep = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(forward).parameters else {}
    with torch.inference_mode():
        sync()
        start = time.perf_counter()
        out = model(input_ids=input_ids, use_cache=True, **keep)
        token = out.logits[:, -1, :].argmax(dim=-1, keepdim=True)
        sync()
        prefill = time.perf_counter() - start
        past = out.past_key_values
        steps, tokens = [], [token]
        for _ in range(new_tokens - 1):
            start = time.perf_counter()
            out = model(input_ids=token, past_key_values=past, use_cache=True, **keep)
            token = out.logits[:, -1, :].argmax(dim=-1, keepdim=True)
            past = out.past_key_values
            sync()
            steps.append(time.perf_counter() - start)
            tokens.append(token)
    return prefill, steps, torch.cat(tokens, dim=1)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result = PeerResult.start("accelerate-pinned" if args.pinned else "accelerate", args)
    with result.guard():
        import torch

        cfg = model_config(args.model, args.layers)
        result["model"] = cfg.name
        if args.device == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("CUDA is not available: run on the GPU machine, or pass '--device cpu' (tests)")
        budget = int(args.gpu_budget_gib * GIB)
        result["settings"] = {"device_map": "infer_auto_device_map", "max_memory_gpu_bytes": budget,
                              "max_memory_cpu_bytes": int(args.cpu_mem_gib * GIB), "no_split_module_classes": None,
                              "cpu_weights": "pinned" if args.pinned else "pageable (Accelerate's default)",
                              "dtype": "bfloat16", "attn_implementation": None, "decoding": "greedy, KV cache",
                              "transformers": __import__("transformers").__version__,
                              "accelerate": __import__("accelerate").__version__, "torch": torch.__version__}
        result["notes"].append("Accelerate's max_memory bounds the weights placed on the GPU only: the KV cache, "
                               "activations and offloaded layers being copied in add to the peak reported here")
        start = time.perf_counter()
        model = _meta_model(cfg)
        result["settings"]["no_split_module_classes"] = no_split_modules(model)
        result["settings"]["attn_implementation"] = getattr(model.config, "_attn_implementation", None)
        if args.device == "cuda":
            device_map = plan_device_map(model, budget, int(args.cpu_mem_gib * GIB))
        else:
            device_map = {"": "cpu"}
        placed = materialise(model, device_map, args.pinned and args.device == "cuda", args.seed)
        if args.device == "cuda":
            result["settings"]["h2d_probe"] = probe_h2d(model, device_map)
            reset_gpu_peak()  # the peak starts from what is allocated now: the GPU weights count, the probe not
            from accelerate import dispatch_model

            model = dispatch_model(model, device_map=device_map, main_device=0)
        result["load_seconds"] = round(time.perf_counter() - start, 3)
        result["settings"]["weight_bytes_by_device"] = placed
        result["settings"]["layers_on_gpu"] = sum(1 for k, v in device_map.items()
                                                  if ".layers." in f".{k}." and v not in ("cpu", "disk"))
        result["settings"]["layers_offloaded"] = sum(1 for k, v in device_map.items()
                                                     if ".layers." in f".{k}." and v in ("cpu", "disk"))
        device = "cuda:0" if args.device == "cuda" else "cpu"
        sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
        ids = torch.tensor(random_token_ids(args.batch, args.prompt_len, cfg.vocab_size, args.seed),
                           dtype=torch.long, device=device)
        warm = ids[:, : min(8, args.prompt_len)]
        generate_timed(model, warm, 2, sync)  # CUDA/cuBLAS start-up, hooks' first call: not timed
        try:
            prefill, steps, _ = generate_timed(model, ids, args.gen_len, sync)
            result.set_times(prefill, steps)
        finally:
            if args.device == "cuda":
                result.set_memory(gpu_peak_bytes())
    return result.finish()


if __name__ == "__main__":
    sys.exit(main())
