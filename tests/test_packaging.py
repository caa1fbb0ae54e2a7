"""pyproject.toml: the requirements files and the package metadata agree, and a wheel
built from this tree, installed outside the repository, finds what the default run reads
(the shipped warm start and the official test sets, lopti_minimal/paths.py)."""
import os
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

from conftest import ROOT

tomllib = pytest.importorskip("tomllib")     # Python 3.11+


def requirements(path):
    """{name: specifier} of a requirements file (comments and blank lines skipped)."""
    out = {}
    for line in (ROOT / path).read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, spec = re.match(r"([A-Za-z0-9_.\-]+)\s*(.*)", line).groups()
            out[name.lower()] = spec.replace(" ", "")
    return out


def as_dict(specs):
    """{name: specifier} of a PEP 508 list (pyproject's dependencies)."""
    return {re.match(r"[A-Za-z0-9_.\-]+", s).group().lower(): re.sub(r"^[A-Za-z0-9_.\-]+", "", s)
            for s in specs}


def project():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_requirements_agree_with_pyproject():
    """requirements.txt, the repository's one environment (the README's install, what the
    tests and the tutorial need), is the package's core dependencies plus its extras `trl`,
    `lora` and `test`, with the same lower bounds; the package's core stays without TRL and
    peft (a user of `pip install .` gets them only by asking for the extra)."""
    req = requirements("requirements.txt")
    p = project()
    core = as_dict(p["dependencies"])
    extras = {name: as_dict(p["optional-dependencies"][name]) for name in ("trl", "lora", "test")}
    expected = dict(core)
    for specs in extras.values():
        expected.update(specs)
    assert req == expected
    assert "peft" not in core and "trl" not in core          # optional for the package
    assert "version" in p["dynamic"]


def test_wheel_installs_and_finds_its_files(tmp_path):
    """Build a wheel of this tree (setuptools, no network), install it into a folder and
    import it from another directory: the version, every subpackage, the official test
    sets and the shipped warm start are there; runs/ and cache/ go under the current
    directory, not site-packages."""
    src = tmp_path / "src"           # a copy: the build's build/ and egg-info stay out of the repo
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for rel in ("lopti_minimal", "checkpoints/tiny-warm", "data/kk_benchmark"):
        shutil.copytree(ROOT / rel, src / rel, ignore=ignore)
    for rel in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / rel, src / rel)
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    subprocess.run(pip + ["wheel", str(src), "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "w")],
                   check=True, cwd=tmp_path)
    (wheel,) = (tmp_path / "w").glob("*.whl")
    import lopti_minimal
    assert wheel.name == f"lopti_minimal-{lopti_minimal.__version__}-py3-none-any.whl"
    names = set(zipfile.ZipFile(wheel).namelist())
    packages = {str(d.relative_to(ROOT)) for d in (ROOT / "lopti_minimal").rglob("__init__.py")}
    assert packages <= names, "a subpackage is missing from pyproject's packages list"
    for f in ("config.json", "model.safetensors", "tokenizer.json"):
        assert f"lopti_minimal/_shipped/tiny_warm/{f}" in names
    for n in range(3, 8):
        assert f"lopti_minimal/_shipped/kk_benchmark/kk_test_{n}ppl.jsonl" in names
    assert not any(n.startswith(("tests/", "runs/", "results/", "checkpoints/")) for n in names)

    site, elsewhere = tmp_path / "site", tmp_path / "elsewhere"
    subprocess.run(pip + ["install", "--no-deps", "--target", str(site), str(wheel)], check=True)
    elsewhere.mkdir()
    code = (
        "import os, lopti_minimal as L\n"
        "from pathlib import Path\n"
        "assert Path(L.__file__).parent == Path(os.environ['SITE']) / 'lopti_minimal', L.__file__\n"
        "from lopti_minimal import paths, runs\n"
        "from lopti_minimal.task import kk\n"
        "from lopti_minimal.models import load_model_and_tokenizer\n"
        "assert not paths.in_checkout()\n"
        "assert [len(kk.load_official([n])) for n in range(3, 8)] == [100] * 5\n"
        "model, tok = load_model_and_tokenizer(paths.resolve_model('checkpoints/tiny-warm'), device='cpu')\n"
        "assert model.num_parameters() > 1e6\n"
        "assert runs.RUNS_ROOT == Path.cwd() / 'runs'\n"
        "print('ok', L.__version__)\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(site), SITE=str(site), OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", code], cwd=elsewhere, env=env, check=True,
                         capture_output=True, text=True)
    assert out.stdout.strip() == f"ok {lopti_minimal.__version__}"
