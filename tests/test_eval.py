"""evaluate.py / eval.py: report structure, failure-mode rates, CLI and bad input."""
import json
from pathlib import Path

import pytest

import eval as eval_cli
from conftest import load_script
from lopti_minimal.task import kk
from lopti_minimal.task.evaluate import evaluate_records, format_table


@pytest.fixture(scope="module")
def nano(nano_dir):
    from lopti_minimal.models import load_model_and_tokenizer
    return load_model_and_tokenizer(nano_dir, device="cpu")


def test_report_rates_partition_the_responses(nano):
    model, tok = nano
    recs = kk.load_official([3])[:3] + kk.load_official([4])[:2]
    rep = evaluate_records(model, tok, recs, max_new_tokens=16, progress=False)
    assert set(rep["per_size"]) == {3, 4}
    for v in rep["per_size"].values():
        assert v["accuracy"] + v["format_error"] + v["unparseable"] + v["wrong_answer"] == pytest.approx(1.0)
        assert v["mean_tokens"] <= 16
    assert rep["per_size"][3]["n"] == 3 and rep["settings"]["greedy"]
    # Greedy decoding is deterministic; the table has one row per size plus the mean.
    again = evaluate_records(model, tok, recs, max_new_tokens=16, progress=False, batch_size=2)
    assert again["per_size"] == rep["per_size"]
    assert len(format_table(rep).splitlines()) == 4


def test_sampled_evaluation_reports_pass_at_k(nano):
    model, tok = nano
    rep = evaluate_records(model, tok, kk.load_official([3])[:2], max_new_tokens=8, samples=3,
                           temperature=1.0, progress=False, keep_responses=True)
    assert "pass_at_k" in rep["per_size"][3] and len(rep["responses"]) == 6


def test_a_response_prefix_is_forced_and_scored_as_part_of_the_response(nano):
    """response_prefix (eval.py --response-prefix): every response starts with it and is
    scored with it; a prefix that holds a whole right answer makes the response right."""
    from lopti_minimal.task import prompts
    from lopti_minimal.task.reward import score_response
    model, tok = nano
    recs = kk.load_official([3])[:2]
    right = "\n" + prompts.answer_block(recs[0]["solution_text_format"])
    for prefix in ("\n ", right):
        rep = evaluate_records(model, tok, recs, max_new_tokens=4, progress=False, keep_responses=True,
                               response_prefix=prefix)
        for x, r in zip(rep["responses"], recs):
            assert x["response"].startswith(prefix)
            assert x["reward"] == score_response(x["response"], r).total
    assert score_response(right, recs[0]).total == 3.0


def test_eval_cli_on_a_model_and_a_jsonl(nano_dir, tmp_path, capsys):
    data = tmp_path / "p.jsonl"
    kk.save_jsonl(kk.load_official([5])[:2], data)
    out = tmp_path / "rep.json"
    assert eval_cli.main(["--model", nano_dir, "--data", str(data), "--max-new-tokens", "8",
                          "--out", str(out), "--no-progress", "--save-responses"]) == 0
    rep = json.loads(out.read_text())
    assert list(rep["per_size"]) == ["5"] and rep["per_size"]["5"]["n"] == 2
    assert (tmp_path / "rep.responses.jsonl").exists()
    assert "mean" in capsys.readouterr().out


@pytest.mark.parametrize("args, words", [
    (["--data", "/nonexistent.jsonl"], "cannot read"),
    (["--sizes", "9"], "3..7"),
    (["--samples", "0"], "samples"),
    (["--mmap-threshold-mb", "-1"], "mmap-threshold"),
])
def test_eval_cli_bad_input(args, words, nano_dir, capsys):
    assert eval_cli.main(["--model", nano_dir, "--no-progress", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err


def test_eval_cli_passes_the_mmap_threshold(nano_dir, tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(eval_cli.host_memory, "bound_process_memory", seen.append)
    data = tmp_path / "p.jsonl"
    kk.save_jsonl(kk.load_official([3])[:1], data)
    for flag, want in (([], 4), (["--mmap-threshold-mb", "0"], 0)):
        assert eval_cli.main(["--model", nano_dir, "--data", str(data), "--max-new-tokens", "4",
                              "--out", str(tmp_path / "r.json"), "--no-progress", *flag]) == 0
        assert seen[-1] == want


def test_eval_cli_bad_model(capsys):
    assert eval_cli.main(["--model", "/nonexistent/dir", "--no-progress"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def _write_run(folder, official3, heldout=None, derive=None, low=(0.2, 0.25)):
    folder.mkdir()
    per_size = {str(n): {"accuracy": official3 / (n - 2)} for n in range(3, 8)}
    (folder / "eval_final.json").write_text(json.dumps({"per_size": per_size}))
    if heldout is not None:
        (folder / "eval_heldout3.json").write_text(json.dumps({"per_size": {"3": {"accuracy": heldout}}}))
    if derive is not None:
        rows = [{"step": i + 1, "derive_share": d, "low_fraction": low[0] if i == 0 else low[1],
                 "reward": 0.0, "accuracy": 0.0, "response_len": 10.0} for i, d in enumerate(derive)]
        (folder / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    return str(folder)


def test_rl_summary_tables_means_and_selection_step(tmp_path, capsys):
    """scripts/rl_summary.py (the README's tables): per-size rows, the mean row over the
    run folders only, the first step with >= 80% derivations, and a column some runs lack
    marked with how many have it."""
    rs = load_script("scripts/rl_summary.py")
    before = _write_run(tmp_path / "warm", 0.1, heldout=0.2)
    a = _write_run(tmp_path / "a", 0.4, heldout=0.5, derive=[0.1, 0.5, 0.8, 0.9])
    b = _write_run(tmp_path / "b", 0.6, derive=[0.2, 0.3, 0.4])
    rs.main([a, b, "--before", before, "--plot", str(tmp_path / "seeds.png")])
    out = capsys.readouterr().out
    assert "| before RL: warm | 0.100 | 0.050 | 0.033 | 0.025 | 0.020 |" in out
    assert "| **mean of 2** | **0.500** | **0.250** |" in out                  # before not averaged
    assert "| a | 0.400 | 0.500 |  |  | 0.10 -> 0.90 (3) | 0.200 / 0.250 |  |" in out
    assert "| b | 0.600 |  |  |  | 0.20 -> 0.40 (never) |" in out
    assert "| **mean of 2** | **0.500** | 0.500 (1 of 2) |" in out
    assert (tmp_path / "seeds.png").stat().st_size > 1000
    with pytest.raises(SystemExit):
        rs.main([str(tmp_path / "missing")])
    rs.main(["first=" + a, b])                          # LABEL=FOLDER names a row
    out = capsys.readouterr().out
    assert "| first | 0.400 | 0.500 |" in out and "| b | 0.600 |" in out
    with pytest.raises(SystemExit):
        rs.main(["first=" + str(tmp_path / "missing")])


def test_rl_summary_reads_a_study_runs_heldout_file(tmp_path):
    """A study run writes its held-out evaluation as eval_heldout.json; rl_summary reads it
    when eval_heldout3.json is absent, and prefers eval_heldout3.json when both exist."""
    rs = load_script("scripts/rl_summary.py")
    run = Path(_write_run(tmp_path / "s", 0.4))
    (run / "eval_heldout.json").write_text(json.dumps({"per_size": {"3": {"accuracy": 0.55}}}))
    assert rs.read_folder(run)["held-out greedy"] == 0.55
    (run / "eval_heldout3.json").write_text(json.dumps({"per_size": {"3": {"accuracy": 0.6}}}))
    assert rs.read_folder(run)["held-out greedy"] == 0.6
