"""Fuzz liac's command lines with mutated inputs; tally what every case ended in (issue 13).

    .venv/bin/python bench/fuzz.py                     # 10,000 cases → bench/results/fuzz.json
    .venv/bin/python bench/fuzz.py --cases 200 --out /tmp/fuzz.json --workers 1

Each case takes a valid seed file (a compiled plan, a hardware profile, a model config.json, a safetensors
checkpoint and its index, a sweep directory's index.yaml / sweeps.yaml, a text-prompt file for a checkpoint with
a tokenizer, a sweep directory given to `lia-run` as its plan) or a valid command line, mutates it
(drop a field, retype a value, scale a number, NaN/inf, huge integers, path-like strings, YAML aliases, deep
nesting, truncated or flipped bytes), and runs one command on it in a fresh sandbox: `liac compile | validate |
explain | diff | docs | inspect` or `lia-run` (CPU-emulated GPU, seeded random or checkpoint weights).

The commands run in process (their `main()`), in worker processes that keep torch and the traced models loaded,
so a case costs milliseconds to a second; the parent enforces a timeout per case by killing the worker. Each case
is judged:

- exit status 0, 1, 2, 3 or 130 (the CLI convention); for 2, the error is one line on stderr;
- traceback: any exception escaping `main()` other than SystemExit;
- hang: the case ran past `--timeout` seconds;
- write outside -o: any file created, changed or removed in the sandbox outside the outputs the command line
  names (or a temporary left beside them).

The tally (cases, outcomes per target, and every traceback, hang and outside write with its case seed, which
`--replay SEED` runs again) is written to the result file. Goal: zero tracebacks, hangs and outside writes.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import multiprocessing
import os
import random
import re
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Case", "TARGETS", "build_seeds", "make_case", "run_case", "mutate_doc", "mutate_text", "main"]

REPO = Path(__file__).resolve().parents[1]
DEPTH = ("a", "b", "c", "d", "e", "f", "g", "h")  # the sandbox sits 8 levels down: '../' escapes stay inside it
OUTPUT_FLAGS = ("-o", "--output", "--out", "--metrics-out", "--plan-format", "--report")
TINY_OPT = {"model_type": "opt", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
            "ffn_dim": 128, "vocab_size": 96, "max_position_embeddings": 64, "do_layer_norm_before": True,
            "word_embed_proj_dim": 64, "activation_function": "relu", "enable_bias": True,
            "tie_word_embeddings": True}
TINY_LLAMA = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
              "num_hidden_layers": 2, "intermediate_size": 96, "vocab_size": 96, "max_position_embeddings": 64,
              "rope_theta": 10000.0, "rms_norm_eps": 1e-5, "hidden_act": "silu", "tie_word_embeddings": False}
WORKLOAD = ["--batch", "1,2", "--prompt-len", "8", "--gen-len", "3", "--gpu-mem", "4MiB"]


# ---------------------------------------------------------------------------------------------------------------
# Mutations


def _path_like(rng: random.Random, sandbox: Path) -> str:
    return rng.choice(["../" * rng.randint(1, 6) + "escaped", "/../../escaped", f"{sandbox}/abs/escaped",
                       "a/b/../../../c", ".", "..", "", "~/x", "nested/dir/name", "x\\..\\y", "-o",
                       "name\nwith\nlines", "ü" * 50, "x" * rng.choice([255, 300, 5000])])


def _scalar(rng: random.Random, sandbox: Path):
    return rng.choice([
        lambda: float("nan"), lambda: float("inf"), lambda: -float("inf"), lambda: 0, lambda: -1, lambda: 1,
        lambda: 2**63, lambda: 10**30, lambda: -(2**31), lambda: 1e-300, lambda: 1e300, lambda: 0.5,
        lambda: True, lambda: None, lambda: "", lambda: "x", lambda: "12", lambda: "nan", lambda: [], lambda: {},
        lambda: [[[]]], lambda: {"k": "v"}, lambda: _path_like(rng, sandbox), lambda: "y" * 100_000,
    ])()


def _nodes(doc):
    """(path, node) of every node, depth first (iteratively: a mutated tree may be deep)."""
    stack = [((), doc)]
    while stack:
        path, node = stack.pop()
        yield path, node
        if isinstance(node, dict):
            stack.extend((path + (key,), value) for key, value in reversed(list(node.items())))
        elif isinstance(node, list):
            stack.extend((path + (index,), value) for index, value in reversed(list(enumerate(node))))


def _set(doc, path, value):
    if not path:
        return value
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    return doc


def mutate_doc(doc, rng: random.Random, sandbox: Path, edits: int = 0):
    """Parsed YAML/JSON → the same tree with 1-3 edits at random nodes."""
    for _ in range(edits or rng.choice([1, 1, 1, 2, 3])):
        nodes = list(_nodes(doc))
        path, value = rng.choice(nodes)
        kind = rng.random()
        if kind < 0.15 and path:  # drop the node
            parent = doc
            for key in path[:-1]:
                parent = parent[key]
            if isinstance(parent, dict):
                parent.pop(path[-1], None)
            else:
                parent.pop(path[-1])
        elif kind < 0.3 and isinstance(value, (int, float)) and not isinstance(value, bool):  # scale
            factor = rng.choice([0, -1, 0.5, 2, 10, 1000, 1e9, 1e-9, 1e30])
            try:
                scaled = value * factor
            except OverflowError:
                scaled = float("inf")
            doc = _set(doc, path, type(value)(scaled) if isinstance(value, int) and math.isfinite(scaled)
                       and abs(scaled) < 2**200 else scaled)
        elif kind < 0.4 and isinstance(value, dict):  # an unknown key
            value[rng.choice(["extra", "__proto__", "name", "apiVersion", "../x"])] = _scalar(rng, sandbox)
        elif kind < 0.5 and isinstance(value, list) and value:  # duplicate or empty a list
            if rng.random() < 0.5:
                value.append(value[rng.randrange(len(value))])
            else:
                value.clear()
        elif kind < 0.55:  # deep nesting
            deep = x = []
            for _ in range(rng.choice([50, 300])):  # deeper still: mutate_text's '[' * 100000
                x.append([])
                x = x[0]
            doc = _set(doc, path, deep)
        else:  # retype / replace with a hostile scalar
            doc = _set(doc, path, _scalar(rng, sandbox))
    return doc


def mutate_text(text: str, rng: random.Random) -> str:
    """Text-level edits the parsed tree cannot express: aliases, duplicate keys, truncation, junk."""
    kind = rng.random()
    lines = text.splitlines(keepends=True) or [""]
    if kind < 0.3:  # an alias bomb or a plain alias on some line
        bomb = "".join(f"z{n}: &z{n} [" + ", ".join([f"*z{n - 1}" if n else "x"] * 10) + "]\n" for n in range(9))
        index = rng.randrange(len(lines) + 1)
        return "".join(lines[:index]) + (bomb if rng.random() < 0.5 else "q: &q 1\nr: *q\n") + "".join(lines[index:])
    if kind < 0.45:  # duplicate a line (duplicate keys)
        index = rng.randrange(len(lines))
        return "".join(lines[:index + 1] + [lines[index]] + lines[index + 1:])
    if kind < 0.6:  # truncate
        return text[:rng.randrange(len(text) + 1)]
    if kind < 0.7:  # tabs, control characters, a BOM
        index = rng.randrange(len(text) + 1)
        junk = ["\t", "\x00", "\ufeff", "\x1b[2J", ": : :", "- [", "{", "[" * 100_000, "!!python/object:os.system x"]
        return text[:index] + rng.choice(junk) + text[index:]
    if kind < 0.8:  # a tag liac's loader must refuse
        return "!!python/object/apply:os.system ['true']\n" + text
    if kind < 0.9:
        return text * rng.choice([2, 50])
    return ""


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    kind = rng.random()
    if kind < 0.3:
        return data[:rng.randrange(len(data) + 1)]
    if kind < 0.6:
        out = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            if out:
                out[rng.randrange(len(out))] = rng.randrange(256)
        return bytes(out)
    if kind < 0.8:  # a header length that lies
        return rng.choice([0, 7, 2**63, 2**40, len(data)]).to_bytes(8, "little") + data[8:]
    return os.urandom(rng.randrange(64))


# ---------------------------------------------------------------------------------------------------------------
# Seeds


def build_seeds(directory: Path) -> dict[str, Path]:
    """Valid inputs, made once per worker: configs, a plan per model, a profile, a sweep, a checkpoint."""
    import yaml

    from liac.cli import main as liac_main

    directory.mkdir(parents=True, exist_ok=True)
    seeds = {}
    for name, cfg in (("opt", TINY_OPT), ("llama", TINY_LLAMA)):
        folder = directory / f"tiny-{name}"
        folder.mkdir(exist_ok=True)
        (folder / "config.json").write_text(json.dumps(cfg))
        seeds[f"model-{name}"] = folder
        sweep = directory / f"sweep-{name}"
        with contextlib.redirect_stdout(io.StringIO()):
            code = liac_main(["compile", "--model", str(folder), "--hw", "spr-h100", *WORKLOAD, "-o", str(sweep)])
        assert code == 0, f"seed compile failed for {name}"
        seeds[f"sweep-{name}"] = sweep
        seeds[f"plan-{name}"] = sorted(p for p in sweep.glob("*.yaml") if p.name != "index.yaml")[0]
    profile = directory / "hw.yaml"
    profile.write_text((REPO / "liac" / "profiles" / "spr-h100.yaml").read_text())
    seeds["profile"] = profile
    catalog = directory / "sweeps.yaml"
    catalog.write_text(yaml.safe_dump({"kind": "SweepCatalog", "sweeps": [
        {"model": "tiny-opt", "hardware": "spr-h100", "directory": "sweep-opt", "plans": 2, "infeasible_batches": []},
        {"model": "other", "hardware": "spr-h100", "reason": "none fits"}]}))
    seeds["catalog"] = catalog
    seeds["ckpt"] = _checkpoint(directory / "ckpt", TINY_OPT)
    seeds.update(_text_seeds(directory, liac_main))
    return seeds


def _text_seeds(directory: Path, liac_main) -> dict[str, Path]:
    """A checkpoint with a tokenizer (liac.tiny's, trained for one step: only the files matter) and its sweep."""
    from liac.tiny import make_tiny_checkpoint

    ckpt = make_tiny_checkpoint(directory / "tiny-text", steps=1, hidden_size=32)
    sweep = directory / "sweep-text"
    with contextlib.redirect_stdout(io.StringIO()):
        code = liac_main(["compile", "--model", str(ckpt), "--hw", "spr-h100", "--batch", "1,2", "--prompt-len", "16",
                          "--gen-len", "3", "--gpu-mem", "4MiB", "-o", str(sweep)])
    assert code == 0, "seed compile failed for the text checkpoint"
    prompts = directory / "prompts.txt"
    prompts.write_text("The GPU is\nThe plan says\n")
    return {"ckpt-text": ckpt, "sweep-text": sweep, "prompts": prompts}


def _checkpoint(folder: Path, config: dict) -> Path:
    """A tiny sharded HF-layout checkpoint of the OPT seed model: config.json, an index, two safetensors shards
    under the HF tensor names (liac.models.opt.hf_weight_names), seeded random values."""
    import torch
    from safetensors.torch import save_file

    from liac.models import build_model, family_module
    from liac.models.config import from_hf_config

    cfg = from_hf_config(config, name="tiny-opt")
    with torch.device("meta"):
        shapes = {name: tuple(p.shape) for name, p in build_model(cfg).named_parameters()}
    generator = torch.Generator().manual_seed(0)
    tensors = {}
    for canonical, names in family_module(cfg.family).hf_weight_names(cfg).items():
        rows, *tail = shapes[canonical]
        for name in names:  # stacked along dim 0 in equal parts (OPT's q, k, v)
            tensors[name] = torch.randn((rows // len(names), *tail), generator=generator) * 0.02
    folder.mkdir(parents=True, exist_ok=True)
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    for shard, members in shards.items():
        save_file({name: tensors[name] for name in members}, folder / shard, metadata={"format": "pt"})
    weight_map = {name: shard for shard, members in shards.items() for name in members}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (folder / "config.json").write_text(json.dumps(config))
    return folder


# ---------------------------------------------------------------------------------------------------------------
# Cases


@dataclass
class Case:
    """One run: `files` to lay out in the sandbox (relative path → bytes), then `program argv` in `work/`."""

    seed: int
    target: str
    program: str  # 'liac' or 'lia-run'
    argv: list[str]
    files: dict[str, bytes] = field(default_factory=dict)
    copies: dict[str, str] = field(default_factory=dict)  # sandbox path → seed path (a directory copied whole)
    fifos: list[str] = field(default_factory=list)  # sandbox paths made named pipes (a read must not block)


def _yaml(doc) -> bytes:
    import yaml

    try:
        return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True).encode("utf-8", "surrogatepass")
    except RecursionError:  # too deep for the dumper: the same depth as text
        return b"a: " + b"[" * 5000 + b"]" * 5000 + b"\n"


def _load(path: Path):
    import yaml

    return yaml.safe_load(path.read_text())


def _mutated_yaml(path: Path, rng: random.Random, sandbox: Path) -> bytes:
    if rng.random() < 0.25:
        return mutate_text(path.read_text(), rng).encode("utf-8", "surrogatepass")
    return _yaml(mutate_doc(_load(path), rng, sandbox))


def _rehash(doc) -> None:
    """Keep spec.model.config_sha256 equal to the hash of the (mutated) config, as a careful hand-editor would."""
    import hashlib

    try:
        config = doc["spec"]["model"]["config"]
        body = {k: v for k, v in config.items() if k != "name"}
        doc["spec"]["model"]["config_sha256"] = hashlib.sha256(
            json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    except (KeyError, TypeError, AttributeError, ValueError):
        pass


def _plan_case(rng, seeds, sandbox, seed) -> Case:
    family = rng.choice(["opt", "llama"])
    plan = seeds[f"plan-{family}"]
    if rng.random() < 0.3:  # mutate the model config, re-hashed (item 7)
        doc = _load(plan)
        doc["spec"]["model"]["config"] = mutate_doc(doc["spec"]["model"]["config"], rng, sandbox)
        _rehash(doc)
        data = _yaml(doc)
    else:
        data = _mutated_yaml(plan, rng, sandbox)
    command = rng.choice(["validate", "explain", "diff", "lia-run", "lia-run"])
    files = {"in/plan.yaml": data}
    if command == "lia-run":
        argv = ["../in/plan.yaml", "--random-weights", str(rng.randrange(3)), "--emulate-gpu", "--profile-steps",
                rng.choice(["0", "1"]), "--metrics-out", "out/metrics.json"]
        return Case(seed, "plan:lia-run", "lia-run", argv, files)
    argv = {"validate": ["validate", "../in/plan.yaml"], "explain": ["explain", "../in/plan.yaml"],
            "diff": ["diff", "../in/plan.yaml", str(plan)]}[command]
    return Case(seed, f"plan:{command}", "liac", argv, files)


def _profile_case(rng, seeds, sandbox, seed) -> Case:
    data = _mutated_yaml(seeds["profile"], rng, sandbox)
    files = {"in/hw.yaml": data}
    if rng.random() < 0.2:
        return Case(seed, "profile:explain", "liac", ["explain", str(seeds["plan-opt"]), "--hw", "../in/hw.yaml"],
                    files)
    argv = ["compile", "--model", str(seeds["model-opt"]), "--hw", "../in/hw.yaml", *WORKLOAD, "-o", "out/sweep"]
    return Case(seed, "profile:compile", "liac", argv, files)


def _config_case(rng, seeds, sandbox, seed) -> Case:
    family = rng.choice(["opt", "llama"])
    config = json.loads((seeds[f"model-{family}"] / "config.json").read_text())
    if rng.random() < 0.2:
        text = mutate_text(json.dumps(config, indent=1), rng)
    else:
        config = mutate_doc(config, rng, sandbox)
        try:
            text = json.dumps(config)
        except (ValueError, RecursionError):
            text = "{"
    files = {"in/model/config.json": text.encode("utf-8", "surrogatepass")}
    if rng.random() < 0.3:
        return Case(seed, "config:inspect", "liac", ["inspect", "--model", "../in/model"], files)
    argv = ["compile", "--model", "../in/model", "--hw", "spr-h100", *WORKLOAD, "-o", "out/sweep"]
    return Case(seed, "config:compile", "liac", argv, files)


def _checkpoint_case(rng, seeds, sandbox, seed) -> Case:
    ckpt = seeds["ckpt"]
    files = {}
    index = ckpt / "model.safetensors.index.json"
    shards = sorted(ckpt.glob("*.safetensors"))
    kind = rng.random()
    if kind < 0.35:  # the index
        doc = json.loads(index.read_text())
        if rng.random() < 0.5:
            tensor = rng.choice(sorted(doc["weight_map"]))
            doc["weight_map"][tensor] = _path_like(rng, sandbox) if rng.random() < 0.7 else _scalar(rng, sandbox)
        else:
            doc = mutate_doc(doc, rng, sandbox)
        try:
            files["in/ckpt/model.safetensors.index.json"] = json.dumps(doc).encode()
        except (ValueError, RecursionError):
            files["in/ckpt/model.safetensors.index.json"] = b"{"
    elif kind < 0.7:  # a shard's JSON header
        shard = rng.choice(shards)
        data = shard.read_bytes()
        length = int.from_bytes(data[:8], "little")
        header = mutate_doc(json.loads(data[8:8 + length]), rng, sandbox)
        try:
            raw = json.dumps(header).encode()
        except (ValueError, RecursionError):
            raw = b"{"
        files[f"in/ckpt/{shard.name}"] = len(raw).to_bytes(8, "little") + raw + data[8 + length:]
    elif kind < 0.85:  # a shard's bytes
        shard = rng.choice(shards)
        files[f"in/ckpt/{shard.name}"] = mutate_bytes(shard.read_bytes(), rng)
    else:  # config.json
        files["in/ckpt/config.json"] = json.dumps(mutate_doc(dict(TINY_OPT), rng, sandbox),
                                                  default=str).encode()
    argv = [str(seeds["plan-opt"]), "--weights", "../in/ckpt", "--emulate-gpu", "--profile-steps", "0",
            "--metrics-out", "out/m.json"]
    return Case(seed, "checkpoint:lia-run", "lia-run", argv, files, copies={"in/ckpt": str(ckpt)})


def _sweep_case(rng, seeds, sandbox, seed) -> Case:
    sweep = seeds["sweep-opt"]
    files = {}
    which = rng.random()
    if which < 0.5:
        files["in/plans/sweep-opt/index.yaml"] = _mutated_yaml(sweep / "index.yaml", rng, sandbox)
    elif which < 0.8:
        files["in/plans/sweeps.yaml"] = _mutated_yaml(seeds["catalog"], rng, sandbox)
    else:
        plan = sorted(p for p in sweep.glob("*.yaml") if p.name != "index.yaml")[0]
        files[f"in/plans/sweep-opt/{plan.name}"] = _mutated_yaml(plan, rng, sandbox)
    if "in/plans/sweeps.yaml" not in files:
        files["in/plans/sweeps.yaml"] = seeds["catalog"].read_bytes()
    copies = {"in/plans/sweep-opt": str(sweep)}
    if rng.random() < 0.5:
        return Case(seed, "sweep:validate", "liac", ["validate", "../in/plans"], files, copies)
    return Case(seed, "sweep:docs", "liac", ["docs", "../in/plans", "-o", "out/docs"], files, copies)


def _text_case(rng, seeds, sandbox, seed) -> Case:
    """lia-run --prompt-file FILE (mutated text, bytes that are not UTF-8, a directory, a missing or path-like
    name, a FIFO) over a checkpoint with a tokenizer; sometimes --chat, sampling flags or --jsonl."""
    files, argv_file = {}, "../in/prompts.txt"
    kind = rng.random()
    text = seeds["prompts"].read_text()
    if kind < 0.4:
        files["in/prompts.txt"] = mutate_text(text, rng).encode("utf-8", "surrogatepass")
    elif kind < 0.6:
        files["in/prompts.txt"] = mutate_bytes(text.encode(), rng)
    elif kind < 0.7:
        files["in/prompts.txt/x"] = b"a directory"
    elif kind < 0.8:
        files["in/prompts.txt"] = ("the " * rng.choice([20, 2000]) + "\n").encode() * rng.choice([1, 3, 300])
    elif kind < 0.9:
        argv_file = rng.choice([_path_like(rng, sandbox), "../in/none.txt", "/dev/zero", "/proc/self/mem",
                                "../in/fifo"])
    else:
        files["in/prompts.txt"] = text.encode()
    argv = [str(seeds["sweep-text"]), "--weights", str(seeds["ckpt-text"]), "--emulate-gpu", "--profile-steps", "0",
            "--gen-len", "2", "--prompt-file", argv_file]
    for flag, values in (("--chat", None), ("--temperature", ["0.7", "nan", "-1"]), ("--top-k", ["5", "-2"]),
                         ("--jsonl", None), ("--batch", ["1", "2", "3"]), ("--metrics-out", ["out/m.json"])):
        if rng.random() < 0.2:
            argv += [flag] if values is None else [flag, rng.choice(values)]
    return Case(seed, "text:lia-run", "lia-run", argv, files, fifos=["in/fifo"] if argv_file == "../in/fifo" else [])


def _sweep_run_case(rng, seeds, sandbox, seed) -> Case:
    """lia-run DIR with the sweep's index.yaml (or one of its plans) mutated: names must stay in the directory."""
    sweep = seeds["sweep-opt"]
    files = {}
    if rng.random() < 0.8:
        doc = _load(sweep / "index.yaml")
        if rng.random() < 0.4 and doc.get("points"):
            point = rng.choice(doc["points"])
            point["file"] = rng.choice([_path_like(rng, sandbox), str(seeds["plan-opt"]), "../plans/x.yaml",
                                        "index.yaml", "sub/x.yaml", _scalar(rng, sandbox)])
            data = _yaml(doc)
        elif rng.random() < 0.3:
            data = mutate_text((sweep / "index.yaml").read_text(), rng).encode("utf-8", "surrogatepass")
        else:
            data = _yaml(mutate_doc(doc, rng, sandbox))
        files["in/sweep/index.yaml"] = data
    else:
        plan = sorted(p for p in sweep.glob("*.yaml") if p.name != "index.yaml")[0]
        files[f"in/sweep/{plan.name}"] = _mutated_yaml(plan, rng, sandbox)
    target = rng.choice(["../in/sweep", "../in/sweep/index.yaml"])
    argv = [target, "--random-weights", "0", "--emulate-gpu", "--profile-steps", "0", "--gen-len", "2",
            "--batch", rng.choice(["1", "2", "3"])]
    return Case(seed, "sweep:lia-run", "lia-run", argv, files, copies={"in/sweep": str(sweep)})


def _argv_case(rng, seeds, sandbox, seed) -> Case:
    bases = [
        ("liac", ["compile", "--model", str(seeds["model-opt"]), "--hw", "spr-h100", *WORKLOAD, "-o", "out/sweep"]),
        ("liac", ["compile", "--model", "opt-30b", "--hw", "h200-amx16", "--batch", "1", "-o", "out/plan.yaml"]),
        ("liac", ["validate", str(seeds["plan-opt"])]),
        ("liac", ["explain", str(seeds["plan-llama"]), "--format", "json"]),
        ("liac", ["inspect", "--model", "opt-1.3b", "--batch", "4", "--prompt-len", "16"]),
        ("liac", ["docs", str(seeds["sweep-opt"]), "-o", "out/docs", "--plan-format", "out/format.md"]),
        ("liac", ["diff", str(seeds["plan-opt"]), str(seeds["plan-opt"])]),
        ("lia-run", [str(seeds["plan-opt"]), "--random-weights", "1", "--emulate-gpu", "--profile-steps", "0",
                     "--metrics-out", "out/m.json"]),
        ("lia-run", [str(seeds["sweep-text"]), "--weights", str(seeds["ckpt-text"]), "--emulate-gpu",
                     "--profile-steps", "0", "--gen-len", "2", "--prompt", "The GPU is"]),
        ("lia-run", [str(seeds["plan-opt"]), "--weights", "facebook/opt-125m", "--emulate-gpu"]),  # offline
    ]
    program, argv = rng.choice(bases)
    argv = list(argv)
    values = ["nan", "inf", "-1", "0", "1e9", "99999999999999999999", "1..99999999999", "1,,2", "1TiB", "24 GiB",
              "-5GiB", "0x10", "", " ", "--", "-o", "1.5", "١٢", "NaN..inf", "8..4", "3..16", "lia-gpu/whole",
              "../../../x", "/", ".", "out", "out/x.yaml", "x" * 5000, "facebook/opt-125m", "org/../x", "a/b/c",
              "org/name.json", "--weights", "--prompt-file", "/dev/zero", "--chat", "--top-p", "--temperature"]
    for _ in range(rng.choice([1, 1, 2, 3])):
        kind = rng.random()
        if kind < 0.5 and len(argv) > 1:  # replace a value
            index = rng.randrange(1, len(argv))
            argv[index] = rng.choice(values + [_path_like(rng, sandbox)])
        elif kind < 0.7:  # add a flag with a value
            flag = rng.choice(["--batch", "--prompt-len", "--gen-len", "--gpu-mem", "--cpu-mem", "--cxl-mem",
                               "--prefetch-depth", "--policy", "--solver", "--objective", "--hw", "--format",
                               "--random-weights", "--profile-steps", "--batch", "-o", "--metrics-out"])
            argv += [flag, rng.choice(values)]
        elif kind < 0.85 and argv:  # drop an argument
            argv.pop(rng.randrange(len(argv)))
        else:
            argv.insert(rng.randrange(len(argv) + 1), rng.choice(values))
    return Case(seed, f"argv:{program}", program, argv)


TARGETS = {"plan": (_plan_case, 0.26), "profile": (_profile_case, 0.15), "config": (_config_case, 0.12),
           "checkpoint": (_checkpoint_case, 0.11), "sweep": (_sweep_case, 0.09), "argv": (_argv_case, 0.15),
           "text": (_text_case, 0.06), "sweep-run": (_sweep_run_case, 0.06)}


def make_case(seed: int, seeds: dict[str, Path], sandbox: Path, target: str | None = None,
              targets: tuple[str, ...] | None = None) -> Case:
    """The case of `seed` (deterministic: `--replay SEED [--targets ...]` reruns it), of `target`, or drawn from
    `targets` (default: all) by their weights."""
    rng = random.Random(seed)
    names = list(targets or TARGETS)
    target = target or rng.choices(names, weights=[TARGETS[n][1] for n in names])[0]
    return TARGETS[target][0](rng, seeds, sandbox, seed)


# ---------------------------------------------------------------------------------------------------------------
# Running one case


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            try:
                info = path.lstat()
            except OSError:
                continue
            out[str(path.relative_to(root))] = (info.st_size, info.st_mtime_ns) if not path.is_dir() else (-1, 0)
    return out


def _allowed(argv: list[str], work: Path, sandbox: Path) -> list[str]:
    """Sandbox-relative prefixes the command line names as outputs (a write there is what the user asked for)."""
    prefixes = []
    for index, arg in enumerate(argv[:-1]):
        if arg in OUTPUT_FLAGS:
            target = Path(os.path.normpath(work / argv[index + 1]))
            try:
                prefixes.append(str(target.relative_to(sandbox)))
            except ValueError:
                pass
    return prefixes


def _outside(before, after, allowed: list[str]) -> list[str]:
    changed = sorted(name for name in set(before) | set(after) if before.get(name) != after.get(name))
    out = []
    for name in changed:
        path = Path(name)
        inside = False
        for prefix in allowed:
            base = Path(prefix)
            if path == base or base in path.parents:
                inside = True
            # the parent directories -o creates on the way are part of writing it
            elif path in base.parents and name in after and after[name][0] == -1:
                inside = True
        if not inside:
            out.append(name)
    return out


DEVICES = ("/dev/zero", "/dev/null")  # outputs a command line may name outside the sandbox: never replaced


def _mode(path: str) -> int | None:
    try:
        return os.stat(path).st_mode
    except OSError:
        return None


_SWEEP_CHOICE = re.compile(r"lia-run: sweep .*: running \S+ \(the smallest planned batch that holds batch \d+\)$")


def run_case(case: Case, sandbox: Path) -> dict:
    """Lay out the case in `sandbox` (wiped first), run it in process, judge it."""
    from liac.cli import main as liac_main
    from liac.runtime.cli import main as lia_run_main

    shutil.rmtree(sandbox, ignore_errors=True)
    work = sandbox / "work"
    work.mkdir(parents=True)
    (sandbox / "abs").mkdir()
    for target, source in case.copies.items():
        shutil.copytree(source, sandbox / target)
    for relative, data in case.files.items():
        path = sandbox / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    for relative in case.fifos:
        (sandbox / relative).parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(sandbox / relative)
    before = _snapshot(sandbox)
    devices = {device: _mode(device) for device in DEVICES}
    stdout, stderr = io.StringIO(), io.StringIO()
    result = {"seed": case.seed, "target": case.target}
    cwd = os.getcwd()
    os.chdir(work)
    began = time.perf_counter()
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            main = liac_main if case.program == "liac" else lia_run_main
            try:
                code = main(list(case.argv))
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
        result["code"] = int(code)
    except BaseException as e:  # noqa: BLE001 - a traceback is the finding
        frames = traceback.extract_tb(e.__traceback__)
        where = next((f"{Path(f.filename).name}:{f.lineno}" for f in reversed(frames)
                      if "/liac/" in f.filename or "/passes/" in f.filename or "/runtime/" in f.filename),
                     f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else "?")
        result["code"] = None
        result["traceback"] = f"{type(e).__name__} at {where}: {str(e)[:200]}"
    finally:
        os.chdir(cwd)
    result["seconds"] = round(time.perf_counter() - began, 3)
    # what stderr says besides an error: progress bars, and the plan lia-run chose from a sweep
    err = [line for line in stderr.getvalue().splitlines()
           if line.strip() and "% (" not in line and not _SWEEP_CHOICE.match(line)]
    result["stderr_lines"] = len(err)
    result["first_error"] = err[-1][:300] if err else ""
    if "Traceback (most recent call last)" in stderr.getvalue():
        result["traceback"] = result.get("traceback") or "printed a traceback: " + stderr.getvalue()[-300:]
    outside = _outside(before, _snapshot(sandbox), _allowed(case.argv, work, sandbox))
    outside += [device for device, mode in devices.items() if _mode(device) != mode]  # '-o /dev/zero' as root
    if outside:
        result["outside"] = outside[:10]
    return result


# ---------------------------------------------------------------------------------------------------------------
# Workers and the tally


def _sandbox(root: Path) -> Path:
    return root.joinpath(*DEPTH, "case")


def _worker(connection, root: str, memory_gib: float) -> None:
    import resource

    limit = int(memory_gib * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))  # a runaway allocation fails here, not the machine
    os.environ.setdefault("MPLBACKEND", "Agg")
    root_path = Path(root)
    # A command line that lost its --hw plans for this host: give the workers a host profile of their own (the
    # spr-h100 numbers) in a cache directory of their own, so no case probes the machine or writes to ~/.cache.
    cache = root_path / "cache"
    (cache / "liac").mkdir(parents=True, exist_ok=True)
    (cache / "liac" / "host.yaml").write_text(
        (REPO / "liac" / "profiles" / "spr-h100.yaml").read_text().replace("name: spr-h100\n", "name: host\n"))
    os.environ["XDG_CACHE_HOME"] = str(cache)
    os.environ["HF_HUB_OFFLINE"] = "1"  # a mutated --model that looks like a repo id must not reach the network
    import torch  # noqa: F401 - loaded once per worker

    torch.set_num_threads(1)
    seeds = build_seeds(root_path / "seeds")
    connection.send("ready")
    while True:
        message = connection.recv()
        if message is None:
            return
        seed, target, targets = message
        sandbox = _sandbox(root_path)
        try:
            result = run_case(make_case(seed, seeds, sandbox, target, targets), sandbox)
        except BaseException as e:  # noqa: BLE001 - the harness itself failed on this case
            result = {"seed": seed, "target": target or "?", "code": None,
                      "traceback": f"harness: {type(e).__name__}: {str(e)[:200]}"}
        connection.send(result)


class _Pool:
    def __init__(self, workers: int, root: Path, memory_gib: float, timeout: float):
        self.root, self.memory_gib, self.timeout = root, memory_gib, timeout
        self.context = multiprocessing.get_context("spawn")
        self.slots = [self._start(index) for index in range(workers)]

    def _start(self, index: int):
        parent, child = self.context.Pipe()
        process = self.context.Process(target=_worker, args=(child, str(self.root / f"w{index}"), self.memory_gib),
                                       daemon=True)
        process.start()
        if not parent.poll(600) or parent.recv() != "ready":
            raise RuntimeError("a fuzz worker did not start")
        return {"process": process, "connection": parent, "job": None, "began": 0.0, "index": index}

    def run(self, jobs, record) -> None:
        jobs = list(jobs)
        pending = 0
        while jobs or pending:
            for slot in self.slots:
                if slot["job"] is None and jobs:
                    slot["job"] = jobs.pop(0)
                    slot["began"] = time.monotonic()
                    slot["connection"].send(slot["job"])
                    pending += 1
            time.sleep(0.002)
            for position, slot in enumerate(self.slots):
                if slot["job"] is None:
                    continue
                if slot["connection"].poll():
                    try:
                        record(slot["connection"].recv())
                    except EOFError:  # the worker died (killed by the memory limit's fallout, or a crash)
                        record({"seed": slot["job"][0], "target": slot["job"][1] or "?", "code": None,
                                "traceback": "worker died"})
                        self._replace(position)
                    slot = self.slots[position]
                    slot["job"] = None
                    pending -= 1
                elif time.monotonic() - slot["began"] > self.timeout:
                    record({"seed": slot["job"][0], "target": slot["job"][1] or "?", "code": None, "hang": True,
                            "seconds": self.timeout})
                    self._replace(position)
                    pending -= 1

    def _replace(self, position: int) -> None:
        slot = self.slots[position]
        slot["process"].kill()
        slot["process"].join()
        self.slots[position] = self._start(slot["index"])

    def close(self) -> None:
        for slot in self.slots:
            with contextlib.suppress(Exception):
                slot["connection"].send(None)
            slot["process"].join(5)
            if slot["process"].is_alive():
                slot["process"].kill()


def _judge(result: dict) -> str:
    if result.get("hang"):
        return "hang"
    if result.get("traceback"):
        return "traceback"
    if result.get("outside"):
        return "write outside -o"
    code = result.get("code")
    if code == 2:
        return "exit 2, one line" if result.get("stderr_lines", 0) <= 1 else "exit 2, several lines"
    return f"exit {code}" if code in (0, 1, 3, 130) else f"exit {code} (outside the convention)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=13, help="first case seed (cases are seed, seed+1, ...)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per case before it counts as a hang")
    parser.add_argument("--memory-gib", type=float, default=12.0, help="address-space limit per worker")
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "fuzz.json"))
    parser.add_argument("--replay", type=int, help="run one case seed in this process and print its result")
    parser.add_argument("--targets", help=f"comma-separated targets to draw from (default: all of {', '.join(TARGETS)})")
    args = parser.parse_args(argv)
    targets = tuple(args.targets.split(",")) if args.targets else None
    if targets and not set(targets) <= set(TARGETS):
        parser.error(f"--targets: unknown {sorted(set(targets) - set(TARGETS))}")
    root = Path(tempfile.mkdtemp(prefix="liac-fuzz-"))
    try:
        if args.replay is not None:
            seeds = build_seeds(root / "seeds")
            case = make_case(args.replay, seeds, _sandbox(root), None, targets)
            print(json.dumps({"argv": case.argv, "files": sorted(case.files)}, indent=1))
            print(json.dumps(run_case(case, _sandbox(root)), indent=1))
            return 0
        tally: dict[str, dict[str, int]] = {}
        findings: dict[str, list] = {"traceback": [], "hang": [], "write outside -o": [], "exit 2, several lines": [],
                                     "exit outside the convention": []}
        seconds = []
        began = time.perf_counter()

        def record(result: dict) -> None:
            verdict = _judge(result)
            target = result.get("target", "?")
            tally.setdefault(target, {}).setdefault(verdict, 0)
            tally[target][verdict] += 1
            seconds.append(result.get("seconds", 0.0))
            key = "exit outside the convention" if "outside the convention" in verdict else verdict
            if key in findings and len(findings[key]) < 50:
                findings[key].append(result)
            done = len(seconds)
            if done % 500 == 0:
                print(f"{done} cases, {time.perf_counter() - began:.0f} s", file=sys.stderr, flush=True)
                write(partial=True)  # a run stopped early still leaves its tally so far (marked partial)

        def write(partial: bool) -> dict:
            summary = _summary(tally, findings, seconds, args, argv, time.perf_counter() - began)
            if partial:
                summary["partial"] = True
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
            return summary

        pool = _Pool(args.workers, root, args.memory_gib, args.timeout)
        try:
            pool.run([(args.seed + index, None, targets) for index in range(args.cases)], record)
        finally:
            pool.close()
        summary = write(partial=False)
        outcomes = summary["outcomes"]
        print(json.dumps({k: summary[k] for k in ("cases", "outcomes", "tracebacks", "hangs",
                                                  "writes_outside_output", "wall_seconds")}, indent=1))
        bad = summary["tracebacks"] + summary["hangs"] + summary["writes_outside_output"] \
            + outcomes.get("exit 2, several lines", 0)
        return 1 if bad else 0
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _summary(tally, findings, seconds, args, argv, wall: float) -> dict:
    """The result file's document (so far, while the run goes on)."""
    outcomes: dict[str, int] = {}
    for verdicts in tally.values():
        for verdict, count in verdicts.items():
            outcomes[verdict] = outcomes.get(verdict, 0) + count
    summary = {
        "cases": len(seconds), "first_seed": args.seed, "workers": args.workers, "timeout_seconds": args.timeout,
        "targets": args.targets.split(",") if args.targets else sorted(TARGETS),
        "wall_seconds": round(wall, 1),
        "mean_case_seconds": round(sum(seconds) / max(len(seconds), 1), 3),
        "outcomes": dict(sorted(outcomes.items())),
        "tracebacks": outcomes.get("traceback", 0), "hangs": outcomes.get("hang", 0),
        "writes_outside_output": outcomes.get("write outside -o", 0),
        "exit_2_one_line": outcomes.get("exit 2, one line", 0),
        "by_target": {target: dict(sorted(v.items())) for target, v in sorted(tally.items())},
        "findings": {key: value for key, value in findings.items() if value},
        "command": "python bench/fuzz.py " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    return summary


if __name__ == "__main__":
    sys.exit(main())
