"""The RL loop (lopti_minimal/trainer.py, plumbing.py): config validation, per-step seeding,
rollout layout, checkpoints, and the exact-resume guarantee."""
import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import ROOT, load_script
from lopti_minimal import config, decode, gpu_memory, models, plumbing, precision, runs, trainer
from lopti_minimal.config import TrainError, make_config
from lopti_minimal.runs import config_from_json, config_to_json

# what differs between two runs of the same numbers: times, and the host's resident memory
TIMING = ("sample_s", "update_s", "step_s", "mechanism_s", "peak_rss_gb")




def length_reward(text, record):
    """A reward with variance even for a random model (the Logic-RL reward gives -3 to
    every response of an untrained model, so every advantage would be 0)."""
    return float(len(text) % 7)


def small_cfg(nano_dir, tmp_path, **kw):
    base = dict(model=nano_dir, steps=4, save_every=2, prompts_per_step=2, group_size=4,
                max_new_tokens=24, rl_per_size=10, final_eval=False, plots=False, progress=False,
                lr=3e-3, cache_dir=str(tmp_path / "cache"), run_dir=str(tmp_path / "run"))
    base.update(kw)
    return make_config("ci", **base)


def interrupting_reward(steps: int, rows_per_step: int = 2 * 4):
    """length_reward for `steps` steps' responses (prompts x G each), then Ctrl-C: a run
    interrupted during the next step."""
    calls = {"n": 0}

    def reward(text, record):
        calls["n"] += 1
        if calls["n"] > steps * rows_per_step:
            raise KeyboardInterrupt
        return length_reward(text, record)
    return reward


def strip(ms):
    return [{k: v for k, v in m.items() if k not in TIMING} for m in ms]


# ----------------------------------------------------------------------------- config

def test_presets_are_valid_and_gpu_presets_keep_reference_values():
    for name in config.PRESETS:
        make_config(name)
    for name in ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b"):
        c = make_config(name)
        assert (c.lr, c.temperature, c.group_size, c.prompts_per_step) == (1e-6, 0.7, 8, 64)
        assert c.gradient_checkpointing and c.autocast_bf16     # bf16 compute, precision.py
    d = make_config()
    assert (d.method, d.alpha, d.eta, d.preset) == ("ar_lopti", 0.3, 0.5, "cpu-tiny")


def test_method_alone_takes_the_papers_setting_and_explicit_values_win():
    # The paper's K&K runs: AR alone alpha 0.2, Lopti alone eta 0.4, AR+Lopti 0.3 / 0.5.
    assert make_config(method="ar").alpha == 0.2 and make_config(method="lopti").eta == 0.4
    c = make_config(method="ar_lopti")
    assert (c.alpha, c.eta) == (0.3, 0.5)
    assert make_config(method="lopti", eta=0.7).eta == 0.7 and make_config(method="ar", alpha=0.0).alpha == 0.0
    # A saved config keeps its values (a resumed run does not change its knobs).
    saved = config_to_json(make_config(method="lopti", eta=0.6))
    assert config_from_json(saved).eta == 0.6


def test_a_method_records_only_the_knobs_it_uses():
    """A GRPO run has no alpha or eta (None in run.json); AR no eta, Lopti no alpha. Giving
    one to a method that does not use it is an error, not a silently ignored option."""
    assert [(make_config(method=m).alpha, make_config(method=m).eta) for m in config.PAPER_METHODS] \
        == [(None, None), (0.2, None), (None, 0.4), (0.3, 0.5)]
    assert config_to_json(make_config(method="grpo"))["alpha"] is None
    for kw in (dict(method="grpo", alpha=0.3), dict(method="ar", eta=0.5), dict(method="lopti", alpha=0.1)):
        with pytest.raises(TrainError, match="does not use it"):
            make_config(**kw)
    assert make_config(method="grpo").low_eta == config.LOW_FRACTION_ETA == 0.5
    assert config.uses_ar("ar_lopti") and config.uses_lopti("ar_lopti") and not config.uses_ar("cispo")


def test_config_from_json_reads_older_configs():
    """The rule for configs saved by older versions: an unknown (removed) key is dropped, a
    missing field takes the value the code had before it existed (MISSING_DEFAULTS, else the
    default), and a GRPO config that recorded the unused alpha / eta reads as None."""
    old = config_to_json(make_config("ci", method="grpo"))
    for k in ("kl_log_ratio_clamp", "adam_betas", "adv_eps", "loss_agg_mode", "ppo_epochs", "estimator"):
        del old[k]
    old.update(alpha=0.3, eta=0.5, kl_type="low_var_kl", entropy_coef=0.0)
    cfg = config_from_json(old)
    assert cfg.kl_log_ratio_clamp == 20.0 and cfg.ppo_epochs == 1 and cfg.adam_betas == (0.9, 0.999)
    assert (cfg.alpha, cfg.eta, cfg.method, cfg.steps) == (None, None, "grpo", 2)
    # Every run the repository ships reads back, and round-trips.
    shipped = sorted(ROOT.glob("results/**/run.json"))
    for path in shipped:
        saved = runs.saved_config(path.parent)
        if saved is not None:
            c = config_from_json(saved)
            assert config_from_json(json.loads(json.dumps(config_to_json(c)))) == c, path


@pytest.mark.parametrize("kw, words", [
    (dict(method="ppo"), "unknown method"), (dict(alpha=1.5), "alpha"), (dict(alpha=-0.1), "alpha"),
    (dict(eta=0.0), "eta"), (dict(eta=1.01), "eta"), (dict(group_size=1), "group-size"),
    (dict(steps=0), "steps"), (dict(ppo_epochs=0), "ppo-epochs"), (dict(lopti_split="entropy"), "lopti split")])
def test_bad_config_is_rejected(kw, words):
    with pytest.raises(TrainError, match=words):
        make_config("cpu-tiny", **kw)
    with pytest.raises(TrainError, match="unknown preset"):
        make_config("nope")


def test_lr_scale_multiplies_the_optimizer_s_step_only():
    """The study's step-size control keeps lr (the setting runs share) and records the factor:
    the optimizer steps with lr x lr_scale; an old run.json without it reads back as 1."""
    c = make_config("cpu-tiny", method="grpo", lr_scale=2.0)
    assert (c.lr, c.optimizer_lr) == (1e-4, 2e-4)
    model = torch.nn.Linear(2, 2)
    assert precision.build_optimizer(model, c).param_groups[0]["lr"] == 2e-4
    assert precision.build_optimizer(model, make_config("cpu-tiny")).param_groups[0]["lr"] == 1e-4
    old = config_to_json(make_config("cpu-tiny"))
    del old["lr_scale"]
    assert config_from_json(old).lr_scale == 1.0
    with pytest.raises(TrainError, match="lr-scale"):
        make_config("cpu-tiny", lr_scale=0.0)


def test_config_json_round_trip():
    c = make_config("cpu-tiny", seed=3)
    assert config_from_json(json.loads(json.dumps(config_to_json(c)))) == c


# ----------------------------------------------------------------------------- seeding

def test_step_prompts_cover_each_epoch_and_depend_only_on_seed_and_step():
    n, k = 10, 3
    seen = [i for s in range(10) for i in plumbing.step_prompt_indices(0, s, k, n)]
    assert sorted(seen[:10]) == list(range(10)) and sorted(seen[10:20]) == list(range(10))
    assert plumbing.step_prompt_indices(0, 7, k, n) == plumbing.step_prompt_indices(0, 7, k, n)
    assert plumbing.step_prompt_indices(0, 7, k, n) != plumbing.step_prompt_indices(1, 7, k, n)
    a = torch.rand(5, generator=plumbing.step_generator(0, 4))
    assert torch.equal(a, torch.rand(5, generator=plumbing.step_generator(0, 4)))
    assert not torch.equal(a, torch.rand(5, generator=plumbing.step_generator(0, 5)))


# ----------------------------------------------------------------------------- rollouts

def test_a_log_is_read_back_without_a_half_written_last_line(tmp_path):
    log = tmp_path / "metrics.jsonl"
    assert runs.read_jsonl(log) == []                               # nothing logged yet
    runs.append_jsonl(log, {"step": 1, "reward": 0.5})
    runs.append_jsonl(log, {"step": 2, "reward": 1.0})
    with open(log, "a") as f:                                       # killed mid-write
        f.write('{"step": 3, "rew')
    assert runs.read_jsonl(log) == [{"step": 1, "reward": 0.5}, {"step": 2, "reward": 1.0}]


def test_concat_rollouts_keeps_the_layout():
    from lopti_minimal.batch import Rollout, concat_rollouts

    def ro(P, R, fill):
        ids = torch.full((2, P + R), fill)
        am = torch.ones(2, P + R, dtype=torch.long)
        return Rollout(ids, am, ids[:, P:], torch.ones(2, R), P, old_logprobs=torch.full((2, R), -0.5))

    c = concat_rollouts([ro(3, 2, 7), ro(5, 4, 8)], pad_token_id=0)
    assert c.prompt_len == 5 and c.response_ids.shape == (4, 4) and c.input_ids.shape == (4, 9)
    assert c.attention_mask[0].tolist() == [0, 0, 1, 1, 1, 1, 1, 0, 0]     # left pad, right pad
    assert c.response_mask[0].tolist() == [1, 1, 0, 0]
    assert c.old_logprobs[0].tolist() == [-0.5, -0.5, 0.0, 0.0]


def test_rl_step_first_ratio_is_exactly_one_under_bf16_autocast(nano_dir, tmp_path):
    cfg = small_cfg(nano_dir, tmp_path, method="grpo", autocast_bf16=True)
    model, tok = plumbing.load_policy(cfg)
    records, _ = plumbing.rl_prompt_set(cfg, progress=False)
    records, ids = models.encode_prompts(records[:2], tok, "auto", 256)
    m = trainer.rl_step(model, precision.reference_copy(model), precision.build_optimizer(model, cfg),
                        tok, records, ids, cfg, 0, length_reward)
    assert m["ratio_min"] == 1.0 and m["ratio_max"] == 1.0
    assert m["kl"] == 0.0 and m["grad_norm"] > 0
    assert 0 <= m["low_fraction"] <= 1 and m["tokens"] > 0
    assert m["pi_old_below_half"] == m["low_fraction"] and "ar_weight" not in m    # GRPO: at 0.5


def test_gradient_checkpointing_is_on_by_default_and_changes_no_number(nano_dir, tmp_path):
    """The default recomputes activations in the backward (host_memory's peak); a whole RL
    step (sampling with the default decoder, pi_old, pi_ref, AR, Lopti's two stages, AdamW)
    gives bit for bit the same metrics and weights with and without it, under bf16 autocast."""
    assert make_config().gradient_checkpointing and make_config("ci").gradient_checkpointing
    out = {}
    for ckpt in (False, True):
        cfg = small_cfg(nano_dir, tmp_path, method="ar_lopti", gradient_checkpointing=ckpt,
                        micro_batch_size=4, max_new_tokens=40)
        model, tok = plumbing.load_policy(cfg)
        assert models.is_gradient_checkpointing(model) == ckpt
        assert decode.unsupported(model) is None      # checkpointing leaves the lean decoder usable
        records, _ = plumbing.rl_prompt_set(cfg, progress=False)
        records, ids = models.encode_prompts(records[:2], tok, "auto", 256)
        m = trainer.rl_step(model, precision.reference_copy(model), precision.build_optimizer(model, cfg),
                            tok, records, ids, cfg, 0, length_reward)
        out[ckpt] = strip([m])[0], {k: v.clone() for k, v in model.state_dict().items()}
    assert out[False][0] == out[True][0] and out[True][0]["grad_norm"] > 0
    assert all(torch.equal(out[False][1][k], out[True][1][k]) for k in out[False][1])


def test_the_token_metrics_of_the_papers_question_by_hand():
    """pi_old_below_half (every method, pi_old < 0.5), stage1_share (Lopti: the mean of the
    first stage's mask) and ar_weight (AR: the mean of Eq. 4's factor) over the valid tokens
    of a hand-made batch; low_fraction keeps its threshold, the run's eta."""
    from lopti_minimal.batch import Rollout
    from lopti_minimal.grpo import UpdateMetrics
    from lopti_minimal.lopti import split_by_probability
    from lopti_minimal.mechanism import Probe
    p = torch.tensor([[0.9, 0.2, 0.6], [0.45, 0.05, 0.3]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])         # 0.3 is padding
    old = torch.log(p) * mask
    ids = torch.zeros(2, 4, dtype=torch.long)
    batch = Rollout(ids, torch.ones(2, 4, dtype=torch.long), ids[:, 1:], mask, 1, old_logprobs=old,
                    advantages=torch.zeros(2, 3))
    sb = trainer.StepBatch(batch, torch.tensor([1.0, 1.0, 0.0, 3.0]), ["", "", "", ""], 0.0)
    valid = [0.9, 0.2, 0.6, 0.45, 0.05]

    def metrics(**kw):
        cfg = make_config("ci", group_size=2, **kw)
        stages = (UpdateMetrics().result(),) * (2 if cfg.uses_lopti else 1)
        return cfg, plumbing.step_metrics(cfg, 0, sb, stages, Probe(cfg, 0), None,
                                          {"sample": 0.0, "update": 0.0, "step": 0.0})

    cfg, m = metrics(method="ar_lopti")
    assert m["pi_old_below_half"] == pytest.approx(3 / 5) and m["low_fraction"] == pytest.approx(3 / 5)
    low, _ = split_by_probability(old, mask, cfg.eta)               # Lopti's first stage (Algorithm 1)
    assert m["stage1_share"] == pytest.approx(float(low.sum() / mask.sum())) == pytest.approx(3 / 5)
    assert m["ar_weight"] == pytest.approx(sum(0.3 * x + 0.7 for x in valid) / 5)
    assert m["zero_adv_groups"] == 0.5 and "gen_rounds" not in m      # dynamic sampling off
    _, m = metrics(method="lopti")                                  # eta 0.4: 0.2 and 0.05
    assert (m["low_fraction"], m["stage1_share"], m["pi_old_below_half"]) == pytest.approx((2 / 5, 2 / 5, 3 / 5))
    assert "ar_weight" not in m
    _, m = metrics(method="lopti", lopti_order="high_first")        # stage 1 = the high tokens
    assert m["stage1_share"] == pytest.approx(3 / 5)
    _, m = metrics(method="ar", alpha=0.2)
    assert m["ar_weight"] == pytest.approx(sum(0.2 * x + 0.8 for x in valid) / 5) and "stage1_share" not in m
    _, m = metrics(method="grpo")
    assert m["pi_old_below_half"] == m["low_fraction"] and not {"stage1_share", "ar_weight"} & set(m)


# ----------------------------------------------------------------------------- runs

def test_resume_after_interruption_equals_uninterrupted_run(nano_dir, tmp_path):
    """Run A: 4 steps. Run B: interrupted (Ctrl-C) during step 4 after a checkpoint at
    step 2, then resumed. Metrics (except timings) and final weights must be identical."""
    a = trainer.train(small_cfg(nano_dir, tmp_path / "a", method="ar_lopti"), reward_fn=length_reward,
                      log=lambda s: None)

    calls = {"n": 0}

    def interrupting_reward(text, record):
        calls["n"] += 1
        if calls["n"] > 3 * 2 * 4:              # 3 steps x 2 prompts x G=4, then Ctrl-C
            raise KeyboardInterrupt
        return length_reward(text, record)

    cfg_b = small_cfg(nano_dir, tmp_path / "b", method="ar_lopti")
    with pytest.raises(KeyboardInterrupt):
        trainer.train(cfg_b, reward_fn=interrupting_reward, log=lambda s: None)
    run_b = cfg_b.run_dir
    assert [s for s, _ in runs.checkpoints(run_b)] == [2]
    assert len((tmp_path / "b" / "run" / "metrics.jsonl").read_text().splitlines()) == 3
    b = trainer.train(plumbing.resume_config(run_b, progress=False), resume=True,
                      reward_fn=length_reward, log=lambda s: None)

    assert strip(a["metrics"]) == strip(b["metrics"])
    assert any(m["grad_norm"] > 0 for m in a["metrics"])         # the test is not vacuous
    # run.json keeps the first session's record and adds the resumed one's (grid.machine_key)
    saved = json.loads((tmp_path / "b" / "run" / "run.json").read_text())
    [session] = saved["resumed"]
    assert session["step"] == 2 and session["machine"]["cpu"] == saved["machine"]["cpu"]
    assert all({"pi_old_below_half", "stage1_share", "ar_weight"} <= set(m) for m in a["metrics"])
    file_b = [json.loads(l) for l in (tmp_path / "b" / "run" / "metrics.jsonl").read_text().splitlines()]
    assert strip(file_b) == strip(a["metrics"])
    from transformers import AutoModelForCausalLM
    wa = AutoModelForCausalLM.from_pretrained(a["paths"]["final_model"]).state_dict()
    wb = AutoModelForCausalLM.from_pretrained(b["paths"]["final_model"]).state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_random_split_samples_what_the_probability_split_samples(nano_dir, tmp_path):
    """Lopti's random split (the criterion's control) draws from a generator of its own: a
    run with it samples the same step-1 rollout as the faithful run (same rewards, lengths,
    pi_old), and only the update differs: another gradient, other weights. (A probe
    statistic over the step's handful of tokens, such as the rise shares, may coincide on
    some CPU's rounding; the gradient and the weights cannot, with other tokens in stage 1.)"""
    out, weights = {}, {}
    for split in ("probability", "random"):
        # the nano model is random (pi_old ~ 1/400): eta 0.003 splits its tokens about 3:1
        cfg = small_cfg(nano_dir, tmp_path / split, method="lopti", eta=0.003, lopti_split=split, steps=1)
        result = trainer.train(cfg, reward_fn=length_reward, log=lambda s: None)
        out[split] = result["metrics"]
        weights[split] = load_file(str(Path(result["paths"]["final_model"]) / "model.safetensors"))
        assert json.loads((tmp_path / split / "run" / "run.json").read_text())["config"]["lopti_split"] == split
    a, b = out["probability"][0], out["random"][0]
    sampled = ("reward", "accuracy", "response_len", "max_len", "tokens", "derive_share", "kl",
               "low_fraction", "nll", "bin_share", "zero_adv_groups")
    assert {k: a[k] for k in sampled} == {k: b[k] for k in sampled}
    assert 0 < a["low_fraction"] < 1 and a["tokens"] > 0                     # both stages had tokens
    assert a["grad_norm"] != b["grad_norm"]                                  # the update differs ...
    assert any(not torch.equal(weights["probability"][k], weights["random"][k]) for k in weights["random"])


def test_heldout_evaluations_along_the_run_change_no_number_and_survive_a_resume(nano_dir, tmp_path):
    """--heldout-data F --heldout-steps 1,2: greedy accuracy on F after steps 1 and 2, in
    eval.py's format (RUN_DIR/eval_heldout_step<N>.json), and the run's metrics are those of
    a run without them. Interrupted during step 3 (checkpoint at 2) and resumed, the run has
    both files and the same metrics."""
    data = tmp_path / "held.jsonl"             # 4 puzzles of the held-out set
    data.write_text("".join((ROOT / "data" / "heldout3.jsonl").read_text().splitlines(True)[:4]))
    plain = trainer.train(small_cfg(nano_dir, tmp_path / "plain", method="lopti", steps=3),
                          reward_fn=length_reward, log=lambda s: None)["metrics"]
    cfg = small_cfg(nano_dir, tmp_path / "held", method="lopti", steps=3, heldout_data=str(data),
                    heldout_steps=(1, 2))
    calls = {"n": 0}

    def interrupting_reward(text, record):
        calls["n"] += 1
        if calls["n"] > 2 * 2 * 4:              # 2 steps x 2 prompts x G=4, then Ctrl-C
            raise KeyboardInterrupt
        return length_reward(text, record)

    with pytest.raises(KeyboardInterrupt):
        trainer.train(cfg, reward_fn=interrupting_reward, log=lambda s: None)
    run = tmp_path / "held" / "run"
    assert [s for s, _ in runs.checkpoints(run)] == [2]
    for step in (1, 2):
        ev = json.loads((run / runs.heldout_step_file(step)).read_text())
        assert ev["per_size"]["3"]["n"] == 4 and ev["settings"]["greedy"] and 0 <= ev["overall"]["accuracy"] <= 1
    held = trainer.train(plumbing.resume_config(run, progress=False), resume=True, reward_fn=length_reward,
                         log=lambda s: None)["metrics"]
    assert strip(held) == strip(plain) and len(plain) == 3
    assert not (run / runs.heldout_step_file(3)).exists()
    with pytest.raises(TrainError, match="heldout-data"):
        small_cfg(nano_dir, tmp_path, heldout_steps=(5,))
    with pytest.raises(TrainError, match="cannot read"):
        trainer.train(small_cfg(nano_dir, tmp_path / "bad", heldout_data=str(tmp_path / "none.jsonl"),
                                heldout_steps=(1,)), log=lambda s: None)


def test_keep_checkpoints_zero_keeps_every_checkpoint(nano_dir, tmp_path):
    # 0 = keep all (to evaluate the policy along a run), not "keep none".
    cfg = small_cfg(nano_dir, tmp_path, steps=3, save_every=1, keep_checkpoints=0, method="grpo")
    trainer.train(cfg, log=lambda s: None)
    assert [s for s, _ in runs.checkpoints(tmp_path / "run")] == [1, 2, 3]
    with pytest.raises(TrainError, match="keep-checkpoints"):
        config.validate(small_cfg(nano_dir, tmp_path, keep_checkpoints=-1))


def test_run_dir_layout_and_refusals(nano_dir, tmp_path):
    cfg = small_cfg(nano_dir, tmp_path, steps=2, save_every=1, keep_checkpoints=1, method="lopti")
    r = trainer.train(cfg, log=lambda s: None)
    run = tmp_path / "run"
    assert runs.is_run_dir(run)
    assert [s for s, _ in runs.checkpoints(run)] == [2]             # older ones pruned
    assert (run / "final" / "config.json").exists() and (run / "ckpt-000002" / "trainer_state.pt").exists()
    assert len(r["metrics"]) == 2 and all(math.isfinite(m["reward"]) for m in r["metrics"])
    # A half-written checkpoint (crash during save) is ignored.
    (run / "ckpt-000009.tmp").mkdir()
    assert [s for s, _ in runs.checkpoints(run)] == [2]
    # Refusals: an existing run dir without resume; resuming something that is not a run.
    with pytest.raises(TrainError, match="exists"):
        trainer.train(cfg, log=lambda s: None)
    with pytest.raises(TrainError, match="not a lopti-minimal run"):
        plumbing.resume_config(tmp_path)
    with pytest.raises(TrainError, match="no such directory"):
        plumbing.resume_config(tmp_path / "missing")


def test_unreadable_rl_data_is_a_train_error(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")

    def read(path):
        return plumbing.rl_prompt_set(make_config("ci", rl_data=str(path)))

    with pytest.raises(TrainError, match="cannot read K&K data"):
        read(bad)
    with pytest.raises(TrainError, match="cannot read K&K data"):
        read(tmp_path / "missing.jsonl")
    bad.write_text('{"quiz": "x"}\n')
    with pytest.raises(TrainError, match="not a K&K record"):
        read(bad)


def test_memory_estimate_follows_the_precision_policy():
    # 0.5B with float32 master weights and AdamW: 4 + 4 + 8 B/param, a bf16 reference.
    small = gpu_memory.memory_estimate_gb(0.5e9, 24, 2, 64, 151936, 16, 4500, 1)
    assert (small["weights"], small["grads"], small["optimizer"], small["reference"]) == (2.0, 2.0, 4.0, 1.0)
    # 8-bit AdamW over bf16 weights: 2 B/param of state; the same model, less memory.
    low = gpu_memory.memory_estimate_gb(0.5e9, 24, 2, 64, 151936, 16, 4500, 1, optimizer="adamw8bit",
                                      weights="bfloat16")
    assert (low["weights"], low["optimizer"]) == (1.0, 1.0) and low["peak"] < small["peak"]
    # The update's logits cover the response's positions only (token_logprobs asks for
    # new_tokens + 1): without new_tokens, all of seq (the upper bound).
    resp = gpu_memory.memory_estimate_gb(0.5e9, 24, 2, 64, 151936, 16, 4500, 1, new_tokens=4096)
    assert resp["logits"] == pytest.approx(2 * 4097 * 151936 * 4 / 1e9) and small["logits"] > resp["logits"]
    assert resp["kv_cache"] == small["kv_cache"]                 # the KV cache holds the prompt too
    # Lopti with one optimizer per stage (lopti.py, choice 8) keeps a second AdamW state.
    two = gpu_memory.memory_estimate_gb(0.5e9, 24, 2, 64, 151936, 16, 4500, 1, optimizer_states=2)
    assert two["optimizer"] == 8.0 and two["peak"] == pytest.approx(small["peak"] + 4.0)
    per_stage = config.make_config("ci", method="lopti", lopti_optimizer="per_stage")
    assert [gpu_memory.optimizer_states(c) for c in (per_stage, config.make_config("ci", method="lopti"),
                                                     config.make_config("ci", method="grpo"))] == [2, 1, 1]
    # Every GPU preset fits the GPU it is sized for (benchmarks/memory_table.py's rows).
    mt = load_script("benchmarks/memory_table.py")
    for name, cfg, m in mt.rows():
        assert m["peak"] + 1 <= config.GPU_MEMORY_GB[name], (name, m["peak"])


# ----------------------------------------------------------------------------- learning

def test_rl_selects_derivations_and_raises_the_reward(tmp_path):
    """The whole loop learns: the default run's settings (GRPO+AR+Lopti, lr, 640-token cap)
    from the shipped two-behaviour warm start, on 8 fixed 3-person puzzles that every step
    samples afresh (G = 8): within 10 steps the policy derives more often -- the behaviour
    RL selects -- and the mean reward rises.

    The gradient tests prove each piece; this proves the pieces add up to learning. The
    default run shows the same on new puzzles: its share of derivations rose 0.23-0.36 ->
    0.73-0.88 between steps 1-3 and 8-10 in each of three seeds. A few responses reach the 640-token cap (at most 3 of 64 in a step of
    those runs; no well-formed 3-person derivation is that long, next test)."""
    from lopti_minimal.task import dataset, kk
    warm = ROOT / "checkpoints" / "tiny-warm"
    data = tmp_path / "eight.jsonl"
    kk.save_jsonl(dataset.generate_records(3, 8, seed=7), data)
    cfg = make_config("cpu-tiny", model=str(warm), rl_data=str(data), prompts_per_step=8, steps=10,
                      final_eval=False, plots=False, progress=False,
                      save_every=0, run_dir=str(tmp_path / "run"))
    ms = trainer.train(cfg, log=lambda s: None)["metrics"]

    def mean(key, part):
        return sum(m[key] for m in part) / len(part)

    first, last = ms[:3], ms[-3:]
    assert mean("derive_share", last) > mean("derive_share", first) + 0.2
    assert mean("reward", last) > mean("reward", first) + 0.3
    assert max(m["truncated"] for m in ms) <= 4 / 64


def test_the_default_cap_holds_every_three_person_derivation():
    """The default run's response cap (640 tokens) is above the longest 3-person target:
    a derivation that searches every node (unsolvable puzzles, the worst case) and 100
    generated puzzles, each phrased as the shipped warm start learned them (phrasing.py
    with tail words, 3 draws each) and canonically, with the shipped tokenizer. A cut
    derivation would score -3, below a wrong guess, and teach the policy to guess."""
    import random
    from lopti_minimal.models import load_model_and_tokenizer
    from lopti_minimal.task import behaviours, dataset
    _, tok = load_model_and_tokenizer(str(ROOT / "checkpoints" / "tiny-warm"), device="cpu")
    records = dataset.generate_records(3, 100, seed=3) + dataset.generate_unsolvable_records(3, 30, seed=3)
    texts = [behaviours.derive_response(r) for r in records]
    texts += [behaviours.derive_response(r, random.Random(i), True) for r in records for i in range(3)]
    longest = max(len(tok(t, add_special_tokens=False)["input_ids"]) + 1 for t in texts)
    assert 450 < longest < make_config("cpu-tiny").max_new_tokens, longest
