"""Installed the way users install: build the wheel, install it (not editable) into a fresh virtualenv, run it.

The wheel is built from the repository's files (tracked, plus untracked ones git does not ignore) copied to a
temporary directory, with no network: `pip wheel --no-deps --no-build-isolation --no-index`. Its contents are
checked against the source tree (every module and data file of liac/, passes/ and runtime/, at its installed
path). The fresh virtualenv sees the packages of the environment running the tests (torch and the other
dependencies, through a .pth file; never this checkout's own liac), so installing resolves the wheel's
dependencies without downloading anything. From outside the repository it then runs `liac --version`,
`python -m liac --version`, `lia-run --version`, `lia-serve --version` (its entry point), `liac compile` for this
host (default profile) on a model named by a Hugging Face repo id from a fabricated cache, `liac docs
--plan-format` (templates and schema from the wheel), `lia-run` on random weights, and text: `python -m liac.tiny`
(the quickstart's checkpoint), `liac.quick.generate` (a plan compiled into the user's cache) and `lia-run --prompt
--json` on that plan.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from liac.host import write_profile
from liac.profile import resolve_profile

ROOT = Path(__file__).parents[1]
INSTALLED_AS = {"liac": "liac", "passes": "liac/passes", "runtime": "liac/runtime"}  # source folder → wheel path
TINY_OPT = {"model_type": "opt", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
            "ffn_dim": 128, "vocab_size": 100, "max_position_embeddings": 128, "do_layer_norm_before": True,
            "word_embed_proj_dim": 64, "activation_function": "relu", "enable_bias": True}
COMMIT = "0123456789abcdef0123456789abcdef01234567"

pytestmark = pytest.mark.slow


def _source_files() -> list[str]:
    """The repository's files, as a clean clone plus uncommitted work would have them."""
    done = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                          capture_output=True, text=True, check=True)
    return sorted(name for name in done.stdout.split("\0") if name and (ROOT / name).is_file())


def _run(command: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{' '.join(command)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    source = tmp_path_factory.mktemp("source")
    for name in _source_files():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, source / name)
    dist = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
          "-w", str(dist), str(source)], cwd=source, env=dict(os.environ))
    (built,) = dist.glob("liac-*.whl")
    return built


def test_wheel_holds_every_module_and_data_file(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = set()
    for name in _source_files():
        folder, _, rest = name.partition("/")
        if folder in INSTALLED_AS and rest:
            expected.add(f"{INSTALLED_AS[folder]}/{rest}")
    assert "liac/commands/compile.py" in expected and "liac/passes/ilp.py" in expected
    assert sorted(expected - names) == []
    assert "liac/py.typed" in names and "liac/__main__.py" in names
    tops = {name.split("/")[0] for name in names}
    assert {top for top in tops if not top.endswith(".dist-info")} == {"liac"}  # no generic top-level names
    meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
    requires = [line.split(": ", 1)[1] for line in zipfile.ZipFile(wheel).read(meta).decode().splitlines()
                if line.startswith("Requires-Dist: ") and "extra ==" not in line]
    for needed in ("torch", "safetensors", "transformers", "huggingface_hub", "tqdm", "platformdirs"):
        assert any(r.startswith(needed) for r in requires), needed


def _dependency_view(tmp: Path) -> Path:
    """A folder of links to everything in this environment's site-packages except liac itself (this checkout's
    editable install), for the fresh virtualenv's .pth."""
    view = tmp / "deps"
    view.mkdir()
    site = Path(sysconfig.get_paths()["purelib"])
    for entry in site.iterdir():
        lowered = entry.name.lower()
        if lowered.startswith(("liac", "__editable__")) or lowered.endswith(".pth") or lowered == "__pycache__":
            continue
        (view / entry.name).symlink_to(entry)
    return view


def _hub_cache(root: Path) -> Path:
    repo = root / "hub" / "models--acme--tiny-opt"
    (repo / "snapshots" / COMMIT).mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    (repo / "snapshots" / COMMIT / "config.json").write_text(json.dumps(TINY_OPT))
    return root / "hub"


def test_installed_wheel_compiles_and_runs(wheel, tmp_path):
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp_path, env=dict(os.environ))
    python = venv / "bin" / "python"
    purelib = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                   cwd=tmp_path, env=dict(os.environ)).stdout.strip()
    (Path(purelib) / "dependencies.pth").write_text(str(_dependency_view(tmp_path)) + "\n")
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "LIAC_EMULATE_GPU")}
    env.update(PIP_NO_INDEX="1", HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(_hub_cache(tmp_path)),
               XDG_CACHE_HOME=str(tmp_path / "cache"), CUDA_VISIBLE_DEVICES="")
    # dependencies resolved against what is installed (no index): the wheel's requirements are satisfiable
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", str(wheel)], cwd=tmp_path, env=env)

    work = tmp_path / "work"  # outside the repository: nothing can come from the checkout
    work.mkdir()
    where = _run([str(python), "-c", "import liac, liac.passes, liac.runtime, liac.commands; "
                                     "print(liac.__file__, liac.passes.__file__, liac.runtime.__file__)"],
                 cwd=work, env=env).stdout.split()
    assert all(path.startswith(purelib) for path in where), where
    bin_ = venv / "bin"
    assert _run([str(bin_ / "liac"), "--version"], cwd=work, env=env).stdout.startswith("liac 0.1.0 (torch ")
    assert _run([str(python), "-m", "liac", "--version"], cwd=work, env=env).stdout.startswith("liac 0.1.0")
    assert _run([str(bin_ / "lia-run"), "--version"], cwd=work, env=env).stdout.startswith("lia-run 0.1.0")
    assert _run([str(bin_ / "lia-serve"), "--version"], cwd=work, env=env).stdout.startswith("lia-serve 0.1.0")

    # this host's profile, as `liac profile` would leave it on a CPU-only machine (no probe: the test is about
    # the install, tests/test_host.py measures)
    host = replace(resolve_profile("spr-h100"), name="host", gpu_hbm_gib=0.0, gpu_reserve_gib=0.0)
    write_profile(host, tmp_path / "cache" / "liac" / "host.yaml")
    compiled = _run([str(bin_ / "liac"), "compile", "--model", "acme/tiny-opt", "--batch", "1", "--prompt-len",
                     "8", "--gen-len", "4", "-o", "plan.yaml", "--json"], cwd=work, env=env)
    doc = json.loads(compiled.stdout)
    assert doc["model"] == "tiny-opt" and doc["profile"] == "host" and doc["written"] == ["plan.yaml"]
    _run([str(bin_ / "liac"), "docs", "--plan-format", "plan-format.md"], cwd=work, env=env)
    assert "apiVersion" in (work / "plan-format.md").read_text()
    ran = _run([str(bin_ / "lia-run"), "plan.yaml", "--random-weights", "0", "--gen-len", "2", "--profile-steps",
                "0"], cwd=work, env=env)
    assert "tokens[0]: " in ran.stdout

    # text from the wheel: the quickstart's checkpoint (a few training steps), then the notebook call and lia-run
    _run([str(python), "-m", "liac.tiny", "tiny", "--steps", "2"], cwd=work, env=env)
    said = _run([str(python), "-c", "from liac.quick import generate; out = generate('tiny', 'The GPU', max_new_tokens=4); "
                                    "print(len(out.text), out.finish_reasons[0] in ('eos', 'length'))"],
                cwd=work, env=env)
    assert said.stdout.split() == ["1", "True"]
    plans = list((tmp_path / "cache" / "liac" / "plans").glob("*.tiny.host.yaml"))
    assert len(plans) == 1  # compiled for this host into the user's cache
    texts = _run([str(bin_ / "lia-run"), str(plans[0]), "--weights", "tiny", "--prompt", "The GPU", "--gen-len", "4",
                  "--json"], cwd=work, env=env)
    assert json.loads(texts.stdout)["outputs"][0]["prompt"] == "The GPU"
