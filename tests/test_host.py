"""Host-aware defaults: `liac compile` without `--hw` plans for this host (its profile in the user's cache, measured
on first use), and `liac profile` names the CPU's ISA. The probe runs for real, at tiny sizes (no timing asserted)."""

from __future__ import annotations

import io
import json
import sys

import pytest
import torch

import liac.host as host
from liac.cli import main
from liac.errors import LiacError
from liac.host import CpuIsa, cpu_isa, isa_from_flags
from liac.passes.price import plan_profile
from liac.plan import load_plan
from liac.probe import ProbeSizes
from liac.profile import host_profile_path, load_profile, resolve_profile

TINY = ProbeSizes(weight_bytes=2**20, rotate_bytes=2**21, gemm_k=128, copy_bytes=2**20, repeats=1)
TINY_OPT = {"model_type": "opt", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
            "ffn_dim": 128, "vocab_size": 100, "max_position_embeddings": 128, "do_layer_norm_before": True,
            "word_embed_proj_dim": 64, "activation_function": "relu", "enable_bias": True}


class _Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.fixture
def cpu_host(monkeypatch):
    """This host without CUDA (as CI is; also on a GPU machine), and probes at tiny sizes."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(host, "first_use_sizes", lambda: TINY)
    monkeypatch.setattr(ProbeSizes, "quick", staticmethod(lambda: TINY))


@pytest.fixture
def tiny_model(tmp_path):
    folder = tmp_path / "tiny-opt"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(TINY_OPT))
    return str(folder)


def test_isa_from_flags():
    assert isa_from_flags({"avx2", "avx512f", "amx_tile", "amx_bf16", "amx_int8"}) == "AMX"
    assert isa_from_flags({"avx2", "avx512f", "avx512_bf16", "amx_tile"}) == "AVX-512"  # no AMX-BF16
    assert isa_from_flags({"avx2", "fma"}) == "AVX2"
    assert isa_from_flags({"sse4_2"}) == "baseline"


def test_cpu_isa_reads_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse4_2 avx2 avx512f avx512bw\n")
    assert cpu_isa(info) == CpuIsa("AVX-512", "/proc/cpuinfo flags")
    fallback = cpu_isa(tmp_path / "absent")  # not Linux: torch's capability
    assert fallback.source == "torch's CPU capability" and fallback.name in ("AMX", "AVX-512", "AVX2", "baseline")


def test_compile_without_hw_plans_for_this_host(cpu_host, tiny_model, tmp_path, capsys, monkeypatch):
    path = host_profile_path()
    assert not path.exists() and str(path).startswith(str(tmp_path.parent))  # the test's own cache directory
    argv = ["compile", "--model", tiny_model, "--batch", "1,4", "--prompt-len", "16", "--gen-len", "4"]
    assert main(argv + ["-o", str(tmp_path / "first")]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"liac compile: no profile of this host yet: measuring it with a quick probe (seconds) into "
                   f"{path}; 'liac profile' measures it fully, '--hw NAME' plans for another machine"]
    profile = load_profile(path)
    assert profile.name == "host" and profile.gpu_hbm_gib == 0 and "[quick probe]" in profile.description
    assert profile.sources["cpu_ddr_read_gb_per_s"].startswith("liac profile on this host")
    for plan_file in (tmp_path / "first").glob("tiny-opt.*.yaml"):
        plan = load_plan(plan_file)
        assert plan.spec.hardware.profile == "host" and plan.spec.hardware.sha256 == profile.sha256()
        assert plan.spec.budgets.gpu_bytes == 0  # no GPU here: a CPU plan, with no flag
        assert {s.prefill for g in plan.spec.layer_groups for s in g.sublayers} == {"cpu"}
        assert {s.decode for g in plan.spec.layer_groups for s in g.sublayers} == {"cpu"}
        assert plan_profile(plan) == profile  # `liac explain` finds the host profile by name
    # second use: the cached profile, no probe, nothing said
    monkeypatch.setattr("liac.probe.measure_host", lambda *a, **k: pytest.fail("measured again"))
    assert main(argv + ["-o", str(tmp_path / "second")]) == 0
    assert capsys.readouterr().err == ""
    names = sorted(p.name for p in (tmp_path / "first").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "second").iterdir())
    assert "tiny-opt.host.b1-p16-g4.yaml" in names


def test_named_profiles_remain_and_host_is_the_default(cpu_host, tiny_model, tmp_path, capsys):
    argv = ["compile", "--model", tiny_model, "--batch", "1", "--prompt-len", "16", "--gen-len", "4"]
    assert main(argv + ["--hw", "spr-h100", "-o", str(tmp_path / "p.yaml")]) == 0
    assert load_plan(tmp_path / "p.yaml").spec.hardware.profile == "spr-h100"
    assert not host_profile_path().exists()  # a named profile never probes this host
    with pytest.raises(LiacError) as info:  # outside compile, 'host' is only read
        resolve_profile("host")
    assert info.value.line() == (f"--hw: no profile of this host yet ({host_profile_path()}): measure it with "
                                 f"'liac profile'")
    capsys.readouterr()
    assert main(argv + ["--hw", "host", "-o", str(tmp_path / "h.yaml")]) == 0  # the same as no --hw
    assert "measuring it with a quick probe" in capsys.readouterr().err
    assert load_plan(tmp_path / "h.yaml").spec.hardware.profile == "host"


@pytest.mark.parametrize("isa", [CpuIsa("AVX2", "/proc/cpuinfo flags"), CpuIsa("AMX", "/proc/cpuinfo flags")])
def test_profile_writes_the_host_profile_and_names_the_isa(cpu_host, isa, capsys, monkeypatch):
    monkeypatch.setattr(host, "cpu_isa", lambda: isa)
    assert main(["profile", "--quick"]) == 0
    out, err = capsys.readouterr()
    path = host_profile_path()
    assert out.startswith(f"wrote {path}: CPU ISA {isa.name}{'' if isa.has_amx else ' (no AMX)'}; ")
    assert f"bf16 TFLOP/s ({isa.name})" in out and "no GPU on this host" in out
    if isa.has_amx:
        assert err == ""
    else:
        assert err.startswith("liac profile: warning: this CPU has no AMX (widest bf16 ISA: AVX2, from "
                              "/proc/cpuinfo flags)") and err.count("\n") == 1
    profile = resolve_profile("host")
    assert profile.name == "host" and profile.gpu_hbm_gib == 0 and f", {isa.name}; no GPU" in profile.description
    assert ("(AMX)" if isa.has_amx else "(AVX2, no AMX)") in profile.sources["cpu_amx_bf16_tflops"]


def test_profiling_draws_a_bar_only_on_a_terminal(cpu_host, tmp_path, monkeypatch):
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(["profile", "--quick", "-o", str(tmp_path / "p.yaml")]) == 0
    drawn = terminal.getvalue()
    assert "measuring this host" in drawn and "CPU GEMM curve" in drawn and "split sync" in drawn
