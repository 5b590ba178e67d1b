"""The KV cache's fast paths: the row layout of a strided cache write (one cudaMemcpy2DAsync), and CPU attention
over a cache's whole capacity, checked against the plain computation on the exact context."""

from types import SimpleNamespace

import pytest
import torch

from liac.models.layers import Attention
from liac.runtime.backend import _row_layout


def test_row_layout_of_cache_writes():
    cache = torch.zeros(4, 8, 20, 16)  # [B, G, C, E]
    assert _row_layout(cache[:3, :, 5:9]) == (24, 64, 320)     # a prefill write: B·G runs of Q·E, pitch C·E
    assert _row_layout(cache[:3, :, 5:6]) == (24, 16, 320)     # a decode write
    assert _row_layout(cache) == (1, cache.numel(), cache.numel())
    assert _row_layout(cache[:, :4]) == (4, 4 * 20 * 16, 8 * 20 * 16)
    assert _row_layout(cache.transpose(1, 2)[:, 2:5]) is None  # no single pitch: torch's copy instead
    marker = torch.arange(cache.numel(), dtype=torch.float64)
    for view in (cache[:3, :, 5:9], cache[:, :4], cache[1:2, 3:5, :7]):  # the layout addresses exactly the view
        count, length, pitch = _row_layout(view)
        offset = view.storage_offset()
        addressed = torch.cat([marker[offset + r * pitch: offset + r * pitch + length] for r in range(count)])
        assert torch.equal(addressed, marker.as_strided(view.shape, view.stride(), offset).reshape(-1))


@pytest.mark.parametrize("heads,kv_heads,q_len", [(4, 4, 1), (8, 2, 1), (4, 4, 3)])
def test_attention_over_cache_capacity_matches_exact_context(heads, kv_heads, q_len):
    attention = Attention(SimpleNamespace(uses_rope=True, head_dim=8, num_heads=heads, num_kv_heads=kv_heads))
    generator = torch.Generator().manual_seed(0)
    batch, capacity, context = 2, 12, 7
    k = torch.zeros(batch, kv_heads, capacity, 8)
    v = torch.zeros_like(k)
    k[:, :, :context] = torch.randn(batch, kv_heads, context, 8, generator=generator)
    v[:, :, :context] = torch.randn(batch, kv_heads, context, 8, generator=generator)
    k[:, :, context:] = 1e4  # stale keys past the context must not count (zeros for V: the runtime zeroes caches)
    q = torch.randn(batch, heads, q_len, 8, generator=generator)
    exact_p = attention.score(q, k[:, :, :context])
    p = attention.score(q, k, context)
    torch.testing.assert_close(p, exact_p)
    torch.testing.assert_close(attention.context(p, v), attention.context(exact_p, v[:, :, :context]))
    torch.testing.assert_close(attention.context(p, v), attention(q, k[:, :, :context], v[:, :, :context]),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (8, 2)])
def test_prompt_attention_masks_by_the_kernel_and_writes_into_a_given_buffer(heads, kv_heads, monkeypatch):
    # A whole prompt (Q = C) is causal by the kernel's own masking (no [Q, C] mask: the CPU kernel then skips the
    # blocks above the diagonal, 1.4-1.8x faster); a chunk after the first (C > Q) keeps the mask's offset
    # diagonal. Both equal the explicit masked computation; `out` receives the output as returned.
    import liac.models.layers as layers

    attention = Attention(SimpleNamespace(uses_rope=True, head_dim=8, num_heads=heads, num_kv_heads=kv_heads))
    generator = torch.Generator().manual_seed(1)
    q = torch.randn(2, heads, 6, 8, generator=generator)
    k, v = (torch.randn(2, kv_heads, 6, 8, generator=generator) for _ in range(2))
    calls, sdpa = [], torch.nn.functional.scaled_dot_product_attention

    def recording(*args, **kwargs):
        calls.append((kwargs.get("is_causal", False), kwargs.get("attn_mask")))
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(layers.F, "scaled_dot_product_attention", recording)
    explicit = attention.context(attention.score(q, k), v)  # q·Kᵀ, the boolean causal mask, softmax, p·V
    out = torch.empty(2, 6, heads * 8)
    whole = attention(q, k, v, out=out)
    assert whole is out and calls[-1] == (True, None)
    torch.testing.assert_close(whole, explicit, atol=1e-5, rtol=1e-5)
    chunk = attention(q[:, :, 4:], k, v)  # the last 2 queries of the prompt against all 6 keys
    assert calls[-1][0] is False and calls[-1][1].shape == (2, 6)
    torch.testing.assert_close(chunk, explicit[:, 4:], atol=1e-5, rtol=1e-5)
