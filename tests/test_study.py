"""lopti_minimal/experiments/ (study.py, grid.py, stats.py, report.py): the multi-seed study.

Statistics against hand-computed numbers, aggregation and the report on synthetic run
directories, skip/resume/refusal logic with a fake train function (no model), and one
real end-to-end mini study on the ci preset (2 methods x 1 seed)."""
import dataclasses
import json
import os
import re
import time
from pathlib import Path

import pytest

from conftest import ROOT
from lopti_minimal import runs
from lopti_minimal.config import TrainConfig, make_config
from lopti_minimal.runs import config_to_json
from lopti_minimal.experiments import aggregate as A
from lopti_minimal.experiments import grid as G
from lopti_minimal.experiments import report as R
from lopti_minimal.experiments import stats
from lopti_minimal.experiments import study as S
from lopti_minimal.experiments.plan import PAIRED_GRIDS

WARM = ROOT / "checkpoints" / "tiny-warm" / "config.json"
HAS_ORDER = "lopti_order" in {f.name for f in dataclasses.fields(TrainConfig)}


# ----------------------------------------------------------------------------- helpers

@pytest.fixture
def fake_model(tmp_path):
    """A folder that looks like a model to the fingerprint (the fake trainer never loads it)."""
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text("{}")
    (d / "model.safetensors").write_bytes(b"weights-v1")
    return str(d)


def write_finished(run_dir: Path, cfg, acc: dict, rewards=(0.0, 0.5, 1.0), step_s=1.0, fmt=0.0, heldout=None,
                   low=None, extra=None, along=None, machine=None):
    """What trainer.train leaves behind, reduced to what study.py reads (derivation share =
    the reward; the held-out evaluation only if ``heldout`` is given; ``low``: the logged
    low_fraction per step; ``extra``: more metrics per step; ``along``: {step: held-out
    accuracy} of the trainer's evaluations along the run; ``machine``: run.json's record of
    the machine, none if not given)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "run.json").write_text(json.dumps({"kind": runs.RUN_MARKER, "config": config_to_json(cfg),
                                                  **({"machine": machine} if machine else {})}))
    with open(run_dir / "metrics.jsonl", "w") as f:
        for i, r in enumerate(rewards):
            f.write(json.dumps({"step": i + 1, "reward": r, "accuracy": r / 10, "step_s": step_s,
                                "sample_s": step_s / 2, "update_s": step_s / 4, "derive_share": r,
                                "truncated": 0.0, **({"low_fraction": low[i]} if low else {}),
                                **(extra[i] if extra else {})}) + "\n")
    if heldout is not None:
        (run_dir / G.HELDOUT_FILE).write_text(json.dumps({"overall": {"accuracy": heldout}, "seconds": 4.0}))
    for step, a in (along or {}).items():
        (run_dir / runs.heldout_step_file(step)).write_text(json.dumps({"overall": {"accuracy": a}}))
    (run_dir / "eval_final.json").write_text(json.dumps(
        {"per_size": {str(n): {"accuracy": a, "format_error": fmt, "truncated": fmt, "mean_tokens": 100 + 100 * fmt}
                      for n, a in acc.items()}, "seconds": 2.0}))


def synthetic_study(out: Path, model: str) -> Path:
    """Runs with known numbers (accuracy on sizes 3 and 4, equal per size, so avg = the value):
    GRPO .2 .3 .4 (seeds 0-2); AR .3 .35 .5 .9 (seeds 0-3); Lopti .3 .3 .3 (seeds 0-2);
    plus a GRPO seed 3 with another step count, which must be left out. Format errors:
    GRPO .1 .2 .3, Lopti 0 .1 .2 (always .1 fewer), AR none."""
    table = {G.GRPO: [.2, .3, .4], G.Variant("ar", alpha=0.2): [.3, .35, .5, .9],
             G.Variant("lopti", eta=0.4): [.3, .3, .3]}
    fmt = {G.GRPO: [.1, .2, .3], G.Variant("lopti", eta=0.4): [0, .1, .2]}
    # Held-out accuracy: GRPO = its accuracy, Lopti = its accuracy + .05, AR none.
    held = {G.GRPO: 0.0, G.Variant("lopti", eta=0.4): 0.05}
    for v, accs in table.items():
        for seed, a in enumerate(accs):
            spec = S.RunSpec("ci", v, seed, "main")
            cfg = S.run_config(spec, out, {"model": model, "steps": 3})
            write_finished(spec.run_dir(out), cfg, {3: a, 4: a}, fmt=fmt.get(v, [0.0] * 4)[seed],
                           heldout=a + held[v] if v in held else None)
    spec = S.RunSpec("ci", G.GRPO, 3, "main")
    write_finished(spec.run_dir(out), S.run_config(spec, out, {"model": model, "steps": 5}), {3: .9, 4: .9})
    # An unfinished run (no eval_final.json) is listed, not aggregated.
    spec = S.RunSpec("ci", G.GRPO, 4, "main")
    d = spec.run_dir(out)
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"kind": runs.RUN_MARKER, "config": config_to_json(
        S.run_config(spec, out, {"model": model, "steps": 3}))}))
    return out


def fake_train(cfg, resume=False, log=None, reward_fn=None):
    """Stands in for trainer.train: writes a finished run whose accuracy depends on the
    method and seed. A run named in $FAKE_CRASH writes run.json and then fails once."""
    rd = Path(cfg.run_dir)
    if not resume:
        assert not rd.exists() or not any(rd.iterdir()), "a fresh run must get an empty directory"
        rd.mkdir(parents=True, exist_ok=True)
        (rd / "run.json").write_text(json.dumps({"kind": runs.RUN_MARKER, "config": config_to_json(cfg)}))
    with open(rd / "calls.txt", "a") as f:
        f.write(f"{'resume' if resume else 'new'} threads={cfg.threads}\n")
    log("[run] fake")
    crash = rd.parent / f"{rd.name}.crash"
    if crash.exists():
        crash.unlink()
        raise RuntimeError("boom")
    if (rd.parent / "INTERRUPT").exists():
        # A real run takes minutes, so the interrupt reaches the study while runs are in
        # flight. An instant fake would let the workers race through the pool's queue before
        # the main process cancels it (9 runs started once, under load), a timing artefact.
        time.sleep(0.5)
        raise KeyboardInterrupt
    a = {"grpo": .3, "ar": .35, "lopti": .3, "ar_lopti": .4}[cfg.method] + 0.01 * cfg.seed
    write_finished(rd, cfg, {3: a})


def calls(out, name, preset="ci"):
    p = Path(out) / preset / name / "calls.txt"
    return p.read_text().split() if p.exists() else []


# ----------------------------------------------------------------------------- statistics

def test_t_table_matches_the_expansion_and_known_values():
    assert stats.t975(1) == 12.706 and stats.t975(4) == 2.776 and stats.t975(30) == 2.042
    for df in range(10, 31):        # two independent sources agree
        assert abs(stats.t975(df) - stats.t975_expansion(df)) < 1.5e-3, df
    assert abs(stats.t975(1000) - 1.96234) < 1e-4 and abs(stats.t975(60) - 2.0003) < 1e-3
    with pytest.raises(ValueError):
        stats.t975(0)


def test_mean_ci_hand_checked():
    # mean .3; s = sqrt(0.1 / 4) = 0.158114; se = s / sqrt(5) = 0.0707107; half = 2.776 * se
    c = stats.mean_ci([0.1, 0.2, 0.3, 0.4, 0.5])
    assert c["n"] == 5 and c["mean"] == pytest.approx(0.3)
    assert c["sd"] == pytest.approx(0.158114, abs=1e-6)
    assert c["half"] == pytest.approx(0.196293, abs=1e-6)
    assert (c["lo"], c["hi"]) == (pytest.approx(0.103707, abs=1e-6), pytest.approx(0.496293, abs=1e-6))
    one = stats.mean_ci([0.7])
    assert one["mean"] == 0.7 and one["half"] is None and one["lo"] is None
    assert stats.mean_ci([])["mean"] is None


def test_paired_difference_hand_checked():
    # diffs .1 .05 .1: mean .083333, s = 0.028868, se = 0.016667, half = 4.303 * se = 0.071717
    d = stats.paired_diff({0: .3, 1: .35, 2: .5, 7: .9}, {0: .2, 1: .3, 2: .4, 5: .1})
    assert d["seeds"] == [0, 1, 2] and d["n"] == 3
    assert d["mean"] == pytest.approx(0.083333, abs=1e-6) and d["half"] == pytest.approx(0.071717, abs=1e-6)
    assert d["lo"] == pytest.approx(0.011617, abs=1e-6) and d["excludes_zero"] is True
    assert d["base_mean"] == pytest.approx(0.3) and d["rel"] == pytest.approx(0.277778, abs=1e-6)
    assert d["rel_lo"] == pytest.approx(0.011617 / 0.3, abs=1e-5)
    # The unpaired view of the same numbers would not exclude 0: pairing is what helps.
    assert stats.mean_ci([.3, .35, .5])["lo"] < stats.mean_ci([.2, .3, .4])["hi"]
    single = stats.paired_diff({0: .5}, {0: .4})
    assert single["excludes_zero"] is None and single["mean"] == pytest.approx(0.1)


# ----------------------------------------------------------------------------- plan

def test_selection_and_detectable_difference_hand_checked():
    ms = [{"derive_share": v, "truncated": t} for v, t in ((.2, 0), (.5, .1), (.85, 0), (.7, .1), (.9, 0))]
    assert A.selection(ms) == {"steps_to_80": 3.0, "derive_auc": pytest.approx(0.63),
                               "train_truncated": pytest.approx(0.04)}
    # Never selected within the run: counted as steps + 1.
    assert A.selection([{"derive_share": .1}, {"derive_share": .5}])["steps_to_80"] == 3.0
    # n = 5 pairs, sd .1: (t_.975,4 + t_.80,4) * .1 / sqrt(5) = (2.776 + 0.941) * .1 / 2.23607
    assert stats.detectable(0.1, 5) == pytest.approx(0.166228, abs=1e-5)
    assert stats.detectable(None, 1) is None


def test_variants_are_canonical():
    assert G.Variant("ar", alpha=0.0) == G.GRPO and G.Variant("ar_lopti", alpha=0, eta=0.5) == G.Variant("lopti", eta=0.5)
    assert G.Variant("grpo", alpha=0.3, eta=0.5, order="high_first") == G.GRPO
    assert [v.name for v in G.MAIN] == ["grpo", "ar-a0.2", "lopti-e0.4", "ar_lopti-a0.3-e0.5"]
    assert G.Variant("lopti", eta=0.4, order="high_first").name == "lopti-e0.4-high_first"
    assert G.Variant.from_config({"method": "ar", "alpha": 0.2, "eta": 0.5}) == G.Variant("ar", alpha=0.2)
    assert G.Variant.from_config({"method": "lopti", "alpha": 0.3, "eta": 0.4, "lopti_order": "high_first"}) \
        == G.Variant("lopti", eta=0.4, order="high_first")
    with pytest.raises(G.StudyError, match="unknown method"):
        G.Variant("ppo")
    # The control arm: same method, two optimizer passes per rollout.
    x2 = G.Variant("grpo", ppo_epochs=2)
    assert (x2.name, x2.overrides()) == ("grpo-x2", {"method": "grpo", "ppo_epochs": 2})
    assert G.Variant.from_config({"method": "grpo", "alpha": 0.3, "ppo_epochs": 2}) == x2 != G.GRPO
    # The main grid's knobs are the table train.py --method uses.
    for v in G.MAIN:
        cfg = make_config(method=v.method)
        assert (v.alpha, v.eta) == (cfg.alpha, cfg.eta), v
    assert (G.GRPO.update_passes, x2.update_passes, G.LOPTI.update_passes, G.AR.update_passes) == (1, 2, 2, 1)


def test_isolation_arms_are_canonical_and_old_runs_keep_their_variants():
    """The optimizer-per-stage arms (lopti.py, choice 8): a Variant knob for Lopti methods only,
    absent from the names, overrides and labels of every variant at its default, so a run
    saved before the option existed (no lopti_optimizer in run.json) is the variant it was:
    every archived run in results/ reads back to its folder's name."""
    per = G.LOPTI_PER_STAGE
    assert (per.name, per.overrides()) == ("lopti-e0.4-per_stage", {"method": "lopti", "eta": 0.4,
                                                                     "lopti_optimizer": "per_stage"})
    assert per.label == "GRPO+Lopti (η=0.4, an optimizer per stage)" and per != G.LOPTI
    assert G.AR_LOPTI_PER_STAGE.name == "ar_lopti-a0.3-e0.5-per_stage"
    assert G.Variant("grpo", stage_optimizer="per_stage") == G.GRPO          # canonical: no Lopti
    assert "lopti_optimizer" not in G.LOPTI.overrides() and G.LOPTI.name == "lopti-e0.4"
    assert G.Variant.from_config({"method": "lopti", "eta": 0.4}) == G.LOPTI
    assert G.Variant.from_config({"method": "lopti", "eta": 0.4, "lopti_optimizer": "per_stage"}) == per
    with pytest.raises(G.StudyError, match="optimizer state"):
        G.Variant("lopti", eta=0.4, stage_optimizer="separate")
    cfg = S.run_config(S.RunSpec("ci", per, 0, "isolation"), "/o")
    assert cfg.lopti_optimizer == "per_stage" and G.Variant.from_config(config_to_json(cfg)) == per
    # an arm of the same comparison as the shared-state runs: only the variant differs
    assert G.setting_key(cfg) == G.setting_key(S.run_config(S.RunSpec("ci", G.LOPTI, 0, "main"), "/o"))
    archived = sorted((ROOT / "results").glob("study-*/*/*/run.json"))
    assert archived
    for rj in archived:
        c = json.loads(rj.read_text())["config"]
        assert f"{G.Variant.from_config(c).name}-s{c['seed']}" == rj.parent.name, rj


def test_plan_dedups_shared_runs_and_is_seed_major():
    specs = S.plan_runs(["all"], 5, 3, "cpu-tiny")
    # main 4 x 5 = 20; alpha adds 0.1 0.3 0.5 (0 = GRPO, 0.2 = main AR) x 3; eta adds 0.3 0.5
    # 0.7 (0.4 = main Lopti) x 3; order adds nothing (its high-first Lopti is the criterion's).
    # control adds GRPO with two optimizer steps per rollout x 5 (the main grid's seeds);
    # criterion adds GRPO at 2x lr and both Lopti arms reversed and with a random split x 5;
    # isolation both Lopti arms with an optimizer per stage x 5;
    # reinforce_pp adds REINFORCE++ and REINFORCE++ +AR+Lopti x 3; token_fixes its four
    # later methods x 3 (its GRPO, GRPO x2 and AR+Lopti are the main grid's and the control's).
    assert len(specs) == 20 + 5 + 25 + 10 + 6 + 9 + 9 + 0 + 12
    assert len({(s.variant, s.seed) for s in specs}) == len(specs)
    # main, control, criterion and isolation together, seed-major: a study stopped early has
    # complete, paired seeds.
    assert [(s.variant.name, s.seed) for s in specs[:13]] == [
        ("grpo", 0), ("ar-a0.2", 0), ("lopti-e0.4", 0), ("ar_lopti-a0.3-e0.5", 0), ("grpo-x2", 0),
        ("grpo-lrx2", 0), ("lopti-e0.4-high_first", 0), ("lopti-e0.4-random", 0),
        ("ar_lopti-a0.3-e0.5-high_first", 0), ("ar_lopti-a0.3-e0.5-random", 0),
        ("lopti-e0.4-per_stage", 0), ("ar_lopti-a0.3-e0.5-per_stage", 0), ("grpo", 1)]
    assert all(s.grid in ("main", "control", "criterion", "isolation") for s in specs[:60])
    assert [s.seed for s in specs[:60] if s.grid == "control"] == [0, 1, 2, 3, 4]
    assert [s.variant.name for s in specs[60:62]] == ["rpp-grpo", "rpp-ar_lopti-a0.3-e0.5"]
    assert S.run_config(specs[60], "/o").estimator == "reinforce_pp"
    assert max(s.seed for s in specs[60:]) == 2
    # The criterion grid alone: its 9 arms (the baselines included) x --seeds, seed-major.
    crit = S.plan_runs(["criterion"], 5, 3, "cpu-tiny")
    assert len(crit) == 45 and [s.variant for s in crit[:9]] == list(G.CRITERION) and crit[9].seed == 1
    only = S.plan_runs(["main"], 2, 0, "ci", only={"grpo", "ar_lopti"})
    assert [s.run_dir("/o").as_posix() for s in only] == [
        "/o/ci/grpo-s0", "/o/ci/ar_lopti-a0.3-e0.5-s0", "/o/ci/grpo-s1", "/o/ci/ar_lopti-a0.3-e0.5-s1"]
    # --skip-seeds: the token-fix sweep without seed 0 (its baselines ran on another CPU kind)
    tok = S.plan_runs(["token_fixes"], 5, 5, "cpu-tiny", skip_seeds={0})
    assert {s.seed for s in tok} == {1, 2, 3, 4} and len(tok) == 4 * len(G.GRIDS["token_fixes"])
    with pytest.raises(G.StudyError, match="unknown grid"):
        S.plan_runs(["nope"], 1, 1, "ci")


def test_every_run_of_a_grid_has_the_same_budget(tmp_path):
    specs = S.plan_runs(["main", "alpha", "eta"], 2, 2, "cpu-tiny")
    cfgs = [S.run_config(s, tmp_path, {"steps": 7}) for s in specs]
    d = make_config("cpu-tiny")
    assert {(c.steps, c.prompts_per_step, c.group_size) for c in cfgs} == {(7, d.prompts_per_step, d.group_size)}
    assert len({G.setting_key(c) for c in cfgs}) == 1          # only variant and seed differ
    lopti = next(c for c in cfgs if c.method == "lopti")
    assert (lopti.eta, lopti.final_eval, lopti.progress) == (0.4, True, False)


def test_order_grid_needs_the_trainer_option(tmp_path):
    specs = S.plan_runs(["order"], 1, 2, "ci")
    keep, dropped = S.supported(specs, tmp_path, {})
    high = [s for s in specs if s.variant.order == "high_first"]
    if HAS_ORDER:
        assert keep == specs and not dropped
        assert S.run_config(high[0], tmp_path).lopti_order == "high_first"
    else:
        assert len(dropped) == len(high) == 2 and "lopti_order" in dropped[0]
        assert all(s.variant.order == "low_first" for s in keep)


# ----------------------------------------------------------------------------- running

def test_skip_resume_and_refusals_with_a_fake_trainer(tmp_path, fake_model):
    out = tmp_path / "study"
    specs = S.plan_runs(["main"], 2, 0, "ci", only={"grpo", "ar"})
    ov = {"model": fake_model, "steps": 3}
    names = ["grpo-s0", "ar-a0.2-s0", "grpo-s1", "ar-a0.2-s1"]
    assert [s.run_dir(out).name for s in specs] == names
    (out / "ci").mkdir(parents=True)
    (out / "ci" / "ar-a0.2-s0.crash").write_text("")
    echo = []

    # 1st invocation: one run fails after writing run.json; the study goes on.
    r = S.run_study(specs, out, ov, train_fn=fake_train, progress=False, echo=echo.append)
    assert len(r["done"]) == 3 and len(r["failed"]) == 1 and "boom" in r["failed"][0]["error"]
    assert all(calls(out, n) == ["new", "threads=None"] for n in names)
    crashed = out / "ci" / "ar-a0.2-s0"
    assert "RuntimeError: boom" in (crashed / "study_error.txt").read_text()
    assert json.loads((crashed / "study_time.json").read_text())["sessions"][0]["ok"] is False
    assert (out / "ci" / "grpo-s0" / "train.log").read_text() == "[run] fake\n"

    # 2nd: finished runs are skipped, the failed one is resumed, nothing else is called.
    r = S.run_study(specs, out, ov, train_fn=fake_train, progress=False, echo=echo.append)
    assert len(r["skipped"]) == 3 and r["done"] == [str(crashed)] and not r["failed"]
    assert calls(out, "ar-a0.2-s0") == ["new", "threads=None", "resume", "threads=None"]
    assert calls(out, "grpo-s0") == ["new", "threads=None"]
    assert len(json.loads((crashed / "study_time.json").read_text())["sessions"]) == 2
    log = [json.loads(l) for l in (out / "study_log.jsonl").read_text().splitlines()]
    assert [(e["ran"], e["skipped"], e["failed"]) for e in log] == [(4, 0, 1), (1, 3, 0)]
    assert log[0]["machine"]["cores"] == os.cpu_count()

    # 3rd: all done, nothing runs.
    r = S.run_study(specs, out, ov, train_fn=fake_train, progress=False, echo=echo.append)
    assert len(r["skipped"]) == 4 and not r["done"]

    # Refusals, before anything runs: a changed budget, a changed warm start, a stray folder.
    with pytest.raises(G.StudyError, match=r"different config \(steps\)"):
        S.run_study(specs, out, dict(ov, steps=4), train_fn=fake_train, progress=False, echo=echo.append)
    Path(fake_model, "model.safetensors").write_bytes(b"weights-v2")
    with pytest.raises(G.StudyError, match="warm start of preset ci changed"):
        S.run_study(specs, out, ov, train_fn=fake_train, progress=False, echo=echo.append)
    Path(fake_model, "model.safetensors").write_bytes(b"weights-v1")
    (out / "ci" / "grpo-s2").mkdir()
    (out / "ci" / "grpo-s2" / "junk").write_text("x")
    with pytest.raises(G.StudyError, match="not a lopti-minimal run"):
        S.run_study(S.plan_runs(["main"], 3, 0, "ci", only={"grpo"}), out, ov, train_fn=fake_train,
                    progress=False, echo=echo.append)
    assert calls(out, "grpo-s0") == ["new", "threads=None"]

    # Ctrl-C stops the study (and is still logged); the next call resumes that run.
    (out / "ci" / "INTERRUPT").write_text("")
    spec2 = S.plan_runs(["main"], 3, 0, "ci", only={"ar"})[2:]
    with pytest.raises(KeyboardInterrupt):
        S.run_study(spec2, out, ov, train_fn=fake_train, progress=False, echo=echo.append)
    assert len((out / "study_log.jsonl").read_text().splitlines()) == 4
    (out / "ci" / "INTERRUPT").unlink()
    S.run_study(spec2, out, ov, train_fn=fake_train, progress=False, echo=echo.append)
    assert calls(out, "ar-a0.2-s2") == ["new", "threads=None", "resume", "threads=None"]


def test_missing_warm_start_is_refused_before_any_run(tmp_path):
    specs = S.plan_runs(["main"], 1, 0, "ci", only={"grpo"})
    for model in ("checkpoints/no-such-warm-start", str(tmp_path / "missing")):
        with pytest.raises(G.StudyError, match="not found"):
            S.run_study(specs, tmp_path / "study", {"model": model}, train_fn=fake_train, progress=False,
                        echo=lambda s: None)
    assert not (tmp_path / "study" / "ci").exists()


def test_parallel_jobs_with_a_fake_trainer(tmp_path, fake_model):
    out = tmp_path / "study"
    specs = S.plan_runs(["main"], 1, 0, "ci", only={"grpo", "ar"})
    r = S.run_study(specs, out, {"model": fake_model}, train_fn=fake_train, jobs=2, threads=1,
                    progress=False, echo=lambda s: None)
    assert len(r["done"]) == 2 and not r["failed"]
    assert calls(out, "grpo-s0") == ["new", "threads=1"] and calls(out, "ar-a0.2-s0") == ["new", "threads=1"]
    assert json.loads((out / "study_log.jsonl").read_text())["jobs"] == 2


# ----------------------------------------------------------------------------- aggregation and report

def test_run_wall_time_survives_a_lost_session(tmp_path, fake_model):
    """A worker killed after training but before writing study_time.json leaves a record of
    the next session only (the held-out evaluation): the run's own step and evaluation times
    (3 x 1 s + 2 s) stand in for the lost one; a complete record is used as it is."""
    spec = S.RunSpec("ci", G.GRPO, 0, "main")
    d = spec.run_dir(tmp_path)
    write_finished(d, S.run_config(spec, tmp_path, {"model": fake_model, "steps": 3}), {3: .5, 4: .5})
    assert A.read_run(d)["wall_s"] == 5.0                      # made outside the study
    (d / "study_time.json").write_text(json.dumps({"wall_s": 0.5, "sessions": [{"status": "heldout"}]}))
    assert A.read_run(d)["wall_s"] == 5.0
    (d / "study_time.json").write_text(json.dumps({"wall_s": 9.0, "sessions": [{"status": "new"}]}))
    assert A.read_run(d)["wall_s"] == 9.0


def test_aggregate_on_synthetic_runs(tmp_path, fake_model):
    out = synthetic_study(tmp_path / "study", fake_model)
    res = A.aggregate(out, window=2)
    assert len(res["unfinished"]) == 1 and res["unfinished"][0].endswith("grpo-s4")
    pr = res["presets"]["ci"]
    assert pr["sizes"] == [3, 4] and list(pr["variants"]) == ["grpo", "ar-a0.2", "lopti-e0.4"]
    assert [e["differs_in"] for e in pr["excluded"]] == [["steps"]]
    assert pr["budget"]["responses_per_run"] == 3 * 2 * 4
    # Per variant, all its finished seeds: AR has 4.
    assert pr["variants"]["ar-a0.2"]["n"] == 4 and pr["variants"]["ar-a0.2"]["accuracy"]["avg"]["mean"] == pytest.approx(0.5125)
    assert [v["update_passes"] for v in pr["variants"].values()] == [1, 1, 2]
    assert pr["variants"]["grpo"]["timing"] == {"step_s": 1.0, "sample_s": 0.5, "update_s": 0.25, "eval_s": 2.0,
                                                "run_wall_s": 3 * 1.0 + 2.0}

    # The main table is balanced: the seeds every row has (0-2), so AR's seed 3 is not in it.
    t = pr["grids"]["main"]
    assert t["seeds"] == [0, 1, 2] and list(t["rows"]) == ["grpo", "ar-a0.2", "lopti-e0.4"]
    g = t["rows"]["grpo"]
    # .2 .3 .4: s = .1, half = 4.303 * .1 / sqrt(3) = 0.248434
    assert g["vs_grpo"] is None and g["accuracy"]["avg"]["mean"] == pytest.approx(0.3)
    assert g["accuracy"]["3"]["half"] == pytest.approx(0.248434, abs=1e-6)
    ar = t["rows"]["ar-a0.2"]
    d = ar["vs_grpo"]["avg"]
    assert ar["n"] == 3 and d["seeds"] == [0, 1, 2]
    assert d["mean"] == pytest.approx(0.083333, abs=1e-6) and d["half"] == pytest.approx(0.071717, abs=1e-6)
    assert d["excludes_zero"] is True and ar["vs_grpo"]["4"]["excludes_zero"] is True
    # Lopti .3 .3 .3 vs GRPO: diffs .1 0 -.1, half = 0.248434, includes 0.
    lo = t["rows"]["lopti-e0.4"]
    assert lo["accuracy"]["avg"]["half"] == pytest.approx(0.0, abs=1e-12)
    assert lo["vs_grpo"]["avg"]["half"] == pytest.approx(0.248434, abs=1e-6)
    assert lo["vs_grpo"]["avg"]["excludes_zero"] is False
    # Format errors, paired like accuracy: Lopti has .1 fewer on every seed.
    assert g["format_error"]["mean"]["mean"] == pytest.approx(0.2) and g["format_error"]["vs_grpo"] is None
    f = lo["format_error"]["vs_grpo"]
    assert f["mean"] == pytest.approx(-0.1) and f["half"] == pytest.approx(0.0, abs=1e-12) and f["excludes_zero"]
    assert ar["format_error"]["vs_grpo"]["excludes_zero"] is False       # -.1 -.2 -.3
    # Held-out accuracy, paired: Lopti .35 x 3 vs GRPO .2 .3 .4 -> +.05; AR has none.
    h = lo["selection"]["heldout"]
    assert h["mean"]["mean"] == pytest.approx(0.35) and h["vs_grpo"]["mean"] == pytest.approx(0.05)
    assert "heldout" not in ar["selection"]
    # Derivation share 0, .5, 1 in every run: 80% first reached at step 3, AUC .5.
    assert g["selection"]["steps_to_80"]["mean"]["mean"] == 3.0
    assert lo["selection"]["derive_auc"]["vs_grpo"]["mean"] == pytest.approx(0.0)
    # Curves: moving average (window 2) of rewards 0, .5, 1 is 0, .25, .75 for every seed.
    c = g["curves"]["reward"]
    assert c["step"] == [1, 2, 3] and c["mean"] == pytest.approx([0, .25, .75]) and c["lo"] == c["mean"]
    assert set(pr["grids"]) == set(G.GRIDS)           # each grid table from the runs it has
    assert list(pr["grids"]["alpha"]["rows"]) == ["grpo", "ar-a0.2"]
    json.dumps(res)                                   # JSON-ready


def test_report_on_synthetic_results_keeps_the_hand_written_block(tmp_path, fake_model):
    out = synthetic_study(tmp_path / "study", fake_model)
    report, figs = tmp_path / "docs" / "RESULTS.md", tmp_path / "docs" / "figures"
    R.write_report(A.aggregate(out), report, figs)
    compact = report.read_text()
    # The report: a row per arm, and a link to every table in full beside it.
    assert "[RESULTS_TABLES.md](RESULTS_TABLES.md)" in compact and "Seeds 0-2 (n = 3 per row)." in compact
    # three seeds: the signs, no t interval and no star (a sign-flip p is at least 0.25)
    assert "| GRPO+AR (α=0.2) | 0.383 ± 0.259 | +0.083 (3 of 3 higher) | – | – |" in compact
    assert "| 0.53 | +35.9% |" in compact
    full = (tmp_path / "docs" / "RESULTS_TABLES.md").read_text()
    assert "| GRPO+AR (α=0.2) | 4 | 1 | 24 | 1.0 | 0.5 | 0.2 | 2 | 0.1 min |" in full   # cost, all 4 runs
    assert "| 3 people |" not in compact and "Format errors" not in compact     # those: in full
    # A grid repeats no arm a table above showed on the same seeds, GRPO aside; ×N in names.
    main, shown = A.aggregate(out)["presets"]["ci"]["grids"]["main"], set()
    first, again = R._compact_table(main, None, shown), R._compact_table(main, None, shown)
    assert len(first) == 2 + 3 and [l.split(" |")[0] for l in again[2:3]] == ["| GRPO"]
    assert again[-1] == "Also in this grid, with the numbers of a table above: GRPO+AR (α=0.2), GRPO+Lopti (η=0.4)."
    assert R.short("GRPO+Lopti (η=0.4, 2 optimizer steps per rollout)") == "GRPO+Lopti (η=0.4, ×2)"
    text = compact + (tmp_path / "docs" / "RESULTS_TABLES.md").read_text()
    assert "Seeds 0-2 (n = 3 per row)." in text
    assert "| GRPO | 0.300 ± 0.248 | 0.300 ± 0.248 | 0.300 ± 0.248 | – | – |" in text
    # three seeds: the signs, no interval, no statement, not counted in the summary
    assert "+0.083 (3 of 3 higher) | +27.8% |" in text
    assert "3 paired seed(s), too few for an interval (signs: 3 of 3 higher); difference +0.083" in text
    assert "Summary (computed)" not in text
    assert "| Qwen2.5-3B GRPO+AR+Lopti (α=0.3, η=0.5) | 0.72 | 0.66 | 0.55 | 0.52 | 0.40 | 0.57 | +46.2% |" in text
    assert "| GRPO+AR (α=0.2) | 0.383 ± " in text and "| 0.53 | +35.9% | 0.89 | +15.6% |" in text
    assert "**24 sampled responses**" in text and "steps" in text.split("Left out")[1]
    assert "| GRPO+AR (α=0.2) | 4 | 1 | 24 | 1.0 | 0.5 | 0.2 | 2 |" in text      # cost table, all 4 runs
    assert "| GRPO | 0.200 ± 0.248 | – |" in text                                 # format errors
    assert "| GRPO+Lopti (η=0.4) | 0.100 ± 0.248 | -0.100 (3 of 3 lower) | 0.100 ± 0.248 | 110 ± 25 | -10 (3 of 3 lower) |" in text
    assert "![learning curves, main](figures/study-ci-main-curves.png)" in text
    assert (figs / "study-ci-main-curves.png").stat().st_size > 1000
    assert (figs / "study-ci-main-sizes.png").exists()
    assert "Sweep:" not in text          # no sweep has runs of its own here
    # Lopti: diffs .1 0 -.1 -> (4.303 + 1.061) * .1 / sqrt(3) = 0.310 detectable with 80% power.
    assert stats.detectable(0.1, 3) == pytest.approx(0.3097, abs=1e-3)     # no longer printed at n = 3
    # Held-out accuracy and the selection columns, paired like accuracy.
    assert "| GRPO+Lopti (η=0.4) | 0.350 ± 0.000 | +0.050 (1 of 3 lower, 2 of 3 higher) | 3.0 ± 0.0 | +0.0 (3 of 3 equal) |" in text

    report.write_text(text.replace(R.HAND_BEGIN + "\n", R.HAND_BEGIN + "\nOur reading: nothing yet.\n"))
    R.write_report(A.aggregate(out), report, figs, plots=False)
    new = report.read_text()
    assert "Our reading: nothing yet." in new and new.count(R.HAND_BEGIN) == 1


def test_grid_pairs_compare_reinforce_pp_arms_with_reinforce_pp(tmp_path, fake_model):
    """REINFORCE++ +AR+Lopti is paired with REINFORCE++ (GRID_PAIRS), not only with GRPO: the
    paper's question for its second estimator. GRPO .2 .3 .4; REINFORCE++ .3 .3 .3;
    REINFORCE++ +AR+Lopti .4 .5 .3 -> +.1 +.2 0 against REINFORCE++ (mean .1, s .1)."""
    out = tmp_path / "study"
    rpp, rpp_arl = G.GRIDS["reinforce_pp"][1:]
    assert G.GRID_PAIRS["reinforce_pp"] == ((rpp_arl, rpp),)
    assert G.GRID_PAIRS["control"] == ((G.Variant("lopti", eta=0.4), G.GRPO_X2), (G.AR_LOPTI, G.GRPO_X2))
    assert rpp.label == "REINFORCE++" and rpp_arl.label == "REINFORCE++ +AR+Lopti (α=0.3, η=0.5)"
    for v, accs in {G.GRPO: [.2, .3, .4], rpp: [.3, .3, .3], rpp_arl: [.4, .5, .3]}.items():
        for seed, a in enumerate(accs):
            spec = S.RunSpec("ci", v, seed, "reinforce_pp")
            write_finished(spec.run_dir(out), S.run_config(spec, out, {"model": fake_model, "steps": 3}),
                           {3: a, 4: a}, heldout=a, low=(0.06, 0.03, 0.0), rewards=(0.0, 0.5, a + 0.5))
    t = A.aggregate(out)["presets"]["ci"]["grids"]["reinforce_pp"]
    [d] = t["pairs"]
    # diffs .1 .2 0: mean .1, s .1, half 4.303 * .1 / sqrt(3) = 0.248434
    assert d["a"] == rpp_arl.label and d["b"] == rpp.label and d["avg"]["seeds"] == [0, 1, 2]
    assert d["avg"]["mean"] == pytest.approx(0.1) and d["avg"]["half"] == pytest.approx(0.248434, abs=1e-6)
    assert d["heldout"]["mean"] == pytest.approx(0.1) and d["steps_to_80"]["mean"] == pytest.approx(0.0)
    assert t["rows"][rpp_arl.name]["vs_grpo"]["avg"]["mean"] == pytest.approx(0.1)     # .2 .2 -.1 vs GRPO
    report = tmp_path / "RESULTS.md"
    R.write_report(A.aggregate(out), report, tmp_path / "figs", plots=False)
    full = (tmp_path / "RESULTS_TABLES.md").read_text()
    assert ("- **REINFORCE++ +AR+Lopti (α=0.3, η=0.5)** minus **REINFORCE++**, paired by seed (95% CI): "
            "accuracy (avg over sizes) +0.100 (2 of 3 higher, 1 equal); held-out accuracy +0.100 (2 of 3 "
            "higher, 1 equal)") in full
    assert ("| REINFORCE++ +AR+Lopti (α=0.3, η=0.5) minus REINFORCE++ | +0.100 (2 of 3 higher, 1 equal) | "
            "+0.100 (2 of 3 higher, 1 equal) |") in report.read_text()       # the report's row of that pair
    # What Lopti's first stage holds: low_fraction .06 at step 1, mean .03; derivations at the
    # last step = the last reward, a + .5: REINFORCE++ +AR+Lopti .9 1.0 .8 -> mean .9.
    assert "| REINFORCE++ +AR+Lopti (α=0.3, η=0.5) | 0.5 | 0.060 | 0.030 | 0.90 (0.80-1.00) |" in full


def criterion_study(out: Path, model: str) -> Path:
    """Runs of the criterion grid with known numbers, 3 seeds, 3 steps, held-out accuracy
    after steps 1 and 2 (``along``) and at the end; each run also logs the mechanism. Per
    seed 0, 1, 2: GRPO along .1 .2 .3 at step 1, .2 .3 .4 at step 2, final .3 .4 .5; Lopti
    and the others +.1 at step 1 on every seed, and the random split .2 .2 .5 at step 1."""
    ov = {"model": model, "steps": 3, "heldout_data": "held.jsonl", "heldout_steps": (1, 2)}
    bumps = {G.GRPO: 0.0, G.LOPTI: 0.1, G.LOPTI_HIGH: 0.1, G.GRPO_LR2: 0.1, G.GRPO_X2: 0.1}
    mech = [{"rise_pos_moved": [.5, .6, .7, .8], "fall_neg_moved": [.4, .5, .6, .7], "nll": 1.0 - .1 * i}
            for i in range(3)]
    for v in tuple(bumps) + (G.LOPTI_RANDOM,):
        for seed in range(3):
            spec = S.RunSpec("ci", v, seed, "criterion")
            cfg = S.run_config(spec, out, ov)
            step1 = (.2, .2, .5)[seed] if v == G.LOPTI_RANDOM else .1 * (seed + 1) + bumps[v]
            write_finished(spec.run_dir(out), cfg, {3: .3, 4: .3}, heldout=.3 + .1 * seed, extra=mech,
                           along={1: step1, 2: .2 + .1 * seed})
    return out


def test_heldout_accuracy_along_the_way_is_tabulated_and_paired(tmp_path, fake_model):
    out = criterion_study(tmp_path / "study", fake_model)
    assert S.run_config(S.RunSpec("ci", G.GRPO, 0, "criterion"), out,
                        {"heldout_data": "h", "heldout_steps": (5, 10), "steps": 10}).heldout_steps == (5,)
    t = A.aggregate(out)["presets"]["ci"]["grids"]["criterion"]
    assert t["seeds"] == [0, 1, 2] and list(t["rows"]) == ["grpo", "grpo-x2", "grpo-lrx2", "lopti-e0.4",
                                                           "lopti-e0.4-high_first", "lopti-e0.4-random"]
    g, lo, rnd = (t["rows"][n]["heldout_along"] for n in ("grpo", "lopti-e0.4", "lopti-e0.4-random"))
    assert list(g) == ["1", "2", "final"] and g["1"]["vs_grpo"] is None
    assert g["1"]["mean"]["mean"] == pytest.approx(0.2) and g["final"]["mean"]["mean"] == pytest.approx(0.4)
    # Lopti +.1 on every seed at step 1: interval of width 0; equal at step 2
    assert lo["1"]["vs_grpo"]["mean"] == pytest.approx(0.1) and lo["1"]["vs_grpo"]["half"] == pytest.approx(0, abs=1e-12)
    assert lo["2"]["vs_grpo"]["mean"] == pytest.approx(0.0)
    # random split .2 .2 .5 vs GRPO .1 .2 .3: diffs .1 0 .2 -> mean .1, s .1, half 4.303 * .1 / sqrt(3)
    assert rnd["1"]["vs_grpo"]["mean"] == pytest.approx(0.1) and rnd["1"]["vs_grpo"]["half"] == pytest.approx(0.248434, abs=1e-6)
    # ... and vs Lopti (a pair of the grid): .2 .2 .5 - (.2 .3 .4) = 0 -.1 .1
    d = next(p for p in t["pairs"] if p["a"] == G.LOPTI_RANDOM.label and p["b"] == G.LOPTI.label)
    assert d["heldout_along"]["1"]["mean"] == pytest.approx(0.0) and d["heldout_along"]["1"]["n"] == 3
    assert d["heldout_along"]["1"]["half"] == pytest.approx(0.248434, abs=1e-6)
    assert any(p["a"] == G.GRPO_LR2.label and p["b"] == G.GRPO_X2.label for p in t["pairs"])
    report, figs = tmp_path / "R.md", tmp_path / "figs"
    R.write_report(A.aggregate(out), report, figs)
    compact = report.read_text()
    # The report's row: held-out accuracy after the steps as differences from GRPO, no new table.
    assert "| Δ held-out after step 1 | Δ held-out after step 2 | steps to 80% derivations |" in compact
    assert "| GRPO+Lopti (η=0.4, high first) minus GRPO+Lopti (η=0.4) |" in compact
    # three equal differences: a zero-width t interval, so the signs instead, and no star
    assert ("| GRPO (lr ×2) minus GRPO | +0.000 (3 of 3 equal) | +0.000 (3 of 3 equal) | "
            "+0.100 (3 of 3 higher) |") in compact                    # a pair's held-out after step 1
    text = compact + (tmp_path / "R_TABLES.md").read_text()
    assert "| method | after step 1 | Δ vs GRPO | after step 2 | Δ vs GRPO | final (step 3) | Δ vs GRPO |" in text
    assert "| GRPO+Lopti (η=0.4, random split) | 0.300 ± 0.430 | +0.100 (2 of 3 higher, 1 equal) |" in text
    assert ("**GRPO+Lopti (η=0.4, random split)** minus **GRPO+Lopti (η=0.4)**, paired by seed (95% CI): "
            "accuracy (avg over sizes) +0.000 (3 of 3 equal)") in text
    assert re.search(r"held-out accuracy after step 1 [+-]0\.000 \(1 of 3 lower, 1 of 3 higher, 1 equal\)", text)
    # The mechanism figure of the new arms, as for the old ones.
    assert "![mechanism, criterion](figs/study-ci-criterion-mechanism.png)" in text
    assert (figs / "study-ci-criterion-mechanism.png").stat().st_size > 1000


M1 = {"cpu": "Intel(R) Xeon(R) Processor", "cores": 2, "threads": 1, "gpu": None, "torch": "2.14.1"}


def test_seeds_whose_arms_ran_on_different_machines_leave_the_grid(tmp_path, fake_model):
    """grid.py, choice 4. The isolation grid's arms GRPO, Lopti and Lopti per stage, seeds
    0-3, all on one machine but for seed 1 of Lopti per stage (another torch) and seed 3 of
    GRPO (no machine recorded, an older run): the isolation table keeps seeds 0 and 2 in every
    row and pair and names the others with the field that differs; the main grid (GRPO and
    Lopti) keeps seed 1, whose two arms agree. Accuracy: GRPO .2, Lopti .3, per stage .4 +
    .1 x seed."""
    out = tmp_path / "study"
    machine = {(G.LOPTI_PER_STAGE, 1): dict(M1, torch="2.15.0"), (G.GRPO, 3): None}
    for v, base in ((G.GRPO, .2), (G.LOPTI, .3), (G.LOPTI_PER_STAGE, .4)):
        for seed in range(4):
            spec = S.RunSpec("ci", v, seed, "isolation")
            cfg = S.run_config(spec, out, {"model": fake_model, "steps": 3})
            a = base + .1 * seed
            write_finished(spec.run_dir(out), cfg, {3: a, 4: a}, machine=machine.get((v, seed), M1))
    pr = A.aggregate(out)["presets"]["ci"]
    t = pr["grids"]["isolation"]
    assert t["seeds"] == [0, 2]
    assert t["machine_apart"] == [{"seed": 1, "differs": ["torch"]},
                                  {"seed": 3, "differs": ["cpu", "torch", "threads"]}]
    assert {r["n"] for r in t["rows"].values()} == {2}
    assert t["rows"][G.LOPTI_PER_STAGE.name]["vs_grpo"]["avg"]["seeds"] == [0, 2]
    # A pair keeps every seed its two arms ran alike: seed 3 (GRPO's run recorded no machine)
    [d] = [d for d in t["pairs"] if d["a"] == G.LOPTI_PER_STAGE.label and d["b"] == G.LOPTI.label]
    assert d["seeds"] == d["avg"]["seeds"] == [0, 2, 3] and d["avg"]["mean"] == pytest.approx(0.1)
    main = pr["grids"]["main"]
    assert main["seeds"] == [0, 1, 2]
    assert main["machine_apart"] == [{"seed": 3, "differs": ["cpu", "torch", "threads"]}]
    report = tmp_path / "R.md"
    R.write_report(A.aggregate(out), report, tmp_path / "figs", plots=False)
    text = report.read_text()
    assert ("Seeds 0, 2 (n = 2 per row). 2 seed(s) left out, their arms having run on different machines "
            "(the CPU model, torch version or thread count each run recorded) or at commits not shown to "
            "compute the same (code): seed 1 (torch differs), "
            "3 (cpu, torch, threads differ); every row and its difference from GRPO are over the seeds "
            "above only, a paired comparison below over the seeds its two arms share (named where they "
            "differ).") in text
    assert "| GRPO+Lopti (η=0.4, an optimizer per stage) minus GRPO+Lopti (η=0.4) (seeds 0, 2, 3) |" in text
    # A study on one machine: no seed left out, no such sentence, no new key in the aggregate.
    one = tmp_path / "one"
    for v in (G.GRPO, G.LOPTI):
        for seed in range(2):
            spec = S.RunSpec("ci", v, seed, "main")
            write_finished(spec.run_dir(one), S.run_config(spec, one, {"model": fake_model, "steps": 3}),
                           {3: .3}, machine=M1)
    t1 = A.aggregate(one)["presets"]["ci"]["grids"]["main"]
    assert t1["seeds"] == [0, 1] and "machine_apart" not in t1


def test_a_run_resumed_on_another_machine_is_reported_apart():
    """A resumed run appends its session's machine to run.json (runs.record_session): the
    same machine leaves its key as it was; another CPU makes a key no one-machine run has,
    so the seed leaves the grid's table (grid.py, choice 4)."""
    one = G.machine_key({"machine": M1})
    assert G.machine_key({"machine": M1, "resumed": [{"step": 4, "machine": M1}]}) == one
    moved = G.machine_key({"machine": M1, "resumed": [{"step": 4, "machine": dict(M1, cpu="AMD EPYC")},
                                                      {"step": 8, "machine": M1}]})
    assert moved == dict(one, cpu="Intel(R) Xeon(R) Processor + AMD EPYC")
    keep, apart = G.same_machine_seeds({"grpo": {0: one, 1: one}, "lopti": {0: one, 1: moved}}, [0, 1])
    assert keep == [0] and apart == [{"seed": 1, "differs": ["cpu"]}]


def test_every_archived_comparison_ran_each_seed_on_one_machine():
    """What keeps the archive reportable as it was (grid.py, choice 4): in every study in
    results/, no paired grid (main, control, criterion, isolation) leaves a seed out for its
    machine, and no grid's own pair loses a seed that both its arms have (a sweep whose GRPO
    seed ran on another CPU may leave that seed out of its table, not of its pairs)."""
    studies = sorted({rj.parent.parent.parent for rj in (ROOT / "results").glob("study-*/*/*/run.json")})
    assert studies
    for out in studies:
        for preset in A.aggregate(out)["presets"].values():
            seeds_of = {v["label"]: set(v["seeds"]) for v in preset["variants"].values()}
            for grid, t in preset["grids"].items():
                assert grid not in PAIRED_GRIDS or "machine_apart" not in t, (out, grid)
                for d in t["pairs"]:
                    assert set(d.get("seeds", t["seeds"])) == seeds_of[d["a"]] & seeds_of[d["b"]], (out, d["a"])


def test_report_only_is_byte_identical_and_writes_only_what_it_is_asked(tmp_path, fake_model):
    """--report-only twice: the same bytes (report, figures); no study_results.json unless
    --write-aggregate, and then the same bytes too; without --report / --figures nothing is
    written outside OUT."""
    out = criterion_study(tmp_path / "study", fake_model)
    (out / "study_log.jsonl").write_text(json.dumps({"start": "2026-01-01 10:00:00", "end": "2026-01-01 11:00:00",
                                                     "wall_s": 3600.0, "argv": ["--out", str(tmp_path / "runs" / "s")],
                                                     "jobs": 2, "threads": 1, "machine": None}) + "\n")

    def snapshot(root: Path) -> dict:
        return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}

    args = ["--report-only", "--out", str(out), "--report", str(tmp_path / "docs" / "R.md"),
            "--figures", str(tmp_path / "docs" / "figs")]
    before = snapshot(out)
    assert S.main(args) == 0
    first = snapshot(tmp_path)
    assert snapshot(out) == before                                  # nothing in OUT was asked for
    assert "docs/R_TABLES.md" in first                               # the full tables, beside the report
    text = (tmp_path / "docs" / "R.md").read_text()
    assert str(tmp_path) not in text and "runs/s --report-only" not in text     # no machine path
    assert "--out runs/s" in (tmp_path / "docs" / "R_TABLES.md").read_text()   # the logged command, portable
    assert S.main(args) == 0
    assert snapshot(tmp_path) == first and len([k for k in first if k.endswith(".png")]) >= 2
    assert S.main(args + ["--write-aggregate"]) == 0
    agg = (out / "study_results.json").read_bytes()
    assert S.main(args + ["--write-aggregate"]) == 0
    assert (out / "study_results.json").read_bytes() == agg and b"generated" not in agg
    # No --report / --figures: the report goes into OUT, nothing else changes.
    (out / "study_results.json").unlink()
    outside = {k: v for k, v in snapshot(tmp_path).items() if not k.startswith("study/")}
    assert S.main(["--report-only", "--out", str(out)]) == 0
    assert {k: v for k, v in snapshot(tmp_path).items() if not k.startswith("study/")} == outside
    assert (out / "RESULTS.md").exists() and (out / "figures" / "study-ci-criterion-curves.png").exists()
    assert (out / "RESULTS_TABLES.md").exists()
    assert not (out / "study_results.json").exists()


def test_report_without_runs_is_a_template(tmp_path):
    p = R.write_report(A.aggregate(tmp_path / "empty"), tmp_path / "R.md", tmp_path / "f")
    text = Path(p).read_text()
    assert "No finished runs yet" in text and "+46.2%" in text and R.HAND_END in text


def test_cli_report_only_dry_run_and_bad_input(tmp_path, fake_model, capsys):
    out = synthetic_study(tmp_path / "study", fake_model)
    rep = tmp_path / "R.md"
    assert S.main(["--report-only", "--out", str(out), "--report", str(rep), "--figures", str(tmp_path / "f")]) == 0
    assert rep.exists() and not (out / "study_results.json").exists()        # not asked for
    # its own command, with the paths as every machine shows them (outside a checkout: the name)
    assert "`python -m lopti_minimal.experiments.study --out .../study --report-only --report .../R.md " \
           "--figures .../f --tables .../R_TABLES.md`" in rep.read_text()
    assert str(tmp_path) not in rep.read_text()
    assert S.main(["--dry-run", "--preset", "ci", "--out", str(out), "--model", fake_model, "--steps", "3",
                   "--seeds", "3", "--only", "grpo,ar", "--grid", "main", "--step-seconds", "2", "--eval-seconds", "10"]) == 0
    o = capsys.readouterr().out
    assert "ci/grpo-s0" in o and "ci/ar-a0.2-s2" in o and "budget per run: 3 steps x 2 prompts x G=4 = 24" in o
    assert "6 runs (main 6), 0 to do: about" in o
    assert S.main(["--dry-run", "--preset", "ci", "--out", str(tmp_path / "new"), "--model", fake_model,
                   "--steps", "3", "--seeds", "2", "--only", "grpo,lopti", "--grid", "main", "--step-seconds", "2",
                   "--eval-seconds", "10"]) == 0
    # 2 x (3 x 2 s + 10 s) + 2 x (3 x 2 s x 1.15 + 10 s) = 65.8 s
    assert "4 runs (main 4), 4 to do: about 1.1 min for 4 run(s)" in capsys.readouterr().out
    # A fresh folder timed by another study's finished runs (--estimate-from): GRPO's 5 s
    # (3 steps x 1 s + 2 s) for GRPO and, by method, for GRPO at 2x lr; Lopti's 5 s for its
    # random split and reversed order; AR+Lopti has none of its method: the mean of all, 5 s.
    assert S.main(["--dry-run", "--preset", "ci", "--out", str(tmp_path / "new"), "--model", fake_model,
                   "--steps", "3", "--seeds", "1", "--grid", "criterion", "--estimate-from", str(out)]) == 0
    o = capsys.readouterr().out
    assert "ci/grpo-lrx2-s0" in o and "ci/ar_lopti-a0.3-e0.5-random-s0" in o
    assert "9 runs (criterion 9), 9 to do: about 0.8 min for 9 run(s)" in o
    # With held-out evaluations after steps 5 and 10 that those runs did not make: each costs
    # a final held-out evaluation's time (4 s in the synthetic runs), 2 x 9 x (5 + 2 x 4) s.
    assert S.main(["--dry-run", "--preset", "ci", "--out", str(tmp_path / "new"), "--model", fake_model,
                   "--steps", "12", "--seeds", "2", "--grid", "criterion", "--estimate-from", str(out)]) == 0
    o = capsys.readouterr().out
    assert "held-out evaluation (data/heldout3.jsonl, greedy): after step(s) 5, 10 and at the end" in o
    assert "18 runs (criterion 18), 18 to do: about 3.9 min for 18 run(s)" in o
    assert S.main(["--grid", "nope", "--out", str(out), "--no-report"]) == 2
    assert S.main(["--set", "seed=3", "--out", str(out), "--no-report"]) == 2
    assert S.main(["--dry-run", "--preset", "ci", "--out", str(out), "--model", fake_model, "--steps", "9",
                   "--only", "grpo", "--seeds", "1"]) == 2
    err = capsys.readouterr().err
    assert "unknown grid" in err and "cannot change seed" in err and "different config (steps)" in err


# ----------------------------------------------------------------------------- end to end

def test_end_to_end_mini_study_on_the_ci_preset(tmp_path, request):
    """The real trainer: 2 methods x 1 seed on the ci preset, then the report; a second
    invocation skips both runs."""
    model = [] if WARM.exists() else ["--model", request.getfixturevalue("nano_dir")]
    out, rep = tmp_path / "study", tmp_path / "RESULTS.md"
    heldout = tmp_path / "heldout.jsonl"                 # 6 puzzles of the held-out set
    heldout.write_text("".join((ROOT / "data" / "heldout3.jsonl").read_text().splitlines(True)[:6]))
    args = ["--preset", "ci", "--grid", "main", "--only", "grpo,ar_lopti", "--seeds", "1", "--out", str(out), "--report", str(rep),
            "--figures", str(tmp_path / "fig"), "--threads", os.environ.get("LOPTI_TEST_THREADS", "2"),
            "--heldout", str(heldout), "--heldout-steps", "1", "--no-progress", *model]
    assert S.main(args) == 0
    for name in ("grpo-s0", "ar_lopti-a0.3-e0.5-s0"):
        d = out / "ci" / name
        assert (d / "eval_final.json").exists() and (d / "final" / "config.json").exists(), name
        assert len((d / "metrics.jsonl").read_text().splitlines()) == 2
        assert "step    2/2" in (d / "train.log").read_text()
        assert json.loads((d / G.HELDOUT_FILE).read_text())["per_size"]["3"]["n"] == 6
        assert json.loads((d / runs.heldout_step_file(1)).read_text())["per_size"]["3"]["n"] == 6   # by the trainer
    res = json.loads((out / "study_results.json").read_text())
    rows = res["presets"]["ci"]["grids"]["main"]["rows"]
    assert set(rows) == {"grpo", "ar_lopti-a0.3-e0.5"} and rows["ar_lopti-a0.3-e0.5"]["vs_grpo"]["avg"]["n"] == 1
    assert res["presets"]["ci"]["fingerprint"].startswith("sha256:")
    text = rep.read_text() + (out / "RESULTS_TABLES.md").read_text()      # the report, the tables in full
    assert "GRPO+AR+Lopti (α=0.3, η=0.5)" in text and "too few for an interval" in text
    assert "| method | after step 1 | Δ vs GRPO | final (step 2) | Δ vs GRPO |" in text
    held0 = json.loads((out / "ci" / "warm-start-heldout.json").read_text())["overall"]["accuracy"]
    assert f"The warm start (step 0) scores {held0:.3f}." in text
    # The starting policy was evaluated once, like the runs, and heads the main table.
    warm = out / "ci" / "warm-start-eval.json"
    acc = json.loads(warm.read_text())["per_size"]["3"]["accuracy"]
    assert f"| warm start (no RL) | {acc:.3f} |" in text
    assert res["presets"]["ci"]["warm_start"]["accuracy"]["3"] == acc
    stamp = warm.stat().st_mtime_ns
    assert S.main(args) == 0
    assert warm.stat().st_mtime_ns == stamp          # not evaluated again
    log = [json.loads(l) for l in (out / "study_log.jsonl").read_text().splitlines()]
    assert [(e["ran"], e["skipped"]) for e in log] == [(2, 0), (0, 2)]




def test_interrupt_in_parallel_drops_the_queued_runs(tmp_path, fake_model):
    """Ctrl-C (or, on the command line, a SIGTERM) during a parallel study must not start the
    runs still queued -- leaving the process pool would otherwise run all of them first --
    and the invocation is still logged."""
    out = tmp_path / "study"
    (out / "ci").mkdir(parents=True)
    (out / "ci" / "INTERRUPT").write_text("")          # every fake run raises KeyboardInterrupt
    specs = S.plan_runs(["main"], 5, 0, "ci")          # 20 runs
    with pytest.raises(KeyboardInterrupt):
        S.run_study(specs, out, {"model": fake_model}, train_fn=fake_train, jobs=2, threads=1,
                    progress=False, echo=lambda s: None)
    started = [p for p in (out / "ci").iterdir() if (p / "calls.txt").exists()]
    assert 1 <= len(started) <= 2            # the 2 in flight, nothing queued, not 20
    assert json.loads((out / "study_log.jsonl").read_text())["ran"] == 0


def test_sigterm_stops_the_study_command_like_ctrl_c(tmp_path):
    import signal
    with pytest.raises(KeyboardInterrupt):
        S._interrupt_on_sigterm(signal.SIGTERM, None)


def test_archive_keeps_finished_runs_without_weights(tmp_path):
    """scripts/archive_study.py: a finished run is copied without ckpt-*/, final/ and plots;
    an unfinished run is left out (copied back, it would be resumed without a checkpoint)."""
    from conftest import load_script
    arch = load_script("scripts/archive_study.py")
    study = tmp_path / "study"
    done, todo = study / "cpu-tiny" / "grpo-s0", study / "cpu-tiny" / "grpo-s1"
    for run in (done, todo):
        (run / "ckpt-000010").mkdir(parents=True)
        (run / "ckpt-000010" / "model.safetensors").write_bytes(b"w")
        (run / "run.json").write_text(json.dumps({"kind": runs.RUN_MARKER, "config": {}}))
        (run / "metrics.jsonl").write_text("{}\n")
    (done / "final").mkdir()
    (done / "final" / "model.safetensors").write_bytes(b"w")
    (done / "eval_final.json").write_text("{}")
    (done / "training.png").write_bytes(b"png")
    (study / "cpu-tiny" / "warm-start-eval.json").write_text("{}")
    (study / "study.json").write_text("{}")
    (study / "study_log.jsonl").write_text("{}\n")

    written = arch.archive(study, tmp_path / "archive")
    out = tmp_path / "archive" / "cpu-tiny"
    assert written == [out / "grpo-s0"]
    assert sorted(p.name for p in (out / "grpo-s0").iterdir()) == ["eval_final.json", "metrics.jsonl", "run.json"]
    assert not (out / "grpo-s1").exists()
    assert (out / "warm-start-eval.json").exists()
    assert (tmp_path / "archive" / "study.json").exists()           # the warm start's fingerprint
    assert (tmp_path / "archive" / "study_log.jsonl").exists()      # wall times and machine
    # --not-in: only the runs another archive does not hold as they are (a rerun's run.json differs)
    (done / ".lock").write_text("1")
    assert arch.archive(study, tmp_path / "new", not_in=tmp_path / "archive") == []
    (done / "run.json").write_text(json.dumps({"kind": runs.RUN_MARKER, "config": {}, "code": "new"}))
    assert arch.archive(study, tmp_path / "new", not_in=tmp_path / "archive") == [tmp_path / "new" / "cpu-tiny" / "grpo-s0"]
    assert not (tmp_path / "new" / "cpu-tiny" / "grpo-s0" / ".lock").exists()


def test_report_names_no_absolute_path_of_this_machine(tmp_path, monkeypatch):
    """Paths in the report are the same from any folder, checkout and machine: relative to
    this checkout; in another checkout (a study run from a worktree) from its first
    repository folder on; elsewhere by the last part only."""
    monkeypatch.chdir(tmp_path)                       # the current folder plays no part
    assert G.portable(str(ROOT / "runs" / "study")) == "runs/study"
    assert G.portable("/elsewhere/main/runs/study-tiny-warm") == "runs/study-tiny-warm"
    assert G.portable(str(tmp_path / "elsewhere")) == ".../elsewhere"
    assert G.portable("--jobs") == "--jobs" and G.portable("runs/x") == "runs/x"


# ---------------------------------------------------------------------------------------
# The declared test (stats.sign_flip_p, tost_p, holm, verdict; docs/STUDY.md)
# ---------------------------------------------------------------------------------------

def test_sign_flip_p_is_exact_and_handles_ties_and_zero_variance():
    # ten equal positive differences: only "all +" and "all -" are as extreme: 2 / 1024
    assert stats.sign_flip_p([1.0] * 10) == 2 / 1024
    assert stats.sign_flip_p([1.0] * 10, "greater") == 1 / 1024
    assert stats.sign_flip_p([1.0] * 10, "less") == 1.0
    # zero differences flip into themselves: four zeros and one -3 is one seed's worth
    assert stats.sign_flip_p([0, 0, 0, 0, -3]) == 1.0
    assert stats.sign_flip_p([0.0] * 5) == 1.0
    # [1, 2, 3]: of 8 assignments, |mean| >= 2 for (+++) and (---) only
    assert stats.sign_flip_p([1, 2, 3]) == 2 / 8
    assert stats.sign_flip_p([]) is None
    with pytest.raises(ValueError):
        stats.sign_flip_p([1.0], "bigger")


def test_tost_p_says_equivalent_only_inside_the_margin():
    assert stats.tost_p([0.0] * 10, 2.0) == 1 / 1024          # every seed 0: inside by 2
    assert stats.tost_p([3.0] * 10, 2.0) == 1.0               # every seed 3: outside
    # a spread around 0 that reaches past the margin is not shown equivalent
    assert stats.tost_p([0, 0, 0, 2, 3], 2.0) > 0.05
    assert stats.tost_p([], 1.0) is None


def test_holm_adjusts_in_order_and_keeps_none():
    # sorted 0.005, 0.01, 0.03, 0.04 -> x4, x3, x2, x1, made non-decreasing
    assert stats.holm([0.01, 0.04, None, 0.03, 0.005]) == pytest.approx([0.03, 0.06, None, 0.06, 0.02])
    assert stats.holm([0.5, 0.9]) == [1.0, 1.0]
    assert stats.verdict(0.01, 0.9) == "different"
    assert stats.verdict(0.2, 0.01) == "equivalent"
    assert stats.verdict(0.2, 0.2) == "undetermined" and stats.verdict(None, None) == "undetermined"


def test_declared_families_name_arms_the_grids_run():
    from lopti_minimal.experiments import declared
    arms = {v for g in ("main", "control", "criterion", "isolation") for v in G.GRIDS[g]}
    for pairs in declared.FAMILIES.values():
        assert len(pairs) == 4 and all(a in arms and b in arms for a, b in pairs)
    assert set(declared.MARGINS) == set(declared.PRIMARY_MEASURES + declared.SECONDARY_MEASURES)


def test_the_report_goes_into_the_study_folder_unless_named(tmp_path, fake_model):
    """After training, the report and its figures go to OUT (a study elsewhere never
    rewrites the checkout's docs/RESULTS.md or docs/figures); the tracked report is written
    only where --report names it."""
    out = synthetic_study(tmp_path / "study", fake_model)
    tracked = {p: p.stat().st_mtime_ns for p in [ROOT / "docs" / "RESULTS.md", *(ROOT / "docs" / "figures").iterdir()]}
    a = S.parse_args(["--out", str(out)])
    S.write_outputs(a, out)
    assert (out / "RESULTS.md").exists() and (out / "figures").is_dir() and (out / "study_results.json").exists()
    assert {p: p.stat().st_mtime_ns for p in tracked} == tracked


def test_commit_check_tells_equal_runs_from_different_ones(tmp_path, fake_model):
    """scripts/commit_check.py: the same run at two commits is EQUAL when every logged value
    but times and memory agrees (a metric only one commit logs is named, not compared), and
    DIFFERENT at the first value that does not."""
    from conftest import load_script
    check = load_script("scripts/commit_check.py")
    spec = S.RunSpec("ci", G.GRPO, 0, "main")
    cfg = S.run_config(spec, tmp_path, {"model": fake_model, "steps": 3})
    a, b = tmp_path / "a", tmp_path / "b"
    write_finished(a, cfg, {3: .3}, step_s=1.0, heldout=.5, machine={"cpu": "X", "torch": "2", "threads": 1})
    write_finished(b, cfg, {3: .3}, step_s=9.0, heldout=.5, machine={"cpu": "X", "torch": "2", "threads": 1},
                   extra=[{"pi_old_below_half": 0.2}] * 3)
    r = check.compare(a, b)
    assert r["equal"] and r["only_in_b"] == ["pi_old_below_half"] and r["compared"] > 3 * 5
    write_finished(b, cfg, {3: .3}, rewards=(0.0, 0.5, 0.9), heldout=.5,
                   machine={"cpu": "X", "torch": "2", "threads": 1})
    r = check.compare(a, b)
    assert not r["equal"] and r["first_difference"].startswith("step 3: accuracy")
    write_finished(b, cfg, {3: .3}, heldout=.5, machine={"cpu": "Y", "torch": "2", "threads": 1})
    assert not check.compare(a, b)["equal"]                  # another CPU: not evidence about commits


def test_the_declared_test_gives_each_verdict_and_opens_the_report(tmp_path, fake_model):
    """Ten seeds of the primary family's arms, built so that each verdict occurs: a random
    split that never reaches 80% derivations (every seed +2 steps: different), a state per
    stage exactly like Lopti (equivalent), a high-first order 0 or +3 in turn (undetermined).
    The report opens with the findings, before its protocol."""
    from lopti_minimal.experiments import declared
    out = tmp_path / "study"
    curves = {G.LOPTI: (0.0, 0.9, 1.0), G.GRPO_X2: (0.0, 0.9, 1.0), G.LOPTI_PER_STAGE: (0.0, 0.9, 1.0),
              G.LOPTI_RANDOM: (0.0, 0.1, 0.2)}
    for seed in range(10):
        for v, grid in ((G.LOPTI, "main"), (G.GRPO_X2, "control"), (G.LOPTI_RANDOM, "criterion"),
                        (G.LOPTI_HIGH, "criterion"), (G.LOPTI_PER_STAGE, "isolation")):
            spec = S.RunSpec("ci", v, seed, grid)
            rewards = curves.get(v) or ((0.0, 0.9, 1.0) if seed % 2 else (0.0, 0.1, 0.2))
            write_finished(spec.run_dir(out), S.run_config(spec, out, {"model": fake_model, "steps": 3}),
                           {3: .3}, rewards=rewards, heldout=.5)
    dec = A.aggregate(out)["presets"]["ci"]["declared"]
    rows = {(r["a"], r["measure"]): r for r in dec["families"]["primary"]}
    rnd = rows[(G.LOPTI_RANDOM.label, "steps_to_80")]
    assert rnd["diffs"] == [2.0] * 10 and rnd["p"] == 2 / 1024 and rnd["p_holm"] < 0.05
    assert rnd["verdict"] == "different"
    same = rows[(G.LOPTI_PER_STAGE.label, "steps_to_80")]
    assert same["diffs"] == [0.0] * 10 and same["p"] == 1.0 and same["verdict"] == "equivalent"
    assert rows[(G.LOPTI_HIGH.label, "steps_to_80")]["verdict"] == "undetermined"
    assert rows[(G.LOPTI_PER_STAGE.label, "heldout")]["verdict"] == "equivalent"     # held-out: its own Holm
    assert dec["declared_n"] == declared.SEEDS and not dec["families"]["secondary"]
    report = tmp_path / "R.md"
    R.write_report(A.aggregate(out), report, tmp_path / "figs", plots=False)
    text = report.read_text()
    assert text.index("## Findings") < text.index("## Protocol") and "n = 10 seeds)" in text
    assert "minus GRPO+Lopti (η=0.4)**: steps to 80% derivations +2.0, different" in text


def test_the_fingerprint_of_an_adapter_start_covers_its_base(tmp_path, fake_model):
    """A LoRA start (an adapter folder on a base) changes its fingerprint when its base's
    weights change, not only its own; a plain model's fingerprint is as before."""
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": fake_model}))
    (adapter / "adapter_model.safetensors").write_bytes(b"lora-v1")
    before, plain = S.model_fingerprint(str(adapter)), S.model_fingerprint(fake_model)
    (Path(fake_model) / "model.safetensors").write_bytes(b"weights-v2")
    assert S.model_fingerprint(str(adapter)) != before and S.model_fingerprint(fake_model) != plain


def test_the_power_statement_reads_the_declared_families(capsys):
    """scripts/study_power.py on the archive: a row per comparison and measure of both
    declared families, from the report's own pairs (docs/STUDY.md quotes its numbers)."""
    from conftest import load_script
    assert load_script("scripts/study_power.py").main([str(ROOT / "results" / "study-fixed"), "--sims", "20"]) == 0
    rows = [l for l in capsys.readouterr().out.splitlines() if l.startswith("| primary") or l.startswith("| secondary")]
    assert len(rows) == 24 and "| primary | lopti-e0.4-random - lopti-e0.4 | steps_to_80 | 5 | +1.000 | 1.414 |" in "\n".join(rows)


def test_the_declared_test_pairs_by_commit_unless_shown_equal(tmp_path, fake_model):
    """A seed whose two arms ran at different commits leaves the declared comparison, and
    every grid table and pair (grid.py, choice 4), until commit_checks.jsonl holds an EQUAL
    check of those commits (transitively); the report names the seeds left apart."""
    out = tmp_path / "study"
    A_, B_, C_ = "a" * 40, "b" * 40, "c" * 40
    for seed in range(4):
        for v, grid, commit in ((G.LOPTI, "main", A_), (G.GRPO_X2, "control", A_ if seed < 2 else C_)):
            spec = S.RunSpec("ci", v, seed, grid)
            d = spec.run_dir(out)
            write_finished(d, S.run_config(spec, out, {"model": fake_model, "steps": 3}), {3: .3}, heldout=.5)
            rj = json.loads((d / "run.json").read_text())
            (d / "run.json").write_text(json.dumps({**rj, "code": {"commit": commit, "dirty": False}}))

    def lopti_vs_x2():
        rows = A.aggregate(out)["presets"]["ci"]["declared"]["families"]["primary"]
        return next(r for r in rows if r["b"] == G.GRPO_X2.label and r["measure"] == "steps_to_80")
    def control():
        return A.aggregate(out)["presets"]["ci"]["grids"]["control"]
    r = lopti_vs_x2()
    assert r["seeds"] == [0, 1] and r["apart"] == [2, 3]
    t = control()
    assert t["seeds"] == [0, 1] and t["machine_apart"] == [{"seed": 2, "differs": ["code"]}, {"seed": 3, "differs": ["code"]}]
    assert t["pairs"][0]["avg"]["seeds"] == [0, 1]                   # Lopti minus GRPO x2, the grid's own pair
    runs.append_jsonl(out / "commit_checks.jsonl", {"commit_a": C_, "commit_b": B_, "equal": True})
    assert lopti_vs_x2()["apart"] == [2, 3]                          # B = C says nothing of A
    runs.append_jsonl(out / "commit_checks.jsonl", {"commit_a": A_, "commit_b": B_, "equal": True})
    r = lopti_vs_x2()
    assert r["seeds"] == [0, 1, 2, 3] and r["apart"] == []           # A = B = C
    t = control()
    assert t["seeds"] == [0, 1, 2, 3] and "machine_apart" not in t and t["pairs"][0]["avg"]["seeds"] == [0, 1, 2, 3]
    runs.append_jsonl(out / "commit_checks.jsonl", {"commit_a": A_, "commit_b": "d" * 40, "equal": False})
    assert lopti_vs_x2()["seeds"] == [0, 1, 2, 3]


def test_the_shipped_report_is_what_the_archive_gives(tmp_path):
    """docs/RESULTS.md and results/study-fixed/RESULTS_TABLES.md are exactly what the report
    code writes from the archive (the command in RESULTS.md's header), hand-written block
    kept: a change of the report or the statistics that is not regenerated fails here."""
    docs, tables = tmp_path / "docs", tmp_path / "results" / "study-fixed" / "RESULTS_TABLES.md"
    docs.mkdir()
    (docs / "RESULTS.md").write_text((ROOT / "docs" / "RESULTS.md").read_text())    # its hand-written block
    shipped = (ROOT / "docs" / "RESULTS.md").read_text()
    again = re.search(r"regenerate with `([^`]+)`", shipped).group(1)
    R.write_report(A.aggregate(ROOT / "results" / "study-fixed"), docs / "RESULTS.md",
                   docs / "figures" / "study-fixed", regenerate=again, tables=tables)
    assert (docs / "RESULTS.md").read_text() == shipped
    assert tables.read_text() == (ROOT / "results" / "study-fixed" / "RESULTS_TABLES.md").read_text()
