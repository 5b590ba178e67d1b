"""Our reference models against HF transformers in fp32: same weights → same logits, full and incremental.

Tiny configs built in code (no download); HF weights are randomised, saved as a checkpoint (the layout `hf_weight_names`
reads: Mixtral's experts one tensor each, as on the Hub), copied into our layout with each family's
`hf_weight_names` (q/k/v, gate/up and stacked experts concatenated), and both models run on the same token ids.
"""

import tempfile

import pytest
import torch
from safetensors.torch import load_file

from liac.models import build_model, family_module, from_hf_config
from liac.models.layers import KVCache

transformers = pytest.importorskip("transformers")

TOL = dict(rtol=1e-5, atol=1e-5)


def _cases():
    t = transformers
    return {
        "opt": (t.OPTConfig(hidden_size=64, ffn_dim=256, num_hidden_layers=2, num_attention_heads=4,
                            vocab_size=128, max_position_embeddings=64, word_embed_proj_dim=64),
                t.OPTForCausalLM),
        # GQA (8 query heads, 2 KV heads) and Llama 3.1's long-context RoPE rescaling, with a short original
        # context so that all three frequency bands (kept, interpolated, scaled) occur.
        "llama": (t.LlamaConfig(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=8,
                                num_key_value_heads=2, vocab_size=128, max_position_embeddings=64,
                                rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                                 "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                 "original_max_position_embeddings": 16}),
                  t.LlamaForCausalLM),
        "qwen2": (t.Qwen2Config(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=8,
                                num_key_value_heads=2, vocab_size=128, max_position_embeddings=64),
                  t.Qwen2ForCausalLM),
        "mixtral": (t.MixtralConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=2, vocab_size=128, num_local_experts=4,
                                    num_experts_per_tok=2, max_position_embeddings=64),
                    t.MixtralForCausalLM),
    }


def _pair(family: str):
    """(HF model, our model) with the same random weights, fp32, eval mode."""
    hf_config, hf_class = _cases()[family]
    torch.manual_seed(0)
    hf = hf_class(hf_config).eval()
    with torch.no_grad():
        for param in hf.parameters():
            param.normal_(0.0, 0.3)  # large enough that a wrong sign, order or scale shows in the logits
    cfg = from_hf_config(hf_config.to_dict(), name=f"tiny-{family}")
    ours = build_model(cfg).eval()
    with tempfile.TemporaryDirectory() as directory:  # the checkpoint layout (transformers 5 converts on save)
        hf.save_pretrained(directory, safe_serialization=True)
        state = load_file(f"{directory}/model.safetensors")
    shapes = {name: tuple(p.shape) for name, p in ours.named_parameters()}
    mapped = {mine: torch.cat([state[name] for name in theirs], dim=0).reshape(shapes[mine])
              for mine, theirs in family_module(family).hf_weight_names(cfg).items()}
    missing, unexpected = ours.load_state_dict(mapped, strict=False)
    tied = {"lm_head.proj.weight"} if cfg.tie_embeddings else set()
    assert set(missing) == tied and not unexpected, (missing, unexpected)
    return hf, ours, cfg


@pytest.mark.parametrize("family", ["opt", "llama", "qwen2", "mixtral"])
def test_logits_match_hf_full_and_incremental(family):
    hf, ours, cfg = _pair(family)
    ids = torch.randint(0, cfg.vocab_size, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        reference = hf(ids).logits
        full = ours(ids)
        cache = KVCache(cfg.num_layers)
        steps = [ours(ids[:, :5], cache), ours(ids[:, 5:6], cache), ours(ids[:, 6:7], cache)]
    assert reference.abs().max() > 0.5  # the comparison is not between two near-zero tensors
    torch.testing.assert_close(full, reference, **TOL)
    torch.testing.assert_close(torch.cat(steps, dim=1), reference, **TOL)
    assert cache.length == 7


@pytest.mark.parametrize("family", ["opt", "llama"])
def test_split_attention_equals_fused(family):
    """`Attention.score` then `.context` (a plan putting them on two devices) equals the fused forward."""
    _, ours, cfg = _pair(family)
    layer = ours.layers[0]
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(2, 3, cfg.hidden_size, generator=generator)
    positions = torch.arange(4, 7).expand(2, 3)
    k_past = torch.randn(2, cfg.num_kv_heads, 4, cfg.head_dim, generator=generator)
    v_past = torch.randn(2, cfg.num_kv_heads, 4, cfg.head_dim, generator=generator)
    with torch.no_grad():
        q, k, v = layer.qkv(x, positions)
        k_all, v_all = torch.cat([k_past, k], dim=2), torch.cat([v_past, v], dim=2)
        fused = layer.attn(q, k_all, v_all)
        split = layer.attn.context(layer.attn.score(q, k_all), v_all)
        decode = layer.attn.context(layer.attn.score(q[:, :, -1:], k_all), v_all)  # Q = 1: no mask
    torch.testing.assert_close(split, fused, **TOL)
    torch.testing.assert_close(decode, fused[:, -1:], **TOL)


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16))
@pytest.mark.parametrize("family", ("llama", "mixtral"))
def test_qkv_with_the_pass_rope_tables_equals_its_own(family, dtype):
    """`QKV.forward` with `rope` (the pass's cos/sin tables, made once for every layer by the runtime; q and k rotated
    as one tensor) gives the values it computes from the positions itself, bit for bit, in fp32 and bf16."""
    from liac.models.layers import rope_tables

    _, ours, cfg = _pair(family)
    qkv = ours.layers[1].qkv
    inv_freq = qkv.inv_freq.clone()
    qkv.to(dtype).inv_freq = inv_freq  # as the runtime binds it (fp32: rope_inv_freq)
    x = torch.randn(2, 3, cfg.hidden_size, generator=torch.Generator().manual_seed(4)).to(dtype)
    positions = torch.tensor([[0, 1, 2], [5, 6, 7]])
    with torch.no_grad():
        own = qkv(x, positions)
        shared = qkv(x, positions, rope_tables(positions, ours.layers[0].qkv.inv_freq, dtype))  # layer 0's
    for a, b in zip(own, shared):
        assert a.shape == b.shape and torch.equal(a, b)
