"""Hardware profiles: the shipped ones load, resolve by name or path, hash canonically, and bad files fail by path."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from liac.errors import LiacError
from liac.profile import OPTIONAL_FIELDS, load_profile, profile_names, resolve_profile
from liac.sizes import GIB

SHIPPED = ("gnr-h100", "h200-amx16", "spr-a100", "spr-a100-cxl", "spr-h100", "spr-h100-cxl")


def _shipped_text(name: str) -> str:
    return (Path(__file__).parents[1] / "liac" / "profiles" / f"{name}.yaml").read_text()


def test_every_lia_platform_and_our_machine_ship():
    assert set(SHIPPED) <= set(profile_names())
    for name in SHIPPED:
        profile = resolve_profile(name)
        assert profile.name == name
        # every number says where it comes from; estimates name real fields
        assert set(profile.estimates) <= set(profile.sources)


def test_h200_profile_carries_the_measured_numbers():
    hw = resolve_profile("h200-amx16")
    # device-probe-2026-11-29.json: 781 TFLOP/s, 55.46 GB/s H2D, 143771 MiB; concurrency: ~75 together vs ~40 CPU
    assert hw.gpu_bf16_tflops == 781.0
    assert hw.pcie_h2d_gb_per_s == pytest.approx(55.4, abs=0.1)
    assert hw.gpu_hbm_gib == pytest.approx(143771 / 1024, abs=0.1)
    assert hw.cpu_ddr_read_gb_per_s < hw.ddr_shared_gb_per_s < hw.cpu_ddr_read_gb_per_s + hw.pcie_h2d_gb_per_s
    spr = resolve_profile("spr-h100")  # on SPR the shared rate never binds
    assert spr.ddr_shared_gb_per_s >= spr.cpu_ddr_read_gb_per_s + spr.pcie_h2d_gb_per_s - 5
    assert resolve_profile("spr-h100-cxl").cxl_gib > 0 and spr.cxl_gib == 0


def test_cxl_profiles_follow_lias_measurements():
    """LIA Fig. 8a: two interleaved expanders stream to the GPU at 2 x 17 GB/s, not slower than DDR on its PCIe 4.0
    CXL machine (spr-a100-cxl; on PCIe 5.0 they are the slower path); Fig. 8b: CPU compute reading CXL much slower
    than from DDR. Apart from CXL, spr-a100-cxl is spr-a100."""
    a100, cxl = resolve_profile("spr-a100"), resolve_profile("spr-a100-cxl")
    assert min(cxl.cxl_gb_per_s, cxl.pcie_h2d_gb_per_s) == cxl.pcie_h2d_gb_per_s  # streaming from CXL: the PCIe rate
    assert cxl.cxl_gb_per_s <= 0.2 * cxl.cpu_ddr_read_gb_per_s  # the CPU reads CXL > 80 % slower (Fig. 8b)
    h100 = resolve_profile("spr-h100-cxl")
    assert h100.cxl_gb_per_s == cxl.cxl_gb_per_s < h100.pcie_h2d_gb_per_s  # the same expanders on PCIe 5.0
    for name in ("Fig. 8a", "Fig. 8b"):
        assert name in cxl.sources["cxl_gb_per_s"] and name in h100.sources["cxl_gb_per_s"]
    same = {f: v for f, v in a100.canonical().items() if not f.startswith("cxl") and f not in ("name", "description",
                                                                                                  "sources", "estimates")}
    assert same == {f: v for f, v in cxl.canonical().items() if f in same}


def test_amx_curve_interpolates_in_log_m():
    hw = resolve_profile("spr-h100")
    points = {p.m: p.tflops for p in hw.cpu_amx_bf16_tflops}
    assert hw.cpu_tflops_at(16) == points[16]
    # halfway between M=16 and M=32 in log M is M = sqrt(16*32)
    assert hw.cpu_tflops_at(math.sqrt(16 * 32)) == pytest.approx((points[16] + points[32]) / 2)
    assert hw.cpu_tflops_at(0.5) == points[1]  # clamped at both ends
    assert hw.cpu_tflops_at(10**6) == points[256]


def test_resolve_by_name_file_name_and_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve_profile("spr-h100.yaml") == resolve_profile("spr-h100")  # bare file name → shipped stem
    mine = tmp_path / "mine.yaml"
    mine.write_text(_shipped_text("spr-h100").replace("name: spr-h100\n", "name: mine\n"))
    assert resolve_profile(str(mine)).name == "mine"
    # a local file wins over the shipped profile of the same stem
    (tmp_path / "spr-h100.yaml").write_text(_shipped_text("spr-h100").replace("gpu_bf16_tflops: 600.0",
                                                                              "gpu_bf16_tflops: 1.0"))
    assert resolve_profile("spr-h100.yaml").gpu_bf16_tflops == 1.0


def test_unknown_names_and_missing_files():
    with pytest.raises(LiacError, match="unknown hardware profile 'h100x'.*'spr-h100'"):
        resolve_profile("h100x")
    with pytest.raises(LiacError, match="does not exist"):
        resolve_profile("some/dir/x.yaml")


def test_sha256_is_canonical_and_sensitive():
    a = resolve_profile("spr-h100")
    data = yaml.safe_load(_shipped_text("spr-h100"))
    reordered = dict(reversed(list(data.items())))
    from liac.profile import parse_profile

    assert parse_profile(reordered, "x").sha256() == a.sha256()  # key order does not matter
    data["pcie_h2d_gb_per_s"] = 54.0
    assert parse_profile(data, "x").sha256() != a.sha256()


def test_budgets_are_capacity_minus_reserve():
    hw = resolve_profile("spr-h100")
    assert hw.gpu_budget_bytes == int((hw.gpu_hbm_gib - hw.gpu_reserve_gib) * GIB)
    assert hw.cpu_budget_bytes == int((hw.cpu_ddr_gib - hw.cpu_reserve_gib) * GIB)
    assert hw.cxl_budget_bytes == 0


@pytest.mark.parametrize("edit, path, message", [
    (lambda d: d.update(gpu_hbm_gbs=1.0), "gpu_hbm_gbs", "unknown field"),
    (lambda d: d.update(pcie_h2d_gb_per_s=0.0), "pcie_h2d_gb_per_s", "greater than 0"),
    (lambda d: d.update(gpu_hbm_gib=-1.0), "gpu_hbm_gib", "at least 0"),
    (lambda d: d["cpu_amx_bf16_tflops"].reverse(), "cpu_amx_bf16_tflops[1].m", "strictly increasing"),
    (lambda d: d["sources"].pop("cpu_kv_read_gb_per_s"), "sources", "'cpu_kv_read_gb_per_s'"),
    (lambda d: d["estimates"].append("speed"), "estimates[16]", "unknown field 'speed'"),
    (lambda d: d.update(cpu_attention_bf16_tflops=[{"m": 128, "tflops": 1.0}, {"m": 16, "tflops": 0.5}]),
     "cpu_attention_bf16_tflops[1].m", "strictly increasing"),
    (lambda d: d.update(gpu_activation_factor=0.8), "gpu_activation_factor", "at least 1"),
    (lambda d: d.pop("ddr_shared_gb_per_s"), "ddr_shared_gb_per_s", "required"),
    # a profile written before splits had a synchronisation cost: no silent default, the field is named
    (lambda d: (d.pop("split_sync_seconds"), d["sources"].pop("split_sync_seconds"),
                d["estimates"].remove("split_sync_seconds")), "split_sync_seconds", "required"),
])
def test_bad_profiles_name_the_field(tmp_path, edit, path, message):
    data = yaml.safe_load(_shipped_text("spr-h100"))
    edit(data)
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(data))
    with pytest.raises(LiacError) as info:
        load_profile(bad)
    assert info.value.path == path
    assert message in info.value.message
    assert info.value.line().startswith(str(bad))


def test_a_profile_written_before_the_footprint_fields_still_loads(tmp_path):
    """The GPU footprint fields and the CPU attention curve came later (issue 12): a file without them loads with
    liac's defaults, each said in `sources` and listed under `estimates`."""
    data = yaml.safe_load(_shipped_text("spr-h100"))
    for name in OPTIONAL_FIELDS:
        data.pop(name, None)
        data["sources"].pop(name, None)
        if name in data["estimates"]:
            data["estimates"].remove(name)
    old = tmp_path / "old.yaml"
    old.write_text(yaml.safe_dump(data))
    profile = load_profile(old)
    assert (profile.gpu_context_mib, profile.gpu_library_workspace_mib, profile.gpu_activation_factor) == (
        512.0, 48.0, 1.25)
    assert profile.cpu_attention_bf16_tflops == () and profile.cpu_attention_tflops_at(128) == profile.cpu_tflops_at(128)
    for name in OPTIONAL_FIELDS:
        assert name in profile.estimates and profile.sources[name].startswith("liac's default")


def test_the_measured_footprint_goes_into_the_profile_with_a_context_margin():
    """liac profile's footprint fields (runtime/footprint.py measures; liac.host.with_footprint records): the
    context with a margin for kernels loaded after the probes, the workspaces as measured, the activation factor the
    largest measured-over-modelled ratio (never below 1)."""
    from liac.host import CONTEXT_MARGIN_MIB, FootprintProbe, with_footprint
    from liac.sizes import MIB

    base = resolve_profile("h200-measured")
    probes = [FootprintProbe(None, 4, 256, 100 * MIB), FootprintProbe(None, 32, 32, 200 * MIB)]
    profile = with_footprint(base, probes, 33 * MIB, 500 * MIB, (110 * MIB, 180 * MIB))
    assert profile.gpu_context_mib == 500 + CONTEXT_MARGIN_MIB and CONTEXT_MARGIN_MIB > 0
    assert (profile.gpu_library_workspace_mib, profile.gpu_activation_factor) == (33.0, 1.1)
    assert not {"gpu_context_mib", "gpu_library_workspace_mib", "gpu_activation_factor"} & set(profile.estimates)
    assert with_footprint(base, probes, 0, 0, (50 * MIB, 60 * MIB)).gpu_activation_factor == 1.0
    # an op probe (Eq. 24's runs: 3 MiB modelled, 24 MiB reserved, the allocator's segments) does not size it
    op = FootprintProbe(None, 4, 32, 3 * MIB, sets_factor=False)
    profile = with_footprint(base, [*probes, op], 33 * MIB, 500 * MIB, (110 * MIB, 180 * MIB, 24 * MIB))
    assert profile.gpu_activation_factor == 1.1 and "(1.10, 0.90)" in profile.sources["gpu_activation_factor"]


def test_op_probes_do_not_size_the_activation_factor():
    """liac.host.op_probes are for Eq. 24 only: their activations are too small for the allocator's granularity."""
    from liac.host import FOOTPRINT_MODELS, footprint_probes, op_probes

    base = resolve_profile("h200-measured")
    assert all(not p.sets_factor for p in op_probes(base, FOOTPRINT_MODELS[:1]))
    assert all(p.sets_factor for p in footprint_probes(base, FOOTPRINT_MODELS[:1]))


def test_runtime_op_seconds_from_the_probes_timed_decode_steps():
    """Eq. 24's field from the footprint probes' decode steps (liac.host.runtime_op_seconds): per probe that
    crosses PCIe, (measured step − its price without the term) / ops per step; the all-GPU probe is not used."""
    import dataclasses

    from liac.api import compile_plans
    from liac.host import FOOTPRINT_MODELS, FootprintProbe, op_probes, runtime_op_seconds, with_footprint
    from liac.passes.price import price_plan
    from liac.sizes import GIB

    base = dataclasses.replace(resolve_profile("h200-measured"), runtime_op_seconds=0.0)
    cfg = FOOTPRINT_MODELS[0]  # probe-opt: 2 decoder layers of 6 units, an embedding and an LM head
    (crossing,) = op_probes(base, (cfg,))
    devices = {s.decode for g in crossing.plan.spec.layer_groups for s in g.sublayers}
    assert devices == {"cpu", "gpu"}  # attention on the CPU, the rest streamed to the GPU
    plans = {"lia-partial": crossing.plan,
             "lia-gpu": compile_plans(cfg, base, batches=(32,), prompt_len=32, gen_len=2, gpu_mem=8 * GIB,
                                      policy="lia-gpu").points[0].plan}
    assert {s.decode for g in plans["lia-gpu"].spec.layer_groups for s in g.sublayers} == {"gpu"}
    probes = [crossing, FootprintProbe(plans["lia-gpu"], 32, 32, 1)]
    bare = dataclasses.replace(base, runtime_op_seconds=0.0)
    priced = price_plan(plans["lia-partial"], hw=bare).decode_seconds_per_token
    ops = 2 * 6 + 1 + 1
    measured = (priced + ops * 4e-4, 1.0)  # the all-GPU probe's 1 s step would dominate were it used
    seconds, used = runtime_op_seconds(base, probes, measured)
    assert used == 1 and seconds == pytest.approx(4e-4, rel=1e-9)
    profile = with_footprint(base, probes, 0, 0, (1, 1), measured)
    assert profile.runtime_op_seconds == pytest.approx(4e-4, rel=1e-3)
    assert "runtime_op_seconds" not in profile.estimates and "Eq. 24" in profile.sources["runtime_op_seconds"]
    assert runtime_op_seconds(base, probes[1:], measured[1:]) == (0.0, 0)  # no probe crosses PCIe: not measured
