"""tutorial.ipynb runs end to end and is committed without outputs.

The notebook is executed with nbclient in a fresh python3 kernel, with the repository root as
working directory (the notebook imports lopti_minimal from there). Any cell error fails the test.
The notebook's last cell prints one line, "TUTORIAL_SUMMARY {json}", with the key numbers of
every section; they are checked here. Measured: 8.3 minutes on 1 thread at nice 19 on a
2-core machine busy with other jobs; meant to take at most 10 minutes on 2 free cores.
LOPTI_TEST_THREADS (default 2) becomes the notebook's LOPTI_THREADS, and the two short
training runs of section 5 are written to a temporary folder (LOPTI_TUTORIAL_RUNS).
"""
import json
import os
import sys
import time

import nbformat
from nbclient import NotebookClient

from conftest import ROOT

NOTEBOOK = ROOT / "tutorial.ipynb"
CELL_TIMEOUT_S = 2400         # the longest cell is section 5's two training runs (~5 min on 2 free cores)


def test_committed_notebook_is_valid_and_has_no_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code, "no code cells"
    for c in code:
        assert c.outputs == [] and c.execution_count is None, \
            "strip the outputs before committing (e.g. jupyter nbconvert --clear-output --inplace tutorial.ipynb)"


def _summary(nb) -> dict:
    for cell in reversed(nb.cells):
        for out in cell.get("outputs", []):
            text = out.get("text", "") if out.get("output_type") == "stream" else ""
            for line in text.splitlines():
                if line.startswith("TUTORIAL_SUMMARY "):
                    return json.loads(line[len("TUTORIAL_SUMMARY "):])
    raise AssertionError("the notebook printed no TUTORIAL_SUMMARY line")


def test_tutorial_runs_end_to_end(tmp_path, monkeypatch):
    threads = os.environ.get("LOPTI_TEST_THREADS", "2")
    monkeypatch.setenv("LOPTI_THREADS", threads)                 # read by the notebook's first cell
    monkeypatch.setenv("OMP_NUM_THREADS", threads)
    monkeypatch.setenv("LOPTI_TUTORIAL_RUNS", str(tmp_path / "runs"))
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
    # The kernel runs this interpreter (jupyter_client maps the kernelspec's "python" to it).
    assert os.path.realpath(s["python"]) == os.path.realpath(sys.executable)

    # 1. The Logic-RL reward of a correct, a wrong, an unparseable and a malformed answer.
    assert s["scores"] == {"correct": 3.0, "wrong": -0.5, "unparseable": -1.0, "malformed": -3.0}
    # 2. The softmax bound holds; per-token gradients fall from the lowest to the highest bin.
    assert s["bound_ok"] is True
    assert len(s["token_share"]) == 4 and abs(sum(s["token_share"]) - 1) < 1e-3
    g = s["grad_hidden_per_bin"]
    assert g[0] is not None and g[3] is not None and g[0] > g[3]
    # 3. The ratio of the first update on fresh samples is exactly 1.
    assert s["ratio_first_update_max_dev"] == 0.0
    # 4. The low bins' (pi_old < 0.5) share of a step's squared gradient norm: in the joint
    #    GRPO step larger than their share of the tokens (paper Fig. 1b), smaller with AR's
    #    weights (Eq. 4), none in Lopti's stage 2 (only bins 2-3 take part).
    shares = s["grad_share_low_bins"]
    assert set(shares) == {"GRPO", "AR", "Lopti 2"} and all(0 <= v <= 1 for v in shares.values())
    if s["nonzero_advantages"]:          # (a batch whose groups are all constant moves nothing)
        assert shares["GRPO"] > sum(s["token_share"][:2]) + 0.2, (shares, s["token_share"])
        assert shares["AR"] < shares["GRPO"] and shares["Lopti 2"] == 0.0, shares
    # 4b. The 80/20 rule (token_fixes.py) never keeps the guess-or-derive token, a two-way
    #     choice below the batch's 80th entropy percentile, and keeps low-probability tokens.
    e = s["entropy_top"]
    assert e["decision_kept"] == 0 and e["decision_max_H"] < e["tau"], e
    assert e["kept_share_low_bins"] > max(0.6, 2 * sum(s["token_share"][:2])), (e, s["token_share"])
    # 5. Two short runs with the same seed: the same first rollout, all steps logged, evaluated.
    runs = s["train"]
    assert set(runs) == {"grpo", "ar_lopti"}
    assert runs["grpo"]["steps"] == runs["ar_lopti"]["steps"] > 0
    assert runs["grpo"]["reward"][0] == runs["ar_lopti"]["reward"][0]
    assert set(s["eval_accuracy"]) == {"warm start", "grpo", "ar_lopti"}
    assert all(0 <= v <= 1 for v in s["eval_accuracy"].values())
    # RL selects the derivations: in both runs the share of samples that derive rises (mean
    # of the last 3 steps above the first step's), and greedy accuracy on the 50 puzzles
    # rises above the warm start's (which guesses) by at least 0.1 in both.
    for m, r in runs.items():
        ds = r["derive_share"]
        assert sum(ds[-3:]) / 3 > ds[0] + 0.2, (m, ds)
        assert s["eval_accuracy"][m] >= s["eval_accuracy"]["warm start"] + 0.1, (m, s["eval_accuracy"])
    # Plots: section 2, 3, 4 and 5 each draw one figure.
    images = sum("image/png" in out.get("data", {}) for c in nb.cells for out in c.get("outputs", []))
    assert images >= 4
    # The runs went to the temporary folder, not into the repository's runs/.
    assert (tmp_path / "runs" / "grpo" / "metrics.jsonl").exists()
