"""Peer: HF Accelerate offload (`device_map` from `max_memory`) running an OPT model with random bf16 weights.

    python3 bench/peers/accelerate_opt.py --model opt-30b --batch 1 --prompt-len 128 --gen-len 4 \
        --gpu-budget-gib 24 [--pinned] --json-out acc.json

What it does, as a user of Accelerate would:
  1. builds `OPTForCausalLM` on the meta device (`init_empty_weights`), in bf16;
  2. `infer_auto_device_map(model, max_memory={0: budget, 'cpu': ...}, no_split_module_classes=['OPTDecoderLayer'])`;
  3. materialises random weights where the map puts them (GPU tensors drawn there; CPU tensors filled from one
     random chunk, copied block by block, since HF's initialisers take minutes at this size), pinned with `--pinned`;
  4. `dispatch_model`: CPU-mapped layers are offloaded, their weights copied to the GPU at every forward;
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

from peer_common import GIB, PeerResult, base_parser, gpu_peak_bytes, opt_shapes, positive_float, \
    random_token_ids, reset_gpu_peak  # noqa: E402

__all__ = ["build_parser", "hf_opt_config", "device_for", "plan_device_map", "materialise", "probe_h2d",
           "generate_timed", "main"]

NO_SPLIT = ["OPTDecoderLayer"]
_CHUNK_ELEMENTS = 1 << 24  # 32 MiB of bf16: the random block CPU tensors are filled from


def build_parser():
    parser = base_parser("accelerate_opt.py", "HF Accelerate offload baseline (random bf16 OPT weights).",
                         gen_len_default=4)
    parser.add_argument("--pinned", action="store_true",
                        help="pin the CPU-offloaded weights (page-locked: faster host-to-device copies)")
    parser.add_argument("--cpu-mem-gib", type=positive_float, default=400.0,
                        help="max_memory for 'cpu' in GiB (default 400: as much as the host has)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="'cpu': no CUDA, the whole model on the CPU (tests only)")
    return parser


def hf_opt_config(shapes):
    """The HF `OPTConfig` of liac's OPT shapes (pre-norm, biases, tied embedding, ReLU)."""
    from transformers import OPTConfig

    return OPTConfig(vocab_size=shapes.vocab_size, hidden_size=shapes.hidden_size,
                     num_hidden_layers=shapes.num_layers, ffn_dim=shapes.ffn_dim,
                     num_attention_heads=shapes.num_heads, max_position_embeddings=shapes.max_position,
                     word_embed_proj_dim=shapes.hidden_size, do_layer_norm_before=True, enable_bias=True,
                     activation_function="relu", tie_word_embeddings=True, pad_token_id=1, bos_token_id=2,
                     eos_token_id=2, dropout=0.0, attention_dropout=0.0, use_cache=True)


def _meta_model(shapes):
    import torch
    from accelerate import init_empty_weights
    from transformers import OPTForCausalLM

    with init_empty_weights():
        model = OPTForCausalLM(hf_opt_config(shapes))
    model.tie_weights()  # built untied under init_empty_weights: tie now, so the map and the fill see one tensor
    model.to(torch.bfloat16)
    model.eval()
    return model


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
                                 no_split_module_classes=NO_SPLIT, dtype=torch.bfloat16)


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

        shapes = opt_shapes(args.model)
        result["model"] = shapes.name
        if args.device == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("CUDA is not available: run on the GPU machine, or pass '--device cpu' (tests)")
        budget = int(args.gpu_budget_gib * GIB)
        result["settings"] = {"device_map": "infer_auto_device_map", "max_memory_gpu_bytes": budget,
                              "max_memory_cpu_bytes": int(args.cpu_mem_gib * GIB), "no_split_module_classes": NO_SPLIT,
                              "cpu_weights": "pinned" if args.pinned else "pageable (Accelerate's default)",
                              "dtype": "bfloat16", "attn_implementation": None, "decoding": "greedy, KV cache",
                              "transformers": __import__("transformers").__version__,
                              "accelerate": __import__("accelerate").__version__, "torch": torch.__version__}
        result["notes"].append("Accelerate's max_memory bounds the weights placed on the GPU only: the KV cache, "
                               "activations and offloaded layers being copied in add to the peak reported here")
        start = time.perf_counter()
        model = _meta_model(shapes)
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
        ids = torch.tensor(random_token_ids(args.batch, args.prompt_len, shapes.vocab_size, args.seed),
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
