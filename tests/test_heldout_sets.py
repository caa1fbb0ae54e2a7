"""The held-out sets data/heldout{3,4,5}.jsonl (scripts/heldout_set.py) and lm_warmstart's
--exclude, which keeps them out of supervised training.

"Held out" is checked against the generators themselves, not against the script's own
lists: the RL prompt sets as plumbing.rl_prompt_set builds them for every preset (and for
a preset that would train on 4 or 5 people), and the warm-start streams as
warmstart_data.PuzzleStream draws them, at a few chunk numbers (the first ones and the
last the script covers), so the test stays seconds."""
from __future__ import annotations

import glob
import json
import subprocess
import sys
from pathlib import Path

import pytest

from lopti_minimal.experiments import lm_warmstart as lw
from lopti_minimal.experiments.warmstart_data import PuzzleStream
from lopti_minimal.task import kk

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import heldout_set  # noqa: E402

SIZES = (3, 4, 5)
FILES = [f"data/heldout{n}.jsonl" for n in SIZES]


@pytest.fixture(scope="module")
def sets() -> dict[int, list[dict]]:
    return {n: kk.load_jsonl(ROOT / f) for n, f in zip(SIZES, FILES)}


def test_sets_have_their_size_and_count(sets):
    """400 distinct puzzles of N people each (keys differ, not only the names)."""
    for n, records in sets.items():
        assert len(records) == 400
        assert {r["n_people"] for r in records} == {n}
        assert len(kk.keys_of(records)) == 400


def test_no_official_puzzle(sets):
    official = kk.official_keys()
    for records in sets.values():
        assert not kk.keys_of(records) & official


def test_no_rl_prompt_set_puzzle(sets, tmp_path):
    """No puzzle of an RL prompt set any preset builds: its own rl_sizes and, for each size
    N, rl_sizes=(N,) (a future SmolLM2 preset on 4 people: smollm2-kk with rl_sizes=(4,)).
    Built afresh in a temporary cache, as a run on a new machine would."""
    from lopti_minimal.config import PRESETS, make_config
    from lopti_minimal.plumbing import rl_prompt_set
    keys = set()
    for preset in PRESETS:
        cfg = make_config(preset)
        for sizes in {cfg.rl_sizes, *((n,) for n in SIZES)}:
            records, _ = rl_prompt_set(make_config(preset, rl_sizes=sizes, cache_dir=str(tmp_path)), progress=False)
            keys |= kk.keys_of(records)
    assert len(keys) > 900 * len(SIZES)              # the sets were built
    for records in sets.values():
        assert not kk.keys_of(records) & keys


def stream_chunk(seed: int, chunk_number: int, n: int, exclude: set) -> set:
    """Keys of the n-person chunk a PuzzleStream(seed) draws as its chunk_number-th chunk
    (chunks of any size count: PuzzleStream._chunk_seed), drawn by the stream itself."""
    stream = PuzzleStream(seed, exclude=exclude)
    stream.calls = chunk_number - 1
    return kk.keys_of([stream.next(n) for _ in range(stream.chunk)])


def test_no_warm_start_stream_puzzle(sets):
    """The tiny warm start's stream (seed 0) and lm_warmstart's (seeds 0-3, not for 3
    people: those runs all excluded heldout3) never draw a held-out puzzle: at chunk
    numbers 1, 2 and the last the script covers, whether the run left out only the
    official sets or every held-out file too."""
    official = kk.official_keys()
    every = lw.excluded_keys(",".join(FILES))
    for n, records in sets.items():
        held = kk.keys_of(records)
        plan = heldout_set.stream_plan(n, 3000, heldout_set.LM_SEEDS, heldout_set.LM_CHUNKS)
        assert set(plan) == ({0} if n == 3 else {0, 1, 2, 3})
        for seed, chunks in plan.items():
            for k in (1, 2, chunks):
                for exclude in (official, every):
                    drawn = stream_chunk(seed, k, n, exclude)
                    assert len(drawn) == 256 and not drawn & held, (n, seed, k)


def test_lm_warmstart_runs_fit_the_bounds():
    """The facts the script's stream bounds rest on, for every lm_warmstart run on record:
    a seed in LM_SEEDS, heldout3 excluded, and at most D / 128 + 3 chunk numbers drawn
    (D: steps x batch_size + skipped targets), with LM_CHUNKS 8 times that or more."""
    runs = [json.load(open(f)) for f in glob.glob(str(ROOT / "checkpoints/*/warmstart.json"))
            + glob.glob(str(ROOT / "results/**/warmstart.json"), recursive=True)]
    runs = [r for r in runs if "batch_size" in r["config"]]       # lm_warmstart's, not the tiny model's
    assert len(runs) >= 4
    for r in runs:
        c = r["config"]
        assert c["seed"] in heldout_set.LM_SEEDS and "data/heldout3.jsonl" in c["exclude"]
        drawn = c["steps"] * c["batch_size"] + r["skipped_targets"]
        assert drawn / 128 + len(c["sizes"]) <= heldout_set.LM_CHUNKS / 8


def test_excluding_the_new_sets_changes_no_draw():
    """A run that excludes every held-out file draws the same 4-person puzzles as one that
    excluded heldout3 only (every run before heldout4/5): the shipped runs stay reproducible
    under the new --exclude default."""
    old, new = lw.excluded_keys("data/heldout3.jsonl"), lw.excluded_keys("data/heldout*.jsonl")
    assert old < new
    for seed in (0, 1):
        a, b = PuzzleStream(seed, exclude=old), PuzzleStream(seed, exclude=new)
        assert [a.next(4)["quiz"] for _ in range(600)] == [b.next(4)["quiz"] for _ in range(600)]


def test_exclude_takes_several_files_and_patterns():
    """One path (every run so far), comma-separated paths, a pattern; duplicates once."""
    assert lw.exclude_files("data/heldout3.jsonl") == ["data/heldout3.jsonl"]
    assert lw.exclude_files("data/heldout3.jsonl, data/heldout5.jsonl") == [FILES[0], FILES[2]]
    assert lw.exclude_files("data/heldout*.jsonl") == FILES
    assert lw.exclude_files("data/heldout4.jsonl,data/heldout*.jsonl") == [FILES[1], FILES[0], FILES[2]]
    assert lw.exclude_files("") == [] and lw.exclude_files(None) == []
    keys = lw.excluded_keys("data/heldout*.jsonl")
    for f in FILES:
        assert kk.keys_of(kk.load_jsonl(ROOT / f)) <= keys
    assert kk.official_keys() <= lw.excluded_keys("")
    for bad, why in (("data/heldout9.jsonl", "no such file"), ("data/nothing*.jsonl", "no file matches")):
        with pytest.raises(SystemExit, match=why):
            lw.exclude_files(f"data/heldout3.jsonl,{bad}")


def test_a_run_records_the_files_and_resumes_an_old_state(nano_dir):
    """A new run stores the expanded files (so --resume excludes the same ones); a state
    saved before the patterns (a single path) resumes with that path."""
    from lopti_minimal import models
    import torch

    def start(cfg, resume=None):
        model, tok = models.load_model_and_tokenizer(nano_dir, dtype=torch.float32, device="cpu")
        return lw.LMWarmStart(cfg, model, tok, resume=resume, log=lambda s: None)

    cfg = lw.LMWarmStartConfig(model=nano_dir, out="unused", lora_rank=2, threads=1, progress=False)
    assert cfg.exclude == "data/heldout*.jsonl"
    run = start(cfg)
    assert run.cfg.exclude == ",".join(FILES) == run.state()["config"]["exclude"]
    state = run.state()
    state["config"] = lw.LMWarmStartConfig(**dict(state["config"], exclude="data/heldout3.jsonl"))
    resumed = start(state["config"], resume=state)
    assert resumed.cfg.exclude == "data/heldout3.jsonl"
    assert resumed.stream.exclude == lw.excluded_keys("data/heldout3.jsonl")


@pytest.mark.parametrize("args, message", [(["--size", "6"], "error: --size 6: held-out sets are made for 3, 4 or 5 people"),
                                           (["--size", "x"], "error: argument --size: invalid int value: 'x'")])
def test_cli_refuses_a_bad_size_in_one_line(args, message):
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "heldout_set.py"), *args],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stderr.strip() == message and not p.stdout
