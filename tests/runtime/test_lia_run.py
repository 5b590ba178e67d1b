"""`lia-run` end to end, in process: a run's output and metrics; every bad input is one line, exit 2, no file.

stdout carries what was generated (token ids here; text in test_lia_run_text.py), stderr the report."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from runtime_plans import TINY, make_plan

from liac.plan import dump_plan
from liac.runtime.cli import main



@pytest.fixture
def plan_file(tmp_path):
    def write(policy="partial", cfg=TINY, **kwargs):
        path = tmp_path / f"{policy}.yaml"
        dump_plan(make_plan(cfg, policy, batch=2, prompt_len=6, gen_len=5, **kwargs), path)
        return path
    return write


def _fails(argv, capsys, fragment: str) -> str:
    capsys.readouterr()  # drop what fixtures printed (HF's save progress)
    assert main([str(a) for a in argv]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lia-run: ") and fragment in lines[0], err
    return lines[0]


def test_run_prints_summary_and_writes_metrics(plan_file, tmp_path, capsys):
    metrics_path = tmp_path / "out" / "metrics.json"
    path = plan_file("mixed", cxl_layers=1)
    assert main([str(path), "--random-weights", "3", "--emulate-gpu", "--metrics-out", str(metrics_path),
                 "--profile-steps", "2"]) == 0
    captured = capsys.readouterr()
    out, err = captured.out, captured.err
    assert "prefill" in err and "ms/token" in err and "tokens/s" in err
    assert err.count("CPU-less NUMA node") == 1  # the CXL fallback is said once
    assert out.splitlines()[0].startswith("tokens[0]: ") and len(out.splitlines()) == 2  # one line per sequence
    metrics = json.loads(metrics_path.read_text())
    assert metrics["run"] == {"batch_size": 2, "prompt_len": 6, "gen_len": 5, "decode_steps": 4,
                              "generated_tokens": 10, "prefill_microbatches": 1,  # the whole batch at once
                              "profile_steps": 2}  # liac calibrate prices the sublayer rows at these steps
    assert metrics["backend"]["emulated_gpu"] is True
    assert metrics["prefill_ms"] > 0 and metrics["decode_ms_per_token"] > 0
    assert metrics["tokens_per_second"] == pytest.approx(
        2 * 5 / ((metrics["prefill_ms"] + metrics["decode_ms"]) / 1e3), rel=1e-3)
    assert [m["tier"] for m in metrics["memory"]] == ["hbm", "ddr", "cxl"]
    assert [n for n in metrics["notes"] if "CPU-less" in n]
    rows = {(r["group"], tuple(r["sublayers"]), r["phase"]): r for r in metrics["sublayers"]}
    # decode of the offloaded group splits attention (score on the GPU, context on the CPU): two rows; prefill
    # fuses them on the GPU: one row with both predictions summed
    score = rows[("offload", ("attn_score",), "decode")]
    assert score["device"] == "gpu" and score["measured_ms"] > 0
    fused = rows[("offload", ("attn_score", "attn_context"), "prefill")]
    plan = make_plan(TINY, "mixed", batch=2, prompt_len=6, gen_len=5, cxl_layers=1)
    want = sum(t.compute_seconds + t.transfer_seconds for t in plan.status.predicted.sublayers
               if t.group == "offload" and t.name in ("attn_score", "attn_context") and t.phase == "prefill")
    assert fused["predicted_ms"] == pytest.approx(want * 1e3, rel=1e-5)


def test_prompt_ids_file(plan_file, tmp_path, capsys):
    ids = tmp_path / "ids.json"
    ids.write_text(json.dumps([[1, 2, 3, 4], [5, 6, 7, 8]]))
    assert main([str(plan_file("gpu")), "--random-weights", "1", "--emulate-gpu", "--prompt-ids", str(ids),
                 "--gen-len", "3", "--profile-steps", "0"]) == 0
    assert "batch 2, prompt 4, 3 new tokens" in capsys.readouterr().err


def test_gpu_plan_on_a_host_without_gpu(plan_file, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("LIAC_EMULATE_GPU", raising=False)
    metrics = tmp_path / "m.json"
    line = _fails([plan_file("gpu"), "--random-weights", "0", "--metrics-out", metrics], capsys,
                  "no CUDA device is available")
    assert "spec.layer_groups[0].sublayers[0].prefill: must be 'cpu' on this host" in line
    assert not metrics.exists()


def test_bad_requests_and_inputs(plan_file, tmp_path, capsys, checkpoints):
    path = plan_file("cpu")
    metrics = tmp_path / "m.json"
    _fails([path, "--random-weights", "0", "--prompt-len", "7", "--metrics-out", metrics], capsys,
           "--prompt-len: prompt length must be between 1 and 6")
    _fails([path, "--random-weights", "0", "--gen-len", "9"], capsys, "--gen-len: new tokens must be between 1 and 5")
    _fails([path, "--random-weights", "0", "--batch", "3"], capsys, "--batch: batch must be between 1 and 2")
    _fails([tmp_path / "absent.yaml", "--random-weights", "0"], capsys, "cannot read")
    opt_dir, _ = checkpoints("opt")  # a checkpoint of another architecture than TINY
    _fails([path, "--weights", opt_dir], capsys, "the model the plan was compiled for ('tiny-opt')")
    ids = tmp_path / "ids.json"
    ids.write_text("[1, 2, \"x\"]")
    _fails([path, "--random-weights", "0", "--prompt-ids", ids], capsys, "--prompt-ids")
    _fails([path, "--random-weights", "0", "--weights", opt_dir], capsys, "not allowed with argument")
    assert not metrics.exists()


def test_truncated_checkpoint_is_one_line(checkpoints, tmp_path, capsys):
    import shutil

    source, cfg = checkpoints("qwen2")
    directory = tmp_path / "qwen2"
    shutil.copytree(source, directory)
    weights = directory / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    path = tmp_path / "plan.yaml"
    dump_plan(make_plan(cfg, "cpu"), path)
    _fails([path, "--weights", directory], capsys, "truncated")


def test_split_plan_file_runs_and_reports_both_parts(plan_file, tmp_path, capsys):
    # a plan v2 file with split units: through YAML (schema, semantics), then the metrics' split rows
    metrics_path = tmp_path / "split.json"
    assert main([str(plan_file("split", permille=333)), "--random-weights", "0", "--emulate-gpu", "--metrics-out",
                 str(metrics_path), "--profile-steps", "2"]) == 0
    rows = [r for r in json.loads(metrics_path.read_text())["sublayers"] if r["device"] == "split"]
    assert {r["sublayers"][0] for r in rows} == {"qkv", "out_proj", "fc1", "fc2", "lm_head"}
    assert all(r["measured_cpu_part_ms"] > 0 and r["measured_gpu_part_ms"] > 0 and r["predicted_ms"] for r in rows)


def test_a_v1_plan_file_is_migrated_and_runs(plan_file, tmp_path, capsys):
    import yaml

    v2 = plan_file("mixed")
    doc = yaml.safe_load(v2.read_text())
    doc["apiVersion"] = "liac/v1"  # what `liac compile` wrote before splits: no permille fields
    for part in ("spec", "status"):  # ... nor serving batches (v4)
        del doc[part]["serving"]
    for group in doc["spec"]["layer_groups"]:
        for sub in group["sublayers"]:
            del sub["prefill_cpu_permille"], sub["decode_cpu_permille"]
    v1 = tmp_path / "v1.yaml"
    v1.write_text(yaml.safe_dump(doc))
    outputs = []
    for path in (v1, v2):
        assert main([str(path), "--random-weights", "2", "--emulate-gpu", "--profile-steps", "0"]) == 0
        outputs.append([line for line in capsys.readouterr().out.splitlines() if line.startswith("tokens[0]")])
    assert outputs[0] == outputs[1] and outputs[0]  # the same plan, the same tokens


# ---------------------------------------------------------------------------------------------------------------
# Issue 13: output checked before the run (item 5), bounded numbers, Ctrl-C (item 8)


def test_an_unwritable_metrics_path_fails_before_the_run(plan_file, tmp_path, capsys, monkeypatch):
    import liac.runtime.engine as engine_module

    monkeypatch.setattr(engine_module.Engine, "from_plan", lambda *a, **k: pytest.fail("ran before the check"))
    (tmp_path / "file").write_text("x")
    _fails([plan_file("cpu"), "--random-weights", "0", "--metrics-out", tmp_path / "file" / "m.json"], capsys,
           "--metrics-out: cannot write")
    _fails([plan_file("cpu"), "--random-weights", "0", "--metrics-out", tmp_path], capsys,
           "is a directory: must name a file")


def test_metrics_that_cannot_be_written_at_the_end_still_reach_stdout(plan_file, tmp_path, capsys, monkeypatch):
    import liac.runtime.metrics as metrics_module
    from liac.errors import LiacError

    def full(path, metrics):
        raise LiacError("--metrics-out", "cannot write: No space left on device")
    monkeypatch.setattr(metrics_module, "write_metrics", full)
    capsys.readouterr()
    assert main([str(plan_file("cpu")), "--random-weights", "0", "--profile-steps", "0", "--metrics-out",
                 str(tmp_path / "m.json")]) == 2
    captured = capsys.readouterr()
    assert '"metrics_version": 1' in captured.out  # the run's measurements are not lost
    assert captured.err.splitlines()[-1] == "lia-run: --metrics-out: cannot write: No space left on device"


def test_out_of_range_numbers_are_usage_errors(plan_file, tmp_path, capsys):
    path = plan_file("cpu")
    ids = tmp_path / "ids.json"
    ids.write_text(json.dumps([[1, 2, 10**30]]))
    _fails([path, "--random-weights", "0", "--prompt-ids", ids], capsys, "token ids")
    ids.write_text("[[1, NaN]]")
    _fails([path, "--random-weights", "0", "--prompt-ids", ids], capsys, "not a number JSON allows")
    capsys.readouterr()
    assert main([str(path), "--random-weights", str(2**64)]) == 2
    assert main([str(path), "--random-weights", "0", "--gen-len", str(2**40)]) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_ctrl_c_while_loading_torch_is_one_line(plan_file, capsys, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def interrupted(name, *args, **kwargs):
        if name == "liac.runtime.engine":
            raise KeyboardInterrupt
        return real_import(name, *args, **kwargs)
    monkeypatch.setattr(builtins, "__import__", interrupted)
    capsys.readouterr()
    assert main([str(plan_file("cpu")), "--random-weights", "0"]) == 130
    assert capsys.readouterr().err.strip() == "lia-run: interrupted (nothing was written)"


def test_ctrl_c_in_a_real_process_is_one_line_and_130(plan_file, tmp_path):
    import signal
    import subprocess
    import sys
    import time

    metrics = tmp_path / "m.json"
    proc = subprocess.Popen([sys.executable, "-m", "liac.runtime.cli", str(plan_file("cpu")), "--random-weights", "0",
                             "--emulate-gpu", "--metrics-out", str(metrics)], stderr=subprocess.PIPE, text=True)
    # Signal once torch's library is mapped: the process is then inside main() (torch loads there), whatever the
    # machine's load; the interpreter's own start-up, before liac's code runs, is out of reach by design.
    maps = f"/proc/{proc.pid}/maps"
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            with open(maps) as handle:
                if "libtorch" in handle.read():
                    break
        except OSError:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=600)  # a hang guard, not a speed check
    if proc.returncode == 0:  # it finished before the signal: nothing to check on this machine
        assert metrics.is_file()
        return
    assert proc.returncode == 130 and err.splitlines()[-1:] == ["lia-run: interrupted (nothing was written)"], err
    assert "Traceback" not in err and not metrics.exists()


# ---------------------------------------------------------------------------------------------------------------
# Issue 13 for the text inputs: --prompt-file, a sweep directory as the plan, --weights names


def test_a_prompt_file_is_read_safely(plan_file, tmp_path, capsys, monkeypatch):
    """Regular UTF-8 files only, bounded: a FIFO or a device never blocks the run, and every refusal is one line
    naming --prompt-file and the file, before anything is loaded."""
    import io

    import liac.runtime.cli as cli

    path = plan_file("cpu")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # opening it for reading would wait for a writer forever
    _fails([path, "--random-weights", "0", "--prompt-file", fifo], capsys,
           f"--prompt-file '{fifo}': must be a regular file")
    _fails([path, "--random-weights", "0", "--prompt-file", "/dev/zero"], capsys, "must be a regular file")
    _fails([path, "--random-weights", "0", "--prompt-file", tmp_path], capsys, "must be a regular file")
    _fails([path, "--random-weights", "0", "--prompt-file", tmp_path / "none.txt"], capsys,
           "none.txt': cannot read: No such file or directory")
    latin = tmp_path / "latin.txt"
    latin.write_bytes("caf\xe9\n".encode("latin-1"))
    _fails([path, "--random-weights", "0", "--prompt-file", latin], capsys, "must be UTF-8 text (byte 3 is not)")
    blank = tmp_path / "blank.txt"
    blank.write_text("\n  \n")
    _fails([path, "--random-weights", "0", "--prompt-file", blank], capsys, "holds no prompt")
    big = tmp_path / "big.txt"
    big.write_text("the prompt\n" * 20)
    monkeypatch.setattr(cli, "MAX_PROMPT_FILE_BYTES", 100)
    _fails([path, "--random-weights", "0", "--prompt-file", big], capsys, "is 220 bytes: must be at most 100 bytes")
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"x" * 101)))
    _fails([path, "--random-weights", "0", "--prompt-file", "-"], capsys,
           "--prompt-file -: standard input must be at most 100 bytes")
    ok = tmp_path / "ok.txt"
    ok.write_text("a\n\n  \nb\n")
    assert cli.read_prompt_file(str(ok)) == ["a", "b"]  # blank lines skipped


def _sweep(tmp_path, plan_path, rows) -> Path:
    import yaml

    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / plan_path.name).write_bytes(plan_path.read_bytes())
    (sweep / "index.yaml").write_text(yaml.safe_dump({"kind": "OffloadPlanIndex", "points": rows}))
    return sweep


def test_a_sweep_directory_as_the_plan_reads_only_inside_it(plan_file, tmp_path, capsys):
    plan = plan_file("cpu")  # tmp_path/cpu.yaml: beside the sweep directory, outside it
    row = {"batch_size": 2, "prompt_len": 6, "gen_len": 5}
    sweep = _sweep(tmp_path, plan, [{"file": "../cpu.yaml", **row}])
    _fails([sweep, "--random-weights", "0"], capsys, "points[0].file: must name a file inside")
    (sweep / "index.yaml").write_text(f"kind: OffloadPlanIndex\npoints: [{{file: {plan}, batch_size: 2, "
                                      "prompt_len: 6, gen_len: 5}]\n")
    _fails([sweep, "--random-weights", "0"], capsys, "no absolute path")
    (sweep / "index.yaml").write_text("a: &a [1]\nkind: OffloadPlanIndex\npoints: *a\n")
    _fails([sweep / "index.yaml", "--random-weights", "0"], capsys, "aliases")
    (sweep / "index.yaml").unlink()
    os.mkfifo(sweep / "index.yaml")  # never opened: not a regular file
    _fails([sweep, "--random-weights", "0"], capsys, "must be a plan file or a sweep directory holding 'index.yaml'")
    (sweep / "index.yaml").unlink()
    _fails([sweep, "--random-weights", "0"], capsys, "must be a plan file or a sweep directory holding 'index.yaml'")
    (tmp_path / "g").mkdir()
    good = _sweep(tmp_path / "g", plan, [{"file": "cpu.yaml", **row}])
    capsys.readouterr()
    assert main([str(good), "--random-weights", "0", "--emulate-gpu", "--profile-steps", "0", "--gen-len", "2"]) == 0
    assert "running cpu.yaml" in capsys.readouterr().err


def test_weights_names_are_checked(plan_file, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    path = plan_file("cpu")
    monkeypatch.chdir(tmp_path)  # '../../etc' relative to a checkout may exist (a clone under /tmp reaches /etc)
    for name in ("../../etc", "org/../x", "a/b/c", "/nonexistent/dir"):
        _fails([path, "--weights", name], capsys, "must be a checkpoint directory or a Hugging Face repo id")
    _fails([path, "--weights", "facebook/opt-125m"], capsys, "is not in the Hugging Face cache")
    (tmp_path / "ckpt").mkdir()
    _fails([path, "--weights", tmp_path / "ckpt"], capsys, "holds no .safetensors files")
    os.mkfifo(tmp_path / "ckpt" / "tokenizer.json")  # transformers would block opening it
    _fails([path, "--weights", tmp_path / "ckpt", "--prompt", "hi"], capsys,
           "tokenizer.json: must be a regular file (the tokenizer is read from it)")
