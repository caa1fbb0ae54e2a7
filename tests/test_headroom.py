"""scripts/headroom.py: GRPO's headroom on a start, sampled as the trainer samples.

The shipped tiny warm start on 4 held-out puzzles, G 4, a 48-token budget, 2 puzzles a
chunk: a few seconds a run."""
import dataclasses
import json

import pytest
import torch

from conftest import ROOT, load_script

hr = load_script("scripts/headroom.py")
DATA = str(ROOT / "data" / "heldout3.jsonl")
G, BUDGET, P = 4, 48, 2


def args(out, *extra):
    return ["--model", str(ROOT / "checkpoints" / "tiny-warm"), "--data", DATA, "--limit", "4",
            "--group-size", str(G), "--max-new-tokens", str(BUDGET), "--prompts-per-step", str(P),
            "--out", str(out), "--no-progress", *extra]


def lines_of(out):
    return [json.loads(x) for x in out.with_suffix(".jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One finished run: (summary path, its summary, its per-puzzle lines)."""
    out = tmp_path_factory.mktemp("headroom") / "h.json"
    assert hr.main(args(out)) == 0
    return out, json.loads(out.read_text()), lines_of(out)


def test_summary_agrees_with_the_per_puzzle_lines(run):
    from lopti_minimal.grpo import group_advantages
    _, s, lines = run
    assert [x["puzzle"] for x in lines] == [0, 1, 2, 3] and s["puzzles"] == s["requested"] == 4
    assert s["complete"] and s["samples"] == 4 * G
    for x in lines:
        assert len(x["rewards"]) == len(x["tokens"]) == len(x["cut"]) == len(x["bins"]) == G
        # informative = rewards not all equal = a nonzero GRPO advantage somewhere in the group
        assert x["informative"] == (len(set(x["rewards"])) > 1)
        assert x["informative"] == bool(group_advantages(torch.tensor(x["rewards"]), G).abs().sum() > 0)
        assert x["correct"] == sum(r == 3.0 for r in x["rewards"])
        assert x["mixed"] == (0 < x["correct"] < G)
        for n, cut, bins, below in zip(x["tokens"], x["cut"], x["bins"], x["below_half"]):
            assert sum(bins) == n and 1 <= n <= BUDGET
            assert below == bins[0] + bins[1]       # pi_old < 0.5: the two bins below 0.5
            assert not cut or n == BUDGET           # a cut-off response used the whole budget
    assert s["accuracy"]["mean"] == pytest.approx(sum(x["correct"] for x in lines) / (4 * G))
    assert s["informative"]["mean"] == sum(x["informative"] for x in lines) / 4
    assert s["informative_per_step"]["mean"] == pytest.approx(P * s["informative"]["mean"])
    assert s["tokens"] == sum(sum(x["tokens"]) for x in lines)
    assert s["below_half"] == pytest.approx(sum(sum(x["below_half"]) for x in lines) / s["tokens"])
    assert sum(s["bin_share"]) == pytest.approx(1.0)
    assert s["cut_off"] == sum(sum(x["cut"]) for x in lines) / (4 * G)
    assert s["lengths"]["all"]["max"] == max(max(x["tokens"]) for x in lines)
    assert s["eta"] == 0.5 and s["machine"]["threads"] >= 1
    # what the tokens below 0.5 are: every one counted once, in one kind
    for x in lines:
        assert sum(x["below_half_kinds"].values()) == sum(x["below_half"])
    total = sum(sum(x["below_half"]) for x in lines)
    assert total == 0 or sum(s["below_half_kinds"].values()) == pytest.approx(1.0)


def test_low_tokens_are_told_apart_by_what_they_are():
    """headroom.low_token_kinds on a phrased derivation and a guess of the tiny tokenizer:
    a token below 0.5 that is a phrasing choice, the first token, a role in the answer, or
    the reasoning (a name in a check), each in its kind."""
    import random
    from transformers import AutoTokenizer
    from lopti_minimal.task import behaviours, dataset
    tok = AutoTokenizer.from_pretrained(str(ROOT / "checkpoints" / "tiny-warm"))
    rec = dataset.generate_records(3, 1, seed=3)[0]
    text = behaviours.derive_response(rec, random.Random(1), tails=True)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    decoded, spans = hr.token_spans(tok, ids)
    assert decoded == tok.decode(ids) and spans[-1][1] == len(decoded)
    words = [decoded[s:e] for s, e in spans]

    def kinds_of(i):
        return hr.low_token_kinds(tok, ids, [k == i for k in range(len(ids))])
    then = next(i for i, w in enumerate(words) if w.strip() == "then")       # a tail word
    name = next(i for i, w in enumerate(words) if i > 3 and w.strip() == rec["names"][0])
    role = next(i for i, w in enumerate(words) if spans[i][0] > decoded.find("<answer>")
                and w.strip() in ("knight", "knave"))
    assert kinds_of(then)["choice"] == 1 and kinds_of(0)["first"] == 1
    assert kinds_of(name)["other"] == 1 and kinds_of(role)["answer"] == 1


def test_a_chunk_is_the_trainers_batch_and_pi_old_its_bits(tmp_path):
    """--order run: chunk 0 holds the prompts of an RL run's step 0 on this file and is
    sampled with that step's generator, so its rewards and pi_old are trainer.make_batch's,
    to the bit (pi_old recomputed teacher-forced under bf16 autocast, in the trainer's row
    order)."""
    from lopti_minimal import plumbing, trainer
    from lopti_minimal.grpo import sort_by_length
    from lopti_minimal.models import encode_prompts
    from lopti_minimal.task.evaluate import read_records
    a = hr.parse_args(args(tmp_path / "h.json", "--order", "run", "--prompts-per-step", "3"))
    cfg = hr.make_config(a)
    model, tok = plumbing.load_policy(cfg)
    records, ids = encode_prompts(read_records(DATA), tok, cfg.prompt_style, cfg.max_prompt_len)
    chosen = hr.select(len(records), cfg, "run", 4)
    step0 = plumbing.step_prompt_indices(cfg.seed, 0, 3, len(records))
    assert chosen[:3] == step0 and len(set(chosen)) == 4
    recs, pids = [records[i] for i in step0], [ids[i] for i in step0]
    batch, rewards, _ = hr.sample_chunk(model, tok, recs, pids, cfg, 0)
    sb = trainer.make_batch(model, None, tok, recs, pids, dataclasses.replace(cfg, kl_coef=0.0), 0)
    assert rewards == sb.rewards.tolist()
    assert torch.equal(sort_by_length(batch, cfg).old_logprobs, sb.batch.old_logprobs)
    assert torch.equal(sort_by_length(batch, cfg).response_ids, sb.batch.response_ids)


def test_a_rerun_resumes_without_sampling_what_is_done(run, tmp_path, monkeypatch):
    from lopti_minimal import trainer
    out0, _, lines0 = run
    out = tmp_path / "h.json"
    calls = []
    real = trainer.rollout
    monkeypatch.setattr(trainer, "rollout", lambda *a, **k: calls.append(1) or real(*a, **k))
    # everything done: nothing sampled, the lines untouched
    jsonl = out.with_suffix(".jsonl")
    jsonl.write_text(out0.with_suffix(".jsonl").read_text())
    before = jsonl.read_text()
    assert hr.main(args(out)) == 0
    assert calls == [] and jsonl.read_text() == before and json.loads(out.read_text())["complete"]
    # the last chunk lost a line and a half-written one follows (a kill mid-write): that
    # chunk alone is sampled again, its draws the same, so the file is as before
    jsonl.write_text("".join(json.dumps(x) + "\n" for x in lines0[:3]) + '{"puzzle": 3, "rew')
    assert hr.main(args(out)) == 0
    assert calls == [1]

    def strip(xs):
        return [{k: v for k, v in x.items() if k != "chunk_seconds"} for x in xs]
    assert strip(lines_of(out)) == strip(lines0)


def exit_code(argv) -> int:
    """main's return value, or the code of the SystemExit an argparse error raises."""
    try:
        return hr.main(argv)
    except SystemExit as e:
        return e.code


@pytest.mark.parametrize("extra, words", [
    (["--data", "/nonexistent/puzzles.jsonl"], "cannot read K&K data"),
    (["--group-size", "1"], "group-size"),
    (["--limit", "0"], "--limit"),
    (["--out", "x.txt"], ".json"),
    (["--preset", "nope"], "invalid choice"),
])
def test_bad_input_is_one_line_and_exit_2(extra, words, tmp_path, capsys):
    assert exit_code(args(tmp_path / "h.json") + extra) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err


def test_lines_of_other_settings_are_refused(run, tmp_path, capsys):
    out0, _, _ = run
    out = tmp_path / "h.json"
    out.with_suffix(".jsonl").write_text(out0.with_suffix(".jsonl").read_text())
    assert hr.main(args(out, "--seed", "1")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "other settings" in err[0]
