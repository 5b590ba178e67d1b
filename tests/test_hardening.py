"""Issue 13 end to end through `liac`: hostile files, bad numbers and faults end in one line and exit 2 (130 for
Ctrl-C), never escape the output the user named, never hang, and never leave half a sweep.

Each test names the issue's item it guards. The mechanisms have their own tests: liac/fileio.py in
tests/test_fileio.py, the runtime's in tests/runtime/test_weights.py and tests/runtime/test_lia_run.py, fuzzing in
tests/test_fuzz.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest
import yaml

from liac.cli import main

ROOT = Path(__file__).parents[1]
TINY_OPT = {"model_type": "opt", "hidden_size": 128, "num_attention_heads": 4, "num_hidden_layers": 2,
            "ffn_dim": 512, "vocab_size": 1000, "max_position_embeddings": 256, "do_layer_norm_before": True,
            "word_embed_proj_dim": 128, "activation_function": "relu", "enable_bias": True}
SMALL = ["--batch", "1,2", "--prompt-len", "16", "--gen-len", "4", "--gpu-mem", "2MiB"]


@pytest.fixture()
def model(tmp_path) -> str:
    folder = tmp_path / "models" / "tiny-opt"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(TINY_OPT))
    return str(folder)


def _profile(tmp_path: Path, **changes) -> Path:
    data = yaml.safe_load((ROOT / "liac" / "profiles" / "spr-h100.yaml").read_text())
    data.update(changes)
    path = tmp_path / "hw.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _tree(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*")}


def _one_line(capsys, code, want_code: int, fragment: str) -> str:
    err = capsys.readouterr().err
    assert code == want_code, err
    assert err.count("\n") == 1 and "Traceback" not in err and fragment in err, err
    return err.strip()


def _wait_for_torch(proc: subprocess.Popen) -> None:
    """Return once torch's library is mapped into `proc` (or it ended): by then it runs inside main(), whatever
    the machine's load (a fixed sleep could signal the interpreter's own start-up on a loaded machine)."""
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            with open(f"/proc/{proc.pid}/maps") as handle:
                if "libtorch" in handle.read():
                    return
        except OSError:
            return
        time.sleep(0.05)


def _compile(model, out, *extra) -> list[str]:
    return ["compile", "--model", model, "--hw", "spr-h100", *SMALL, *extra, "-o", str(out)]


# ---------------------------------------------------------------------------------------------------------------
# Item 1: names from files never leave -o


def test_a_profile_name_cannot_put_plans_outside_the_output(tmp_path, model, capsys, monkeypatch):
    hw = _profile(tmp_path, name="/../../../../escaped")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    before = _tree(tmp_path)
    assert main(["compile", "--model", model, "--hw", str(hw), *SMALL, "-o", "out/sweep"]) == 0
    new = _tree(tmp_path) - before
    assert new and all(name.startswith("work/out") for name in new), new
    names = sorted(p.name for p in (work / "out" / "sweep").iterdir())
    assert names == ["index.yaml", "tiny-opt._.._.._.._.._escaped.b1-p16-g4.yaml",
                     "tiny-opt._.._.._.._.._escaped.b2-p16-g4.yaml"]
    assert main(["validate", "out/sweep"]) == 0


def test_a_model_name_cannot_put_a_page_outside_the_docs_output(tmp_path, model, capsys):
    plans = tmp_path / "plans" / "sweep"
    assert main(_compile(model, plans)) == 0
    for path in plans.glob("tiny-opt*.yaml"):
        doc = yaml.safe_load(path.read_text())
        doc["spec"]["model"]["name"] = "../../../escaped"
        path.write_text(yaml.safe_dump(doc))
    before = _tree(tmp_path)
    assert main(["docs", str(tmp_path / "plans"), "-o", str(tmp_path / "out" / "docs")]) == 0
    new = _tree(tmp_path) - before
    assert new and all(name == "out" or name.startswith("out/docs") for name in new), sorted(new)
    assert (tmp_path / "out" / "docs" / "___.._.._escaped.spr-h100.md").is_file()


# ---------------------------------------------------------------------------------------------------------------
# Item 2: NaN, inf and out-of-range numbers are one line naming the field, at once


@pytest.mark.parametrize("field, value, message", [
    ("cpu_ddr_read_gb_per_s", float("nan"), "must be a finite number, got nan"),  # spun for minutes in the front
    ("cpu_reserve_gib", float("nan"), "must be a finite number"),  # a ValueError traceback
    ("cxl_gib", float("nan"), "must be a finite number"),
    ("pcie_h2d_gb_per_s", float("inf"), "must be a finite number, got inf"),  # silently predicted lower times
    ("gpu_hbm_gib", 1e300, "must be between 0 and 1e+06"),
    ("pcie_h2d_gb_per_s", 1e-300, "must be between 0.001 and 1e+06"),
    ("cpu_launch_seconds", 5.0, "must be between 0 and 1"),
    ("gpu_context_mib", 1e300, "must be between 0 and 1.024e+09"),
    ("gpu_activation_factor", 1e9, "must be between 1 and 1000"),
])
def test_bad_profile_numbers_are_one_line_naming_the_field(tmp_path, model, capsys, monkeypatch, field, value,
                                                            message):
    import liac.api
    import liac.passes.ilp

    def never(*args, **kwargs):  # the NaN bandwidth spun here for minutes: the profile is refused before it
        raise AssertionError("a refused profile reached the solver")
    monkeypatch.setattr(liac.api, "solve_placement", never)
    monkeypatch.setattr(liac.passes.ilp, "_front", never)
    hw = _profile(tmp_path, **{field: value})
    code = main(["compile", "--model", model, "--hw", str(hw), "--batch", "1", "-o", str(tmp_path / "out")])
    line = _one_line(capsys, code, 2, message)
    assert line.startswith(f"liac compile: {hw}: {field}: ")
    assert not (tmp_path / "out").exists()


def test_explain_with_a_nan_profile_is_one_line(tmp_path, model, capsys):
    plan = tmp_path / "plan.yaml"
    assert main(_compile(model, plan)[:-2] + ["--batch", "1", "-o", str(plan)]) == 0
    capsys.readouterr()
    hw = _profile(tmp_path, gpu_bf16_tflops=float("nan"))
    _one_line(capsys, main(["explain", str(plan), "--hw", str(hw)]), 2, "gpu_bf16_tflops: must be a finite number")


def test_non_finite_status_numbers_are_findings(tmp_path, model, capsys):
    plan = tmp_path / "plan.yaml"
    assert main(_compile(model, plan)[:-2] + ["--batch", "1", "-o", str(plan)]) == 0
    text = plan.read_text()
    plan.write_text(text.replace("  solver:\n    gap: 0.0\n", "  solver:\n    gap: .nan\n", 1))
    capsys.readouterr()
    assert main(["validate", str(plan)]) == 1  # problems found
    assert "status.solver.gap: must be a finite number, got nan" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------------------------
# Items 3 and 4: a sweep is written as a whole, under a lock; only its own files are removed


def test_a_hostile_index_cannot_make_a_compile_delete_other_files(tmp_path, model, capsys):
    out = tmp_path / "sweep"
    assert main(_compile(model, out)) == 0
    (out / "notes.yaml").write_text("mine\n")
    index = yaml.safe_load((out / "index.yaml").read_text())
    index["points"] += [{"file": "notes.yaml"}, {"file": "index.yaml"}]
    (out / "index.yaml").write_text(yaml.safe_dump(index))
    assert main(_compile(model, out)[:-2] + ["--batch", "2", "-o", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["index.yaml", "notes.yaml", "tiny-opt.spr-h100.b2-p16-g4.yaml"]
    assert (out / "notes.yaml").read_text() == "mine\n"


def test_a_compile_into_a_directory_being_written_is_refused(tmp_path, model, capsys):
    from liac.sweep import is_sweep_file
    from liac.fileio import SweepWriter

    out = tmp_path / "sweep"
    with SweepWriter(out, owned=is_sweep_file):
        _one_line(capsys, main(_compile(model, out)), 2, "is being written by another liac process")
    assert list(out.iterdir()) == []


def test_two_concurrent_compiles_leave_one_whole_sweep(tmp_path, model):
    out = tmp_path / "sweep"
    argv = [sys.executable, "-m", "liac.cli", *_compile(model, out)]
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    assert any(code == 0 for code, _ in results), results
    for code, err in results:  # each either wrote a whole sweep or was refused in one line
        assert code == 0 or (code == 2 and err.count("\n") == 1 and "being written" in err), results
    assert main(["validate", str(out)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["models", "sweep"]


# ---------------------------------------------------------------------------------------------------------------
# Item 5: the output is checked before any compute


@pytest.mark.parametrize("where", ["under-a-file", "read-only"])
def test_an_unwritable_output_fails_before_compiling(tmp_path, model, capsys, monkeypatch, where):
    import liac.api
    from liac.fileio import SweepWriter

    monkeypatch.setattr(liac.api, "compile_plans", lambda *a, **k: pytest.fail("compiled before the check"))
    (tmp_path / "file").write_text("x")
    out = tmp_path / "file" / "sweep"
    if where == "read-only":  # what a read-only directory answers (root, running CI, bypasses file modes)
        out = tmp_path / "ro" / "sweep"

        def refuse(self):
            raise PermissionError(13, "Permission denied", str(self.out.parent))
        monkeypatch.setattr(SweepWriter, "_new_staging", refuse)
    _one_line(capsys, main(_compile(model, out)), 2, "liac compile: -o: cannot ")
    _one_line(capsys, main(_compile(model, tmp_path / "file" / "plan.yaml")[:-2] + ["--batch", "1", "-o",
                                                                                    str(tmp_path / "file" / "p.yaml")]),
              2, "liac compile: -o: cannot write")
    assert not out.exists()


# ---------------------------------------------------------------------------------------------------------------
# Item 6: a YAML alias bomb is refused at once


def test_an_alias_bomb_in_a_plan_is_one_line(tmp_path, capsys):
    bomb = "".join(f"a{n}: &a{n} [" + ", ".join([f"*a{n - 1}" if n else "x"] * 10) + "]\n" for n in range(9))
    plan = tmp_path / "plan.yaml"
    plan.write_text("apiVersion: liac/v2\nkind: OffloadPlan\nmetadata:\n  name: x\n" + bomb)
    tracemalloc.start()
    for command, status in ((["validate"], 1), (["explain"], 2), (["diff", str(plan)], 2)):
        code = main([*command, str(plan)])
        captured = capsys.readouterr()
        assert code == status and "aliases ('*name') are not allowed" in captured.out + captured.err
        assert len((captured.out + captured.err).strip().splitlines()) == 1
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 64 * 2**20  # memory, not seconds: the bomb's 10⁹ elements (or their repr) were never built


# ---------------------------------------------------------------------------------------------------------------
# Item 7: hand-edited plans whose config was re-hashed, and malformed sweep files


def _rehash(plan: Path, **changes) -> None:
    doc = yaml.safe_load(plan.read_text())
    doc["spec"]["model"]["config"].update(changes)
    body = {k: v for k, v in doc["spec"]["model"]["config"].items() if k != "name"}
    doc["spec"]["model"]["config_sha256"] = hashlib.sha256(
        json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    plan.write_text(yaml.safe_dump(doc))


@pytest.mark.parametrize("changes, field, message", [
    ({"num_heads": 0, "num_kv_heads": 0}, "num_heads", "must be between 1 and"),  # ZeroDivisionError
    ({"hidden_size": "128"}, "hidden_size", "must be an integer, got '128'"),  # TypeError
    ({"dtype": "int8"}, "dtype", "unsupported value 'int8'"),  # ran silently as bf16
    ({"norm": "groupnorm"}, "norm", "must be 'layernorm' for family 'opt'"),  # ran with different tokens
    ({"activation": "gelu"}, "activation", "must be 'relu' for family 'opt'"),
    ({"norm_eps": float("nan")}, "norm_eps", "must be a finite number"),
])
def test_a_rehashed_config_is_one_line_naming_the_field(tmp_path, model, capsys, changes, field, message):
    plan = tmp_path / "plan.yaml"
    assert main(_compile(model, plan)[:-2] + ["--batch", "1", "-o", str(plan)]) == 0
    _rehash(plan, **changes)
    capsys.readouterr()
    assert main(["validate", str(plan)]) == 1  # problems found
    out = capsys.readouterr().out
    assert f"{plan}: spec.model.config.{field}: {message}" in out and out.count("\n") == 1, out
    from liac.runtime.cli import main as lia_run

    assert lia_run([str(plan), "--random-weights", "0"]) == 2
    assert f"spec.model.config.{field}: " in capsys.readouterr().err


def test_docs_with_malformed_infeasible_entries_is_one_line(tmp_path, model, capsys):
    plans = tmp_path / "plans" / "sweep"
    assert main(_compile(model, plans)) == 0
    index = yaml.safe_load((plans / "index.yaml").read_text())
    index["infeasible"] = [{"batch": 4}]  # a KeyError before
    (plans / "index.yaml").write_text(yaml.safe_dump(index))
    capsys.readouterr()
    _one_line(capsys, main(["docs", str(tmp_path / "plans"), "-o", str(tmp_path / "docs")]), 2,
              "index.yaml: infeasible[0]: must be {batch_size: an integer, reason: a string}")


# ---------------------------------------------------------------------------------------------------------------
# Item 8


BIG = {**TINY_OPT, "num_hidden_layers": 30000}


def test_highs_and_cbc_agree_on_a_30000_layer_model(tmp_path):
    from liac.api import compile_plans
    from liac.models.config import from_hf_config

    cfg = from_hf_config(BIG, name="big")
    results = {}
    for solver in ("highs", "cbc"):
        result = compile_plans(cfg, "h200-amx16", batches=(32, 64, 128), solver=solver)  # 64 nearly fills it
        results[solver] = ({p.plan.spec.workload.batch_size: (p.plan.status.solver.status,
                                                              p.plan.status.predicted.total_seconds)
                            for p in result.points}, [b for b, _ in result.infeasible])
    (highs, highs_none), (cbc, cbc_none) = results["highs"], results["cbc"]
    assert highs_none == cbc_none == [128] and highs.keys() == cbc.keys() == {32, 64}
    for batch in highs:  # both proven optimal, to the solvers' 1e-9 tolerance
        assert highs[batch][0] == cbc[batch][0] == "optimal"
        assert highs[batch][1] == pytest.approx(cbc[batch][1], rel=1e-8)


def test_a_solver_that_gives_up_is_not_reported_as_infeasible(tmp_path, model, monkeypatch):
    import pulp

    import liac.passes.ilp_master as master
    from liac.api import compile_plans
    from liac.errors import InfeasibleError, LiacError

    def gives_up(problem, solver):
        problem.status = pulp.LpStatusNotSolved
        return False
    def too_large(*args, **kwargs):
        raise master.TooLarge()
    monkeypatch.setattr(master, "_solve", gives_up)
    monkeypatch.setattr(master, "solve_level", too_large)  # every level through the ILP solver
    with pytest.raises(LiacError) as info:
        compile_plans(model, "spr-h100", batches=(1,), gpu_mem=2 * 2**20)
    assert not isinstance(info.value, InfeasibleError)
    assert "without a plan or a proof that none exists" in info.value.message
    assert "retry with --solver" in info.value.message


def test_a_budget_above_the_profiles_memory_is_refused(tmp_path, model, capsys):
    _one_line(capsys, main(["compile", "--model", model, "--hw", "h200-amx16", "--gpu-mem", "1TiB", "-o",
                            str(tmp_path / "out")]), 2, "--gpu-mem: must be at most the 140.4 GiB hardware profile")
    _one_line(capsys, main(["compile", "--model", model, "--hw", "spr-h100", "--cpu-mem", "1TiB", "-o",
                            str(tmp_path / "out")]), 2, "--cpu-mem: must be at most the 476.8 GiB")
    assert not (tmp_path / "out").exists()


def test_explain_never_opens_a_file_a_plan_names(tmp_path, model, capsys):
    plan = tmp_path / "plan.yaml"
    assert main(_compile(model, plan)[:-2] + ["--batch", "1", "-o", str(plan)]) == 0
    secret = tmp_path / "secret.txt"
    secret.write_text("root:x:0:0:root:/root:/bin/bash\n")
    plan.write_text(plan.read_text().replace("profile: spr-h100", f"profile: {secret}"))
    capsys.readouterr()
    line = _one_line(capsys, main(["explain", str(plan)]), 2, "is not a shipped hardware profile")
    assert "spec.hardware.profile" in line and "root:x" not in line and "pass the profile file" in line


def test_ctrl_c_is_one_line_and_130_and_leaves_nothing(tmp_path, model, capsys, monkeypatch):
    import importlib

    import liac.api

    real = importlib.import_module

    def interrupted_import(name, *args):
        if name == "liac.commands.docs":
            raise KeyboardInterrupt
        return real(name, *args)
    monkeypatch.setattr(importlib, "import_module", interrupted_import)
    assert main(["validate", "x"]) == 130
    assert capsys.readouterr().err == "liac: interrupted\n"
    monkeypatch.setattr(importlib, "import_module", real)

    def interrupted_compile(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(liac.api, "compile_plans", interrupted_compile)
    out = tmp_path / "sweep"
    assert main(_compile(model, out)) == 130
    assert capsys.readouterr().err == "liac compile: interrupted\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["models"]  # the directory it made is gone again


def test_a_real_sigint_during_a_compile(tmp_path, model):
    import signal

    out = tmp_path / "sweep"
    proc = subprocess.Popen([sys.executable, "-m", "liac.cli", *_compile(model, out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    _wait_for_torch(proc)  # then inside main(): liac's commands load torch there
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=600)  # a hang guard, not a speed check
    if proc.returncode == 0:  # it had finished: the sweep is whole
        assert main(["validate", str(out)]) == 0
        return
    assert proc.returncode == 130 and err == "liac compile: interrupted\n", err
    assert not out.exists() or sorted(p.name for p in out.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) in (["models"], ["models", "sweep"])
