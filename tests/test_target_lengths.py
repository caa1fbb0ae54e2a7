"""scripts/target_lengths.py: the faithful trace's length in the model's tokenizer."""
from conftest import ROOT, load_script

tl = load_script("scripts/target_lengths.py")


def test_describe_counts_the_targets_over_each_budget():
    d = tl.describe([10, 20, 30, 40], [15, 40])
    assert d["puzzles"] == 4 and d["max"] == 40 and d["p50"] == 25.0
    assert d["over"] == {15: 0.75, 40: 0.0}           # strictly longer: 40 fits a budget of 40


def test_lengths_are_the_warm_starts_targets_and_grow_with_the_puzzle(smollm2_dir, capsys):
    from transformers import AutoTokenizer
    from lopti_minimal.experiments.lm_warmstart import encode
    from lopti_minimal.task import kk
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    recs = {n: kk.load_jsonl(ROOT / f"data/heldout{n}.jsonl")[:20] for n in (3, 5)}
    lens = {n: tl.target_lengths(r, tok, "compact") for n, r in recs.items()}
    ids, p = encode(tok, recs[3][0], "compact")
    assert lens[3][0] == len(ids) - p and ids[-1] == tok.eos_token_id
    assert sum(lens[5]) > sum(lens[3])               # five people: longer searches
    assert tl.main([str(ROOT / "data/heldout3.jsonl"), "--budgets", "384", "--tokenizer", smollm2_dir]) == 0
    assert "heldout3.jsonl" in capsys.readouterr().out


def test_a_missing_file_is_one_line_and_exit_2(capsys):
    assert tl.main(["no/such.jsonl"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
