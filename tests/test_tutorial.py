"""tutorial.ipynb is committed executed, and its outputs are what its code gives.

`python scripts/execute_tutorial.py` executes the notebook and writes it back with its outputs
(the tutorial a reader sees on the web). Two tests:

1. The committed notebook: every code cell executed, in order, with outputs; at least four
   figures (PNG); no error output; no path of one machine in any output or in the metadata;
   the first cell says on which machine the outputs were made; the last cell's
   TUTORIAL_SUMMARY line is there; the exercise stubs' checkers say "not yet", the
   solutions' checkers "correct".
2. A fresh execution of a copy (nbclient, a fresh python3 kernel, the repository root as
   working directory; any cell error fails it): its key numbers, checked one by one, and the
   committed outputs' numbers compared with it. The comparison covers everything in
   TUTORIAL_SUMMARY but section 6's training run (which moves with the CPU's bf16 rounding)
   and the wall time: integers, booleans and strings exactly (the sampled batch's
   fingerprint, token counts, stage sizes), floats to 1e-3 relative (float32 arithmetic
   rounds differently with another CPU or thread count). A mismatch means the committed
   outputs no longer match the code: rerun the script.

Measured: the execution takes 3.5 minutes on 1 thread of a 2-core Intel Xeon that a 2-thread
training run shared (`pytest tests/test_tutorial.py`: 3.5 minutes in all); meant to take at most
10 minutes on 2 free cores. LOPTI_TEST_THREADS (default 2) becomes the notebook's
LOPTI_THREADS, and the short training run of section 6 is written to a temporary folder
(LOPTI_TUTORIAL_RUNS).
"""
import json
import math
import os
import re
import time

import nbformat
from nbclient import NotebookClient

from conftest import ROOT
from test_docs import MACHINE_PATH

NOTEBOOK = ROOT / "tutorial.ipynb"
CELL_TIMEOUT_S = 2400         # the longest cell is section 6's training run (2 minutes on 1 thread)
RERUN = "rerun `python scripts/execute_tutorial.py` and commit tutorial.ipynb"
# TUTORIAL_SUMMARY's keys that move with the machine: section 6's training run, the time.
MACHINE_DEPENDENT = {"train", "eval_accuracy", "seconds"}
REL_TOL, ABS_TOL = 1e-3, 1e-6


def _summary(nb) -> dict:
    for cell in reversed(nb.cells):
        for out in cell.get("outputs", []):
            text = out.get("text", "") if out.get("output_type") == "stream" else ""
            for line in text.splitlines():
                if line.startswith("TUTORIAL_SUMMARY "):
                    return json.loads(line[len("TUTORIAL_SUMMARY "):])
    raise AssertionError("the notebook printed no TUTORIAL_SUMMARY line")


def _output_text(out) -> str:
    text = out.get("text", "")
    text += "".join("".join(v) if isinstance(v, list) else v
                    for k, v in out.get("data", {}).items() if k.startswith("text/"))
    return text + "\n".join(out.get("traceback", []))


def _images(nb) -> int:
    return sum("image/png" in out.get("data", {}) for c in nb.cells for out in c.get("outputs", []))


def _mismatches(committed, fresh, path="") -> list[str]:
    """Where the committed summary differs from the fresh one (MACHINE_DEPENDENT skipped):
    floats to REL_TOL / ABS_TOL, everything else exactly, its type included."""
    differ = [f"{path or 'summary'}: {committed!r} committed, {fresh!r} now"]
    if isinstance(committed, dict):
        skip = MACHINE_DEPENDENT if path == "" else set()
        if not isinstance(fresh, dict) or set(committed) - skip != set(fresh) - skip:
            return differ
        return [m for k in sorted(set(committed) - skip) for m in _mismatches(committed[k], fresh[k], f"{path}.{k}")]
    if isinstance(committed, list):
        if not isinstance(fresh, list) or len(committed) != len(fresh):
            return differ
        return [m for i, (c, f) in enumerate(zip(committed, fresh)) for m in _mismatches(c, f, f"{path}[{i}]")]
    if type(committed) is float and type(fresh) in (int, float):
        same = math.isclose(committed, fresh, rel_tol=REL_TOL, abs_tol=ABS_TOL)
    else:
        same = type(committed) is type(fresh) and committed == fresh
    return [] if same else differ


def test_the_summary_comparison():
    base = {"a": 1, "b": [0.5, None, True], "c": {"d": "x"}, "train": [1], "seconds": 3.0}
    assert _mismatches(base, {"a": 1, "b": [0.50049, None, True], "c": {"d": "x"}, "train": [2], "seconds": 9.0}) == []
    assert _mismatches(base, {**base, "a": 2})
    assert _mismatches(base, {**base, "b": [0.501, None, True]})            # beyond 1e-3 relative
    assert _mismatches(base, {**base, "b": [0.5, None, False]})
    assert _mismatches(base, {**base, "b": [0.5, None]})
    assert _mismatches(base, {**base, "c": {"d": "y"}})
    assert _mismatches(base, {k: v for k, v in base.items() if k != "c"})
    assert _mismatches({"x": 0.0}, {"x": 2e-6}) and not _mismatches({"x": 0.0}, {"x": 5e-7})


def test_committed_notebook_is_executed_with_its_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code, "no code cells"
    counts = [c.execution_count for c in code]
    assert counts == list(range(1, len(code) + 1)), \
        f"every code cell executed once, in order, in one kernel (execution counts {counts}): {RERUN}"
    empty = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and not c.outputs
             and "raise NotImplementedError" not in c.source]          # (an exercise's stub only defines)
    assert not empty, f"code cells without outputs: {empty}: {RERUN}"
    errors = [i for i, c in enumerate(code) if any(o.get("output_type") == "error" for o in c.outputs)]
    assert not errors, f"error outputs in code cells {errors}"
    assert _images(nb) >= 4, f"{_images(nb)} PNG figures: {RERUN}"
    paths = [f"cell {i}: {line.strip()[:120]}" for i, c in enumerate(nb.cells) for o in c.get("outputs", [])
             for line in _output_text(o).splitlines() if MACHINE_PATH.search(line)]
    paths += [f"metadata: {json.dumps(nb.metadata)}"] * bool(MACHINE_PATH.search(json.dumps(nb.metadata)))
    assert not paths, f"outputs name a path of one machine: {paths}"
    assert not any("execution" in c.metadata for c in nb.cells), f"execution timestamps in the metadata: {RERUN}"
    machine = re.search(r"<!-- machine -->(.*?)<!-- /machine -->", nb.cells[0].source, re.S)
    assert machine and machine.group(1).startswith("on ") and " cores" in machine.group(1) \
        and "torch " in machine.group(1), f"the first cell says where the outputs were made: {RERUN}"
    s = _summary(nb)
    assert "python" not in s and s["bound_ok"] is True
    # The exercises: at least three stubs, each with a checker cell right below that says
    # "not yet"; the solutions apart, after them, each checker then "correct".
    src = ["".join(c.source) for c in code]
    stubs = [i for i, t in enumerate(src) if "raise NotImplementedError" in t]
    assert len(stubs) >= 3, f"{len(stubs)} exercise stubs"
    for i in stubs:
        out = "".join(_output_text(o) for o in code[i + 1].outputs)
        assert "exercises.check_" in src[i + 1] and "not yet" in out, (i, src[i + 1][:80], out)
    (sol,) = [i for i, t in enumerate(src) if "solved = {" in t]
    assert sol > max(stubs) and s["exercises"] and all(s["exercises"].values())


def test_tutorial_runs_end_to_end_and_matches_its_committed_outputs(tmp_path, monkeypatch):
    threads = os.environ.get("LOPTI_TEST_THREADS", "2")
    monkeypatch.setenv("LOPTI_THREADS", threads)                 # read by the notebook's first cell
    monkeypatch.setenv("OMP_NUM_THREADS", threads)
    monkeypatch.setenv("LOPTI_TUTORIAL_RUNS", str(tmp_path / "runs"))
    committed = nbformat.read(NOTEBOOK, as_version=4)
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(nb, timeout=CELL_TIMEOUT_S, startup_timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(ROOT)}})
    t0 = time.perf_counter()
    client.execute()                     # raises CellExecutionError on the first failing cell
    seconds = time.perf_counter() - t0
    print(f"tutorial executed in {seconds:.0f}s with {threads} thread(s)")

    for cell in nb.cells:
        for out in cell.get("outputs", []):
            assert out.get("output_type") != "error", out
    s = _summary(nb)

    # 1. The Logic-RL reward of a correct, a wrong, an unparseable and a malformed answer.
    assert s["scores"] == {"correct": 3.0, "wrong": -0.5, "unparseable": -1.0, "malformed": -3.0}
    # 2. The batch: 4 puzzles x G = 8; its advantages.
    assert s["batch"]["responses"] == 32 and len(s["batch"]["rewards"]) == 32
    # 3. AR: the factor in [1 - alpha, 1]. Lopti: the split covers the tokens; the two
    #    grpo_update calls written out leave lopti_update's weights bit for bit; stage 1's
    #    ratios are exactly 1, stage 2's (from stage 1's weights, against the same pi_old) not.
    ar, lo = s["ar"], s["lopti"]
    assert 1 - ar["alpha"] - 1e-6 <= ar["factor_min"] <= ar["factor_max"] <= 1.0
    assert sum(lo["stage_sizes"]) == s["batch"]["tokens"] and min(lo["stage_sizes"]) > 0
    assert lo["two_calls_equal_lopti_update"] is True
    assert lo["stage1_ratio"] == [1.0, 1.0]
    if s["nonzero_advantages"]:
        assert lo["stage2_ratio"] != [1.0, 1.0]
    # 4. The softmax bound holds; per-token gradients fall from the lowest to the highest bin.
    assert s["bound_ok"] is True
    assert len(s["token_share"]) == 4 and abs(sum(s["token_share"]) - 1) < 1e-3
    g = s["grad_hidden_per_bin"]
    assert g[0] is not None and g[3] is not None and g[0] > g[3]
    #    The low bins' (pi_old < 0.5) share of a step's squared gradient norm: in the joint
    #    GRPO step larger than their share of the tokens (paper Fig. 1b), smaller with AR's
    #    weights (Eq. 4), none in Lopti's stage 2 (only bins 2-3 take part).
    shares = s["grad_share_low_bins"]
    assert set(shares) == {"GRPO", "AR", "Lopti 2"} and all(0 <= v <= 1 for v in shares.values())
    if s["nonzero_advantages"]:          # (a batch whose groups are all constant moves nothing)
        assert shares["GRPO"] > sum(s["token_share"][:2]) + 0.2, (shares, s["token_share"])
        assert shares["AR"] < shares["GRPO"] and shares["Lopti 2"] == 0.0, shares
    # 5. The ratio of the first update on fresh samples is exactly 1.
    assert s["ratio_first_update_max_dev"] == 0.0
    # 6. The study's archive: the three arms at the same seeds; a short run: one method, one
    #    seed, all steps logged, evaluated. RL selects the derivations: the share of samples
    #    that derive rises (mean of the last 3 steps above the first step's), and greedy
    #    accuracy on the 50 puzzles rises above the warm start's (which guesses) by >= 0.1.
    st = s["study"]
    assert st["seeds"] and set(st) == {"archive", "seeds", "forest"}
    arms = {"ar-a0.2", "lopti-e0.4", "ar_lopti-a0.3-e0.5", "grpo-x2", "grpo-lrx2", "lopti-e0.4-random",
            "lopti-e0.4-high_first", "lopti-e0.4-per_stage"}          # the forest plot has every arm, the controls too
    assert arms <= set(st["forest"]) and "grpo" not in st["forest"], st["forest"]
    assert all(n >= 2 and to80 is not None for n, to80, _ in st["forest"].values())
    ds = s["train"]["derive_share"]
    assert s["train"]["steps"] == len(ds) > 0 and sum(ds[-3:]) / 3 > ds[0] + 0.2, ds
    acc = s["eval_accuracy"]
    assert set(acc) == {"warm start", "ar_lopti"} and all(0 <= v <= 1 for v in acc.values())
    assert acc["ar_lopti"] >= acc["warm start"] + 0.1, acc
    assert (tmp_path / "runs" / "ar_lopti-s0" / "metrics.jsonl").exists()   # not in the repository's runs/
    # 7. The exercises. 1-4: the solutions pass their checkers (tests/test_exercises.py: the
    #    stubs and wrong functions fail). 5: reversed, the stages swap sizes; the random split
    #    keeps Algorithm 1's sizes and draws its first stage from all tokens; the first stage's
    #    ratios are 1.
    assert s["exercises"] == {"ar_factor": True, "split": True, "two_stages": True, "clipped_loss": True}
    e1 = s["explore_orders"]
    n_low, n_high = lo["stage_sizes"]
    assert e1["stage_sizes"] == {"low first (Algorithm 1)": [n_low, n_high], "high first": [n_high, n_low],
                                 "random split": [n_low, n_high]}
    assert 0 < e1["random_first_low_share"] < 1 and e1["high_first_stage1_ratio"] == [1.0, 1.0]
    #    6: at T = 1 the first ratio leaves 1: up for low-probability tokens, never up for the others.
    e2 = s["explore_temperature"]
    assert e2["ratio_min"] < 1 < e2["ratio_max"] and e2["above_1_low"] > 0.2 and e2["above_1_high"] < 0.05, e2
    #    7: the low bins' share falls as alpha grows; alpha 0 is GRPO's, 0.3 AR's.
    e3 = [s["explore_alpha"][a] for a in ("0.0", "0.3", "0.6", "1.0")]
    assert math.isclose(e3[0], shares["GRPO"], rel_tol=1e-5) and math.isclose(e3[1], shares["AR"], rel_tol=1e-5)
    if s["nonzero_advantages"]:
        assert e3 == sorted(e3, reverse=True) and e3[-1] < e3[0], e3
    # 8. The 80/20 rule (token_fixes.py) never keeps the guess-or-derive token, a two-way
    #    choice below the batch's 80th entropy percentile, and keeps low-probability tokens.
    e = s["entropy_top"]
    assert e["decision_kept"] == 0 and e["decision_max_H"] < e["tau"], e
    assert e["kept_share_low_bins"] > max(0.6, 2 * sum(s["token_share"][:2])), (e, s["token_share"])
    assert _images(nb) >= 4

    # The committed outputs are this code's: the same numbers, to float rounding.
    diff = _mismatches(_summary(committed), s)
    assert not diff, "the committed outputs no longer match the code (" + RERUN + "):\n" + "\n".join(diff)


def test_the_study_numbers_in_the_markdown_are_the_reports():
    """Every interval "[a, b]" in a markdown cell that cites the study's report is one the
    report or its full tables print (either orientation: "5.4 steps before GRPO [4.0, 6.8]"
    is the table's -5.4 [-6.8, -4.0]): a number cannot go stale when the archive changes.
    (A code cell that reads the archive prints its own; tests above compare those.)"""
    import json
    import re
    pattern = re.compile(r"\[([+-]?\d+\.\d+), ([+-]?\d+\.\d+)\]")
    report = (ROOT / "docs" / "RESULTS.md").read_text() + (ROOT / "results" / "study-fixed" / "RESULTS_TABLES.md").read_text()
    printed = set()
    for a, b in pattern.findall(report):
        a, b = float(a), float(b)
        printed |= {(a, b), (-b, -a)}
    cells = json.loads((ROOT / "tutorial.ipynb").read_text())["cells"]
    stale, checked = [], 0
    for i, c in enumerate(cells):
        text = "".join(c["source"])
        if c["cell_type"] != "markdown" or "RESULTS.md" not in text:
            continue
        for a, b in pattern.findall(text):
            checked += 1
            if (float(a), float(b)) not in printed:
                stale.append(f"cell {i}: [{a}, {b}]")
    assert checked >= 2 and not stale, f"intervals the report does not print: {stale}"
