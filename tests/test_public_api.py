"""The public surface: `from lopti_minimal import ...` of the method's functions, a cheap
`import lopti_minimal`, a core free of TRL and accelerate imports, and the README's two
"Use AR and Lopti in your own trainer" examples run exactly as written."""
import ast
import re
import subprocess
import sys

import pytest
import torch

from conftest import ROOT

PUBLIC = ["group_advantages", "reweight_advantages", "split_by_probability", "lopti_update",
          "grpo_update", "policy_loss", "kl_k3", "TrainConfig", "train"]


def readme_example(name: str) -> str:
    """The fenced python block right after `<!-- example: NAME -->` in README.md."""
    text = (ROOT / "README.md").read_text()
    m = re.search(rf"<!-- example: {name} -->\s*```python\n(.*?)```", text, re.S)
    assert m, f"README.md has no example {name!r}"
    return m.group(1)


def test_public_names_and_all():
    import lopti_minimal
    from lopti_minimal import grpo, lopti, reweight, config, trainer
    assert set(PUBLIC) <= set(lopti_minimal.__all__)
    homes = {"reweight_advantages": reweight, "split_by_probability": lopti, "lopti_update": lopti,
             "TrainConfig": config, "train": trainer}
    for name in PUBLIC:
        assert getattr(lopti_minimal, name) is getattr(homes.get(name, grpo), name)
    assert set(PUBLIC) <= set(dir(lopti_minimal))
    with pytest.raises(AttributeError):
        lopti_minimal.no_such_name


def test_import_is_cheap_and_core_imports_neither_trl_nor_accelerate():
    """`import lopti_minimal` (what `train.py --help` pays) loads no torch; the names load it
    on first use. No module of the core (all but trl_grpo.py) imports trl or accelerate
    itself (transformers imports accelerate on its own whenever it is installed)."""
    code = ("import sys, lopti_minimal\n"
            "assert 'torch' not in sys.modules\n"
            "from lopti_minimal import lopti_update\n"
            "assert 'torch' in sys.modules and 'trl' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)
    for path in (ROOT / "lopti_minimal").rglob("*.py"):
        if path.name == "trl_grpo.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                     else [])
            for n in names:
                assert n.split(".")[0] not in ("trl", "accelerate"), f"{path.name} imports {n}"


def test_the_core_never_imports_the_experiments():
    """lopti_minimal/*.py and task/ (the method and the task) import nothing from
    lopti_minimal/experiments/ (the warm start, the study, the diagnostics), at the top of a
    module or inside a function."""
    core = [p for p in (ROOT / "lopti_minimal").rglob("*.py") if "experiments" not in p.parts]
    assert len(core) > 20
    for path in core:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [a.name for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            assert not any("experiments" in n.split(".") for n in names), f"{path.name} imports {names}"


def test_readme_own_trainer_example():
    """The example runs; its advantages are Eq. 4 of the group advantages, the two stages
    partition the response tokens, and the last optimizer step moved only stage 2's."""
    torch.manual_seed(0)
    ns: dict = {}
    exec(readme_example("own-trainer"), ns)
    adv, old, mask, low, high = ns["adv"], ns["old_logp"], ns["mask"], ns["low"], ns["high"]
    from lopti_minimal import group_advantages
    a = group_advantages(ns["rewards"], 4)[:, None]
    assert torch.allclose(adv, (0.3 * old.exp() + 0.7) * a)
    assert torch.equal(low + high, mask) and low.sum() > 0 and high.sum() > 0
    assert torch.equal(low.bool(), (old.exp() < 0.5) & (mask > 0))
    grad = ns["shift"].grad
    assert (grad[high == 0] == 0).all() and (grad[(high > 0) & (adv != 0)] != 0).all()


def test_readme_trl_example(tmp_path, monkeypatch):
    """The TRL example trains as written: one generation batch, Lopti's two optimizer steps,
    on the shipped warm start (a few seconds)."""
    monkeypatch.chdir(tmp_path)
    ns: dict = {}
    exec(readme_example("trl"), ns)
    trainer = ns["trainer"]
    assert trainer.state.global_step == 2
    assert (trainer.alpha, trainer.eta, trainer.uses_lopti) == (0.3, 0.5, True)


def test_the_code_a_reader_follows_stays_short():
    """The sampler and its decode step stay within 450 lines together, and no function of
    the core (lopti_minimal/*.py, task/) has more than 60 lines of code (docstring, comments
    and blank lines not counted): what the tutorial prints is read in one sitting."""
    import ast
    pkg = ROOT / "lopti_minimal"
    n = sum(len((pkg / f).read_text().splitlines()) for f in ("sampling.py", "decode.py"))
    assert n <= 450, f"sampling.py + decode.py: {n} lines (at most 450)"
    long = []
    for path in sorted([*pkg.glob("*.py"), *(pkg / "task").glob("*.py")]):
        lines = path.read_text().splitlines()
        for node in ast.walk(ast.parse("\n".join(lines))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = node.body[0] if node.body and isinstance(node.body[0], ast.Expr) and \
                    isinstance(getattr(node.body[0], "value", None), ast.Constant) else None
                skip = set(range(doc.lineno, doc.end_lineno + 1)) if doc else set()
                code = [i for i in range(node.lineno, node.end_lineno + 1) if i not in skip
                        and lines[i - 1].strip() and not lines[i - 1].strip().startswith("#")]
                if len(code) > 60:
                    long.append(f"{path.name}:{node.name} ({len(code)})")
    assert not long, f"functions over 60 lines of code: {long}"
