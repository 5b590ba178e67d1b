"""bench/peers/flexgen_opt.py, the parts that need no GPU: flags, FlexGen's weight placement and memory arithmetic,
the --percent search's candidates, and that a failed search still prints its numbers.

FlexGen itself cannot run here (no CUDA): its placement rule is checked against hand-worked cases (the rule was
also compared with flexgen 0.1.8's own `init_weight_list` for every w_gpu/w_cpu split when this was written), and
the search's candidates against the estimates it claims to respect.
"""

import json

import pytest

import flexgen_opt as fg
import peer_common as pc

GIB = 2**30
OPT_30B = pc.opt_shapes("opt-30b")
OPT_1B = pc.opt_shapes("opt-1.3b")


def _numel(shape):
    out = 1
    for dim in shape:
        out *= dim
    return out


def test_weight_specs_are_flexgens_layer_lists():
    specs = fg.weight_specs(OPT_1B)
    h, v = 2048, 50272
    assert len(specs) == 2 * 24 + 2  # InputEmbed, (SelfAttention, MLP) × layers, OutputEmbed
    assert specs[0] == [(v, h), (2050, h)]
    assert specs[1] == [(h, h), (h,)] * 4 + [(h,), (h,)]
    assert specs[2] == [(4 * h, h), (4 * h,), (h, 4 * h), (h,), (h,), (h,)]
    assert specs[-1] == [(h,), (h,), (v, h)]
    # FlexGen holds the tied token embedding twice (input and output): one V·h more than the model's parameters.
    assert sum(_numel(s) for layer in specs for s in layer) == OPT_1B.params + v * h


def test_weight_homes_by_cumulative_midpoint():
    # MLP with h = 2: sizes 8, 8, 8, 2, 2, 2 (total 30); midpoints 4, 12, 20, 25, 27, 29 → 13.3, 40, 66.7, 83.3,
    # 90, 96.7 percent. Split [disk, cpu, gpu]: a weight goes to the first device whose cumulative share exceeds it.
    mlp = [(8, 2), (8,), (2, 8), (2,), (2,), (2,)]
    assert fg.weight_homes(mlp, 20, 80) == ["cpu", "cpu", "cpu", "gpu", "gpu", "gpu"]
    assert fg.weight_homes(mlp, 60, 40) == ["cpu", "gpu", "gpu", "gpu", "gpu", "gpu"]  # 40 is not < 40
    assert fg.weight_homes(mlp, 20, 30) == ["disk", "disk", "cpu", "gpu", "gpu", "gpu"]
    assert fg.weight_homes(mlp, 100, 0) == ["gpu"] * 6
    assert fg.weight_homes(mlp, 0, 100) == ["cpu"] * 6


def test_gpu_weight_bytes_at_the_ends_and_at_a_step():
    everything = sum(_numel(s) for layer in fg.weight_specs(OPT_30B) for s in layer) * 2
    assert fg.gpu_weight_bytes(OPT_30B, 100) == (everything, 0)
    resident, streamed = fg.gpu_weight_bytes(OPT_30B, 0)
    h, v = 7168, 50272
    attention, mlp = 4 * h * h + 6 * h, 8 * h * h + 7 * h
    assert resident == 0
    # The largest two consecutive layers: the last MLP and the output embedding (2h + V·h).
    assert streamed == 2 * max(attention + mlp, mlp + 2 * h + v * h)
    # At w_gpu = 25 a weight goes to the GPU when its midpoint is at or past 75% of its layer: per attention
    # out_proj (87.5%), its bias and the two norm vectors (≈ 100%), not v's bias (just under 75%); per MLP fc2's bias
    # and the two norm vectors, not fc2 (6h²/(8h² + 7h), just under 75%); the position table (98% of the input
    # embedding); nothing of the output embedding (its norm vectors come first, the matrix sits at 50%).
    resident, _ = fg.gpu_weight_bytes(OPT_30B, 25)
    assert resident == 2 * (48 * ((h * h + 3 * h) + 3 * h) + 2050 * h)


def test_estimate_uses_flexgens_cache_formula_and_adds_up():
    parts = fg.estimate_gpu_bytes(OPT_30B, 8, 1024, 32, 8, 25, 100, False)
    assert parts["kv_cache"] == 2 * 8 * 1056 * 48 * 7168 * 2  # OptConfig.cache_bytes(8, 1056)
    assert parts["total"] == sum(v for k, v in parts.items() if k != "total")
    on_cpu = fg.estimate_gpu_bytes(OPT_30B, 8, 1024, 32, 8, 25, 0, True)
    assert on_cpu["kv_cache"] == 0 and on_cpu["kv_buffers"] == 0  # attention on the CPU: no cache on the GPU
    streamed = fg.estimate_gpu_bytes(OPT_30B, 8, 1024, 32, 8, 25, 0, False)
    # attention on the GPU over a CPU cache: this layer's K/V copy, the next one prefetched, and the permuted copy
    assert streamed["kv_buffers"] == 3 * 2 * 8 * 1056 * 7168 * 2


def test_host_estimate_counts_pinned_cpu_weights_cache_workspace_and_relay_buffers():
    got = fg.estimate_host_bytes(OPT_30B, 64, 1024, 32, 8, 25, 0, True)
    # CPU-homed weights at w_gpu = 25 (see above), each pinned allocation rounded up to a power of two:
    # per layer q, k, v (h² · 2 B = 98 MiB → 128 MiB) and their biases (14 KiB → 16 KiB), fc1 and fc2
    # (4h² · 2 B = 392 MiB → 512 MiB) and fc1's bias (56 KiB → 64 KiB); the token table twice (687 MiB → 1 GiB)
    # and the output embedding's two norm vectors.
    weights = 48 * (3 * 2**27 + 3 * 2**14 + 2 * 2**29 + 2**16) + 2 * 2**30 + 2 * 2**14
    cache = 2 * 64 * 1056 * 48 * 7168 * 2
    workspace = 2 * 8 * 1056 * 7168 * 4
    assert got == weights + cache + workspace + 8 * GIB


def test_max_weight_percent_is_the_largest_that_fits():
    budget = 24 * GIB
    w_gpu = fg.max_weight_percent(OPT_30B, 1, 128, 32, 1, 100, False, budget)
    assert fg.estimate_gpu_bytes(OPT_30B, 1, 128, 32, 1, w_gpu, 100, False)["total"] <= budget
    assert all(fg.estimate_gpu_bytes(OPT_30B, 1, 128, 32, 1, w, 100, False)["total"] > budget
               for w in range(w_gpu + 1, 101))
    assert fg.max_weight_percent(OPT_30B, 1, 128, 32, 1, 100, False, 1e6) is None


@pytest.mark.parametrize("batch,prompt", [(1, 128), (8, 128), (64, 128), (8, 1024), (32, 1024)])
def test_search_candidates_fit_and_are_not_dominated(batch, prompt):
    budget = 24 * GIB
    candidates = fg.search_candidates(OPT_30B, batch, prompt, 32, budget, host_budget_bytes=108 * GIB)
    assert candidates
    for c in candidates:
        assert c.gpu_batch_size * c.num_gpu_batches == batch
        est = fg.estimate_gpu_bytes(OPT_30B, batch, prompt, 32, c.gpu_batch_size, c.percent[0], c.percent[2],
                                    c.cpu_cache_compute)
        assert est["total"] == c.estimated_gpu_bytes <= fg.ESTIMATE_MARGIN * budget
        assert c.percent[0] + c.percent[1] == 100 and c.percent[2] + c.percent[3] == 100
        assert fg.estimate_host_bytes(OPT_30B, batch, prompt, 32, c.gpu_batch_size, c.percent[0], c.percent[2],
                                      c.cpu_cache_compute, c.pin_weight) <= 108 * GIB
        # One more weight percent would not fit
        if c.percent[0] < 100:
            bigger = fg.estimate_gpu_bytes(OPT_30B, batch, prompt, 32, c.gpu_batch_size, c.percent[0] + 1,
                                           c.percent[2], c.cpu_cache_compute)
            assert bigger["total"] > fg.ESTIMATE_MARGIN * budget
    gpu_cache = {c.gpu_batch_size: c.percent[0] for c in candidates if c.percent[2] == 100}
    for c in candidates:
        if c.percent[2] == 0 and c.gpu_batch_size in gpu_cache:
            assert c.percent[0] > gpu_cache[c.gpu_batch_size]  # else keeping the cache on the GPU is never slower
    assert [c.percent[0] for c in candidates] == sorted((c.percent[0] for c in candidates), reverse=True)


def test_search_keeps_a_small_kv_cache_on_the_gpu_and_drops_what_the_host_cannot_hold():
    (only,) = fg.search_candidates(OPT_30B, 1, 128, 32, 24 * GIB, host_budget_bytes=108 * GIB)
    assert only.percent == (25, 75, 100, 0, 100, 0) and not only.cpu_cache_compute and only.pin_weight
    # Batch 64 × 1056 tokens: 93 GB of KV cache, too much for the GPU budget and, beside the weights, for the host.
    assert fg.search_candidates(OPT_30B, 64, 1024, 32, 24 * GIB, host_budget_bytes=108 * GIB) == []
    # Batch 32: 46.5 GB of KV in DDR beside 68 GiB of pinned (power-of-two) weights does not fit 112 GiB; the same
    # weights unpinned (55 GB) do.
    candidates = fg.search_candidates(OPT_30B, 32, 1024, 32, 24 * GIB, host_budget_bytes=112 * GIB)
    assert candidates and not any(c.pin_weight for c in candidates)
    for c in candidates:
        args = (OPT_30B, 32, 1024, 32, c.gpu_batch_size, c.percent[0], c.percent[2], c.cpu_cache_compute)
        assert fg.estimate_host_bytes(*args, pin_weight=True) > 112 * GIB >= fg.estimate_host_bytes(*args, False)


def test_shrink_candidate_sets_the_overshoot_aside():
    (first, *_) = fg.search_candidates(OPT_1B, 8, 128, 4, 2 * GIB)
    overshoot = 0.13 * GIB
    smaller = fg.shrink_candidate(OPT_1B, 8, 128, 4, 2 * GIB, first, overshoot)
    assert smaller.percent[0] < first.percent[0]
    assert smaller.percent[2:] == first.percent[2:] and smaller.gpu_batch_size == first.gpu_batch_size
    assert smaller.estimated_gpu_bytes <= fg.ESTIMATE_MARGIN * 2 * GIB - overshoot - 0.02 * 2 * GIB
    assert fg.shrink_candidate(OPT_1B, 8, 128, 4, 2 * GIB, first, 10 * GIB) is None


def test_projected_tokens_per_second():
    measured = {"prefill_ms": 100.0, "decode_ms_per_token": 20.0}
    # 8 sequences × 32 tokens over 100 ms + 31 × 20 ms
    assert fg.projected_tokens_per_second(measured, 8, 32) == pytest.approx(256 / 0.72)
    assert fg.projected_tokens_per_second({"prefill_ms": None}, 8, 32) is None


@pytest.mark.parametrize("flags,message", [
    ([], "--percent: required (or pass --search)"),
    (["--search", "--percent", "100", "0", "100", "0", "100", "0"], "must not be given with --search"),
    (["--percent", "60", "60", "100", "0", "100", "0"], "weights GPU + CPU must be at most 100"),
    (["--percent", "50", "40", "100", "0", "100", "0"], "no disk offload"),
    (["--percent", "100", "0", "100", "0", "50", "50"], "activations must sit wholly on one device"),
    (["--percent", "100", "0", "100", "0", "100", "0", "--batch", "8", "--gpu-batch-size", "3"],
     "--gpu-batch-size: 3 × --num-gpu-batches 2 must equal --batch 8"),
])
def test_bad_flags_are_one_line_exit_2(flags, message, capsys):
    with pytest.raises(SystemExit) as info:
        fg.main(["--model", "opt-1.3b", *flags])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_a_failed_search_still_prints_what_it_tried(tmp_path, capsys):
    out = tmp_path / "fg.json"
    code = fg.main(["--model", "opt-1.3b", "--batch", "8", "--gen-len", "4", "--gpu-budget-gib", "2", "--search",
                    "--max-candidates", "2", "--host-mem-gib", "64", "--json-out", str(out)])
    assert code == 1
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed == json.loads(out.read_text())
    assert printed["error"].startswith("RuntimeError: every FlexGen candidate failed")
    tried = printed["search"]["tried"]
    assert len(tried) == 2 and all(row["error"] for row in tried)  # no CUDA here: each candidate's own error
    assert printed["search"]["not_run"]


def test_a_lone_candidate_runs_the_whole_workload(capsys):
    # opt-1.3b at batch 1 fits a 4 GiB budget whole: one candidate, run once for all tokens (here it fails: no GPU)
    assert fg.main(["--model", "opt-1.3b", "--gen-len", "4", "--gpu-budget-gib", "4", "--search",
                    "--host-mem-gib", "64"]) == 1
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["error"].startswith("RuntimeError: the only candidate failed")
    (row,) = printed["search"]["tried"]
    assert row["gen_len"] == 4 and row["candidate"]["percent"] == [100, 0, 100, 0, 100, 0]
