"""`lia-run` with text: prompts through the checkpoint's tokenizer, text on stdout (streamed for one sequence, each
when done for a batch), --json / --jsonl, sampling flags, plans as maxima, and a sweep directory as the plan.

References: HF `generate` + the tokenizer's decode on the same checkpoint (runtime_plans.hf_text_generate)."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from runtime_plans import hf_text_generate, make_plan

from liac.plan import dump_plan
from liac.runtime import cli
from liac.runtime.cli import main

GEN = 8
RUN = ("--emulate-gpu", "--dtype", "float32")  # the 'gpu' sublayers on the CPU; fp32, as the HF reference


@pytest.fixture(scope="module")
def setup(text_checkpoint, tmp_path_factory):
    """(checkpoint dir, HF model, tokenizer, plan file for batch 3, sweep dir with plans for batches 1, 2 and 4)."""
    directory, cfg, model, tokenizer = text_checkpoint
    root = tmp_path_factory.mktemp("runs")
    plan = root / "b3.yaml"
    dump_plan(make_plan(cfg, "partial", batch=3, prompt_len=16, gen_len=GEN), plan)
    sweep = root / "sweep"
    sweep.mkdir()
    points = []
    for batch in (1, 2, 4):
        name = f"tiny-text.b{batch}.yaml"
        dump_plan(make_plan(cfg, "cpu", batch=batch, prompt_len=16, gen_len=GEN), sweep / name)
        points.append({"file": name, "batch_size": batch, "prompt_len": 16, "gen_len": GEN})
    (sweep / "index.yaml").write_text(yaml.safe_dump({"apiVersion": "liac/v1", "kind": "OffloadPlanIndex",
                                                       "points": points}))
    return directory, model, tokenizer, plan, sweep


def _run(argv, capsys) -> tuple[int, str, str]:
    capsys.readouterr()
    status = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


PROMPTS = ["the cat", "birds sing in the", "a dog ran in"]


def test_one_prompt_streams_its_text(setup, capsys):
    directory, model, tokenizer, plan, _ = setup
    want, _ = hf_text_generate(model, tokenizer, ["the sun is"], GEN, eos=tokenizer.eos_token_id)
    status, out, err = _run([plan, "--weights", directory, "--prompt", "the sun is", *RUN], capsys)
    assert status == 0
    assert out == want[0] + "\n"  # the new text only, then a newline
    assert "tokens/s" in err and "prefill" in err


def test_a_batch_prints_each_sequence(setup, capsys, tmp_path):
    directory, model, tokenizer, plan, _ = setup
    eos = tokenizer.eos_token_id
    want, ids = hf_text_generate(model, tokenizer, PROMPTS, GEN, eos=eos)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n\n")  # blank lines are skipped
    status, out, _ = _run([plan, "--weights", directory, "--prompt-file", prompts, *RUN], capsys)
    assert status == 0
    # each as soon as it is done: those that stop at EOS in the order they stop, then the rest in prompt order
    done = [row.index(eos) if eos in row else GEN for row in ids.tolist()]
    order = sorted(range(len(PROMPTS)), key=lambda i: (done[i], i))
    assert out == "".join(f"[{i}] {want[i]}\n" for i in order)


def test_json_is_one_document(setup, capsys, tmp_path):
    directory, model, tokenizer, plan, _ = setup
    want, want_ids = hf_text_generate(model, tokenizer, PROMPTS, GEN)
    metrics = tmp_path / "m.json"
    argv = [plan, "--weights", directory, *RUN, "--json", "--ignore-eos", "--profile-steps", "1",
            "--metrics-out", metrics]
    for prompt in PROMPTS:
        argv += ["--prompt", prompt]
    status, out, err = _run(argv, capsys)
    assert status == 0
    doc = json.loads(out)  # stdout holds exactly one JSON document
    assert [o["text"] for o in doc["outputs"]] == want
    assert [o["token_ids"] for o in doc["outputs"]] == want_ids.tolist()
    assert [o["prompt"] for o in doc["outputs"]] == PROMPTS
    assert all(o["finish_reason"] == "length" and o["new_tokens"] == GEN for o in doc["outputs"])
    assert doc["metrics"]["run"]["batch_size"] == 3 and doc["metrics"]["sublayers"]
    assert doc["metrics"] == json.loads(metrics.read_text())
    assert "tokens/s" in err


def test_jsonl_is_one_line_per_sequence(setup, capsys):
    directory, model, tokenizer, plan, _ = setup
    want, _ = hf_text_generate(model, tokenizer, PROMPTS[:2], GEN, eos=tokenizer.eos_token_id)
    status, out, _ = _run([plan, "--weights", directory, *RUN, "--jsonl", "--prompt", PROMPTS[0],
                           "--prompt", PROMPTS[1]], capsys)
    assert status == 0
    rows = sorted((json.loads(line) for line in out.splitlines()), key=lambda r: r["index"])
    assert [r["text"] for r in rows] == want


def test_sampling_flags(setup, capsys):
    directory, _, _, plan, _ = setup
    base = [plan, "--weights", directory, *RUN, "--prompt", "the cat", "--ignore-eos"]
    argv = base + ["--temperature", "1.5", "--top-k", "20", "--top-p", "0.9", "--seed", "5"]
    first = _run(argv, capsys)
    assert first[0] == 0 and first[1] == _run(argv, capsys)[1]  # same seed, same text
    greedy = _run(base, capsys)[1]
    assert first[1] != greedy
    assert greedy == _run(base + ["--temperature", "0.0001", "--seed", "1"], capsys)[1]
    status, out, err = _run(base + ["--temperature", "-1"], capsys)
    assert status == 2 and out == "" and err.count("\n") == 1 and "--temperature: must be a number at least 0" in err


def test_plans_are_maxima(setup, capsys, tmp_path):
    directory, model, tokenizer, plan, _ = setup
    # a 2-token prompt may generate up to 16 + 8 - 2 = 22 tokens on a p16-g8 plan, more than its gen_len
    metrics = tmp_path / "m.json"
    status, out, _ = _run([plan, "--weights", directory, *RUN, "--prompt", "the", "--gen-len", "22",
                           "--ignore-eos", "--metrics-out", metrics, "--profile-steps", "0"], capsys)
    assert status == 0
    want, _ = hf_text_generate(model, tokenizer, ["the"], 22)
    assert out == want[0] + "\n"
    doc = json.loads(metrics.read_text())
    assert doc["run"]["gen_len"] == 22 and doc["predicted_for_request"]["gen_len"] == 22
    status, _, err = _run([plan, "--weights", directory, *RUN, "--prompt", "the", "--gen-len", "23"],
                          capsys)
    assert status == 2 and "--gen-len: new tokens must be between 1 and 22" in err


def test_sweep_directory_picks_the_smallest_batch_that_holds_the_request(setup, capsys):
    directory, model, tokenizer, _, sweep = setup
    want, _ = hf_text_generate(model, tokenizer, PROMPTS, GEN, eos=tokenizer.eos_token_id)
    argv = [sweep, "--weights", directory, *RUN, "--json"]
    for prompt in PROMPTS:
        argv += ["--prompt", prompt]
    status, out, err = _run(argv, capsys)
    assert status == 0 and "running tiny-text.b4.yaml" in err
    doc = json.loads(out)
    assert doc["plan_file"].endswith("tiny-text.b4.yaml") and doc["metrics"]["plan"].endswith("b4-p16-g8")
    assert [o["text"] for o in doc["outputs"]] == want
    status, _, err = _run([sweep / "index.yaml", "--random-weights", "0", "--prompt-len", "3", "--batch", "2"],
                          capsys)
    assert status == 0 and "running tiny-text.b2.yaml" in err
    status, out, err = _run([sweep, "--random-weights", "0", "--prompt-len", "3", "--batch", "5"], capsys)
    assert status == 2 and out == "" and err.count("\n") == 1
    assert "no plan of this sweep holds batch 5" in err and "planned batches are 1, 2, 4" in err


def test_text_input_errors(setup, capsys, tmp_path):
    directory, _, _, plan, _ = setup
    for argv, fragment in (
            ([plan, "--random-weights", "0", "--prompt", "hi"], "text prompts need --weights DIR"),
            ([plan, "--weights", directory, "--prompt-len", "3", "--chat"], "--chat: applies to text prompts"),
            ([plan, "--weights", directory, "--prompt-file", tmp_path / "none.txt"], "--prompt-file '" + str(tmp_path / "none.txt") + "': cannot read"),
            ([plan, "--weights", directory, "--prompt", "a", "--prompt", "b", "--batch", "3"],
             "--batch: must equal the 2 prompts"),
            ([plan, "--weights", directory, "--prompt", "the " * 20], "prompt length must be between 1 and 16")):
        status, out, err = _run(argv, capsys)
        assert status == 2 and out == "" and err.count("\n") == 1 and fragment in err, err


def test_interrupt_is_one_line_and_130(setup, capsys, monkeypatch, tmp_path):
    directory, _, _, plan, _ = setup

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    from liac.runtime.engine import Engine  # lia-run imports it inside main() (Ctrl-C while torch loads)

    monkeypatch.setattr(Engine, "generate", interrupted)
    metrics = tmp_path / "m.json"
    status, _, err = _run([plan, "--weights", directory, *RUN, "--prompt", "the",
                           "--metrics-out", metrics], capsys)
    assert status == 130 and err.strip().splitlines()[-1] == "lia-run: interrupted (nothing was written)"
    assert not metrics.exists()


def test_token_ids_of_different_lengths(setup, capsys, tmp_path):
    directory, model, _, plan, _ = setup
    ids = tmp_path / "ids.json"
    ids.write_text(json.dumps([[1, 40, 41, 42], [1, 50]]))
    status, out, _ = _run([plan, "--weights", directory, *RUN, "--prompt-ids", ids], capsys)
    assert status == 0
    import transformers

    config = transformers.GenerationConfig(max_new_tokens=GEN, do_sample=False, eos_token_id=None, pad_token_id=0,
                                           bos_token_id=None)
    padded = torch.tensor([[1, 40, 41, 42], [0, 0, 1, 50]])
    with torch.no_grad():
        want = model.generate(padded, attention_mask=(padded != 0).long(), generation_config=config)[:, 4:]
    assert out.splitlines() == [f"tokens[{i}]: " + " ".join(map(str, row)) for i, row in enumerate(want.tolist())]


def test_docs_cli_lists_every_lia_run_flag():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text()
    section = text[text.index("## lia-run"):]
    section = section[:section.find("\n## ", 1)] if "\n## " in section[1:] else section
    flags = {option for action in cli.build_parser()._actions for option in action.option_strings
             if option.startswith("--") and option != "--help"}
    missing = sorted(flag for flag in flags if f"`{flag}" not in section)
    assert not missing, f"docs/cli.md (## lia-run) must list {missing}"


def test_weights_by_repo_id_from_the_hf_cache(setup, capsys, tmp_path, monkeypatch):
    import shutil

    from huggingface_hub import constants

    directory, model, tokenizer, plan, _ = setup
    cache = tmp_path / "hub"  # laid out as huggingface_hub lays out a downloaded repo
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = cache / "models--acme--tiny-text"
    shutil.copytree(directory, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    want, _ = hf_text_generate(model, tokenizer, ["the sun is"], GEN, eos=tokenizer.eos_token_id)
    status, out, err = _run([plan, "--weights", "acme/tiny-text", "--prompt", "the sun is", *RUN], capsys)
    assert status == 0, err
    assert out == want[0] + "\n"
    status, out, err = _run([plan, "--weights", "acme/absent", "--prompt", "the sun is", *RUN], capsys)
    assert status == 2 and out == "" and err.count("\n") == 1 and "acme/absent" in err
