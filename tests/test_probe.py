"""`liac profile`: measures this host and writes a profile that loads and that `liac compile` accepts."""

from __future__ import annotations

import pytest

from liac.cli import main
from liac.profile import load_profile, resolve_profile


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    out = tmp_path_factory.mktemp("profile") / "host.yaml"
    assert main(["profile", "--quick", "--no-gpu", "-o", str(out)]) == 0
    return out


def test_profile_loads_and_records_what_was_measured(measured):
    profile = load_profile(measured)
    base = resolve_profile("h200-amx16")
    assert profile.name == "host"
    # measured on this host: the CPU numbers carry 'liac profile' as their source and are not estimates
    for field in ("cpu_amx_bf16_tflops", "cpu_ddr_read_gb_per_s", "cpu_kv_read_gb_per_s", "split_sync_seconds"):
        assert profile.sources[field].startswith("liac profile"), field
        assert field not in profile.estimates
    # a thread hand-off and join: microseconds, not zero, not milliseconds
    assert 1e-7 < profile.split_sync_seconds < 5e-3
    assert [p.m for p in profile.cpu_amx_bf16_tflops] == [1, 16, 32, 64, 128, 256, 1024]
    assert all(p.tflops > 0 for p in profile.cpu_amx_bf16_tflops)
    # not measured without a GPU: taken from the base profile, and flagged as estimates
    assert profile.pcie_h2d_gb_per_s == base.pcie_h2d_gb_per_s
    assert "pcie_h2d_gb_per_s" in profile.estimates
    assert "from base profile 'h200-amx16'" in profile.sources["pcie_h2d_gb_per_s"]


def test_measured_profile_compiles(measured, tmp_path):
    out = tmp_path / "plan.yaml"
    assert main(["compile", "--model", "opt-1.3b", "--hw", str(measured), "--batch", "1", "-o", str(out)]) == 0
    assert out.read_text().count("profile: host") == 1
    # measured without a GPU, the profile has no GPU memory: a GPU budget is more than this machine has
    assert main(["compile", "--model", "opt-1.3b", "--hw", str(measured), "--batch", "1", "--gpu-mem", "1GiB",
                 "-o", str(out)]) == 2


def test_the_gemv_rate_can_be_measured_on_a_kernels_own_shapes(monkeypatch):
    """`ProbeSizes.gemv_shapes`: the CPU read rate comes from F.linear / torch.mv over matrices of those shapes (an
    MoE expert's [2F, D] and [D, F], in turn, rotated to `rotate_bytes`), not the default square-ish GEMV."""
    import dataclasses

    from liac import probe

    seen = []

    def rate(weights, kernel, repeats):
        seen.append((kernel, [tuple(w.shape) for w in weights]))
        return 7.0 if kernel == "F.linear" else 5.0

    monkeypatch.setattr(probe, "_gemv_rate", rate)
    monkeypatch.setattr(probe, "_kv_read_rate", lambda total, repeats: 1.0)
    sizes = dataclasses.replace(probe.ProbeSizes.quick(), rotate_bytes=3 * 2 * (96 * 32 + 32 * 48),
                                gemv_shapes=((96, 32), (32, 48)))
    rates = probe.measure_rates(sizes, use_gpu=False)
    assert rates["cpu_ddr_read_gb_per_s"] == 7.0  # the faster kernel's
    assert seen == [(kernel, [(96, 32), (32, 48)] * 3) for kernel in ("F.linear", "torch.mv")]


def test_the_gemv_rate_reads_each_shape_with_its_own_input():
    """Matrices of different widths in one rotation each get an input of their width (the real `_gemv_rate`)."""
    import torch

    from liac import probe

    weights = [torch.zeros(8, 4, dtype=torch.bfloat16), torch.zeros(4, 6, dtype=torch.bfloat16)]
    for kernel in ("F.linear", "torch.mv"):
        assert probe._gemv_rate(weights, kernel, 1) > 0


def test_expert_rates_time_the_expert_kernel_back_to_back_and_after_idle(monkeypatch):
    """`expert_rates` on the CPU (no copy beside it without CUDA): the expert kernel's rate back to back, after an
    idle pause before each expert (each of the rotated experts, in the warm-up round and every timed round), and
    after the pause with the team woken, all positive; the pauses are outside the timed expert (here they record
    instead of sleeping)."""
    import liac.probe as probe

    pauses = []
    monkeypatch.setattr(probe.time, "sleep", pauses.append)
    rates = probe.expert_rates(64, 128, 1, repeats=2, use_gpu=False, idle_seconds=0.05)
    assert set(rates) == {"cpu_expert_gb_per_s", "cpu_expert_after_idle_gb_per_s",
                          "cpu_expert_after_idle_woken_gb_per_s"}
    assert all(v > 0 for v in rates.values())
    # 3 experts (the least rotated), a warm-up round and 2 timed ones: idle, then idle with the team woken and the
    # routing read's pause after the wake
    assert pauses == [0.05] * 9 + [0.05, probe.EXPERT_ROUTE_SECONDS] * 9


def test_experts_beside_copies_rate_is_both_sides_bytes_over_the_span(monkeypatch):
    """`experts_beside_copies_rate` (ddr_shared_experts_gb_per_s, Eq. 21b's DDR term) runs a split experts unit as
    the runtime does: after the pause, the 4 copies are launched (two slots in turn) before the 3 CPU experts, then
    both are waited for; the rate is 7 experts' bytes over the mean span of a group (a fake clock: 10 s a group
    in the warm-up round, 2 s after), the warm-up round left out, no expert twice in a group."""
    import liac.probe as probe

    clock, log = [0.0], []
    monkeypatch.setattr(probe.time, "perf_counter", lambda: clock[0])

    def wait():
        log.append("wait")
        clock[0] += 10.0 if len([e for e in log if e == "wait"]) <= 3 else 2.0  # 3 groups of 9 experts a round

    rate = probe.experts_beside_copies_rate(lambda e: log.append(("cpu", e)), lambda slot, e: log.append(
        ("copy", slot, e)), wait, count=9, expert_bytes=10**9, repeats=2, pause=lambda: log.append("pause"))
    assert rate == pytest.approx(7 * 1.0 / 2.0)  # GB over seconds
    assert log[:9] == ["pause", ("copy", 0, 3), ("copy", 1, 4), ("copy", 0, 5), ("copy", 1, 6), ("cpu", 0),
                       ("cpu", 1), ("cpu", 2), "wait"]
    assert log.count("wait") == 3 * 3  # a warm-up round and 2 timed ones, 3 groups each
    for start in range(0, len(log), 9):
        experts = [entry[-1] for entry in log[start:start + 9] if isinstance(entry, tuple)]
        assert len(set(experts)) == 7  # 3 computed, 4 copied: all different


def test_the_kv_attention_probe_reports_the_bytes_it_reads():
    """The fused decode attention the rates probe runs (alone, and beside the copies on a GPU): one call reads the
    whole batch-8, 32-head K and V it was built over."""
    from liac import probe

    attention = probe._kv_attention(2**20)
    nbytes = attention()
    assert nbytes >= 2**20 * 0.9 and nbytes == attention()
    assert probe._kv_read_rate(2**20, 1) > 0


def test_without_a_gpu_the_rates_probe_leaves_the_attentions_shared_rate_unmeasured(monkeypatch):
    """No copies to run beside: no `ddr_shared_kv_gb_per_s` (a run-profile then keeps 0: Eq. 6 as before)."""
    import dataclasses

    from liac import probe

    monkeypatch.setattr(probe, "_gemv_rate", lambda weights, kernel, repeats: 1.0)
    monkeypatch.setattr(probe, "_kv_read_rate", lambda total, repeats: 1.0)
    rates = probe.measure_rates(dataclasses.replace(probe.ProbeSizes.quick()), use_gpu=False)
    assert "ddr_shared_kv_gb_per_s" not in rates and "ddr_shared_gb_per_s" not in rates


@pytest.mark.gpu
def test_the_rates_probe_measures_the_attention_beside_the_copies():
    """On a GPU: DDR's total beside the fused attention is its KV rate plus the copies' beside it."""
    from liac import probe

    rates = probe.measure_rates(probe.ProbeSizes.quick(), use_gpu=True)
    assert rates["ddr_shared_kv_gb_per_s"] == pytest.approx(rates["concurrent_kv_gb_per_s"]
                                                            + rates["concurrent_h2d_beside_kv_gb_per_s"])
    assert rates["concurrent_kv_gb_per_s"] > 0 and rates["concurrent_h2d_beside_kv_gb_per_s"] > 0


@pytest.mark.gpu
def test_the_expert_probe_measures_ddr_beside_several_copies():
    """On a GPU: `expert_rates` also measures DDR's total in a split experts unit's pattern (3 CPU experts beside
    4 copies, Eq. 21b's DDR term): positive, and no more than both sides at their own rates, the CPU's expert
    kernel back to back plus the copy beside an expert."""
    from liac import probe

    rates = probe.expert_rates(512, 2048, 64 * 2**20, repeats=2, use_gpu=True, idle_seconds=0.001)
    assert 0 < rates["ddr_shared_experts_gb_per_s"] <= 1.5 * (rates["cpu_expert_gb_per_s"]
                                                              + rates["h2d_beside_expert_gb_per_s"])


def test_split_cpu_start_is_the_cold_part_less_the_warm_one(monkeypatch):
    """`split_cpu_start` (Eq. 15b's w): each sample waits (here a recorded host wait), then runs F.linear on a
    slice; the baseline runs the slices back to back. With a fake clock where a part after the wait takes 3 s and
    one back to back 1 s, w = 2 s; the waits interleave (every width, every wait, each repeat); a part after the
    wait that is faster than back to back clamps w at 0."""
    import types

    import liac.probe as probe

    clock, waited, state = [0.0], [], {"cold": False}

    def host_wait(seconds):
        def wait(x):
            waited.append(seconds)
            state["cold"] = True
            return x
        return wait

    def linear(x, w, cold_cost=3.0):
        clock[0] += cold_cost if state["cold"] else 1.0
        state["cold"] = False

    monkeypatch.setattr(probe, "_host_wait", host_wait)
    monkeypatch.setattr(probe.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(probe, "F", types.SimpleNamespace(linear=linear))
    w = probe.split_cpu_start(False, hidden=16, features=(4, 8), waits=(0.002, 0.008), rotate_bytes=1024, repeats=3)
    assert w == 2.0
    assert waited == [0.002, 0.008] * 2 * 3  # per repeat: each width after each wait
    monkeypatch.setattr(probe, "F", types.SimpleNamespace(linear=lambda x, w: linear(x, w, cold_cost=0.5)))
    assert probe.split_cpu_start(False, hidden=16, features=(4,), waits=(0.001,), rotate_bytes=256, repeats=2) == 0.0


def test_split_cpu_start_and_the_decoder_gemm_curve_measure_tiny_sizes():
    """The real probes on tiny sizes (no timing asserted): a finite w ≥ 0, and the AMX curve as (M, TFLOP/s) at
    every M asked, positive and finite (the profile's `cpu_amx_bf16_tflops` format)."""
    import math

    from liac import probe

    w = probe.split_cpu_start(False, hidden=64, features=(8, 16), waits=(0.0005,), rotate_bytes=64 * 1024, repeats=3)
    assert math.isfinite(w) and w >= 0.0
    curve = probe.cpu_gemm_curve(hidden=32, rows=(1, 8, 32), rotate_bytes=256 * 1024, repeats=2, max_seconds=2.0)
    assert [m for m, _ in curve] == [1, 8, 32]
    assert all(math.isfinite(t) and t > 0 for _, t in curve)


def _fake_gpu_numbers(sizes, step):
    for name in ("GPU bf16 GEMM", "GPU GEMM curve", "HBM bandwidth", "PCIe copies", "CPU reads while PCIe copies"):
        step(name)
    return {"gpu_bf16_tflops": 700.0, "gpu_hbm_gb_per_s": 4000.0, "gpu_hbm_gib": 139.0, "gpu_launch_seconds": 5e-6,
            "pcie_h2d_gb_per_s": 50.0, "pcie_d2h_gb_per_s": 50.0, "pcie_bidir_gb_per_s": 90.0,
            "pcie_latency_seconds": 1e-5, "concurrent_cpu_gb_per_s": 40.0, "concurrent_h2d_gb_per_s": 45.0,
            "concurrent_kv_gb_per_s": 50.0, "concurrent_h2d_beside_kv_gb_per_s": 40.0}


def test_liac_profile_with_a_gpu_probes_the_split_start(monkeypatch, tmp_path):
    """With a GPU `liac profile` runs the step 'split start' (`split_cpu_start` with use_gpu) and writes
    `split_cpu_start_seconds` as measured; without one the step is not run and the field stays the base's (0: not
    priced). The GPU probes are replaced here (no CUDA on this machine)."""
    import torch

    import liac.probe as probe

    calls = []
    monkeypatch.setattr(probe, "split_cpu_start", lambda use_gpu, **kw: calls.append((use_gpu, kw)) or 4.5e-4)
    monkeypatch.setattr(probe, "split_sync_seconds", lambda gpu, repeats=0: 2e-5)
    monkeypatch.setattr(probe, "_gpu_numbers", _fake_gpu_numbers)
    steps = []
    m = probe.measure_host(probe.ProbeSizes.quick(), progress=lambda i, n, name: steps.append(name), use_gpu=True)
    assert "split start" in steps and steps.index("split start") == steps.index("split sync") + 1
    assert m.split_cpu_start_seconds == 4.5e-4 and calls[0][0] is True

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(probe, "_random", lambda *shape, scale=1.0: torch.randn(*shape, dtype=torch.bfloat16) * scale)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "a mocked GPU")
    out = tmp_path / "gpu.yaml"
    assert main(["profile", "--quick", "-o", str(out)]) == 0
    profile = load_profile(out)
    assert profile.split_cpu_start_seconds == 4.5e-4
    assert profile.sources["split_cpu_start_seconds"].startswith("liac profile")
    assert "split_cpu_start_seconds" not in profile.estimates


def test_liac_profile_without_a_gpu_leaves_the_split_start_unpriced(measured):
    profile = load_profile(measured)
    assert profile.split_cpu_start_seconds == 0.0  # the base (h200-amx16) has none: not priced
    assert not profile.sources["split_cpu_start_seconds"].startswith("liac profile")
