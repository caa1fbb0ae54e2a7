"""A non-finite number never updates the weights (precision.py, choice 7). A NaN reward from
step 2 on stops the run by default: one line names the value and the step, nothing of the
step is saved, every weight file on disk is finite, the last good checkpoint survives the
rotation, and --resume continues from it exactly as an uninterrupted run. With
on_nonfinite "skip" the step makes no update, its metrics line says so, and the run goes on.
Inside the update, a NaN loss or gradient norm takes no optimizer step; the one saver refuses
non-finite weights."""
import copy
import math
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import train as train_cli
from conftest import tiny_llama, update_batch
from test_trainer import length_reward, small_cfg, strip
from lopti_minimal import plumbing, precision, runs, trainer
from lopti_minimal.config import TrainConfig
from lopti_minimal.grpo import group_advantages, grpo_update
from lopti_minimal.precision import NonFiniteError
from lopti_minimal.sampling import sample_groups

ROWS = 2 * 4          # the ci preset's responses a step: 2 prompts x G = 4


def nan_at(steps):
    """length_reward, but NaN for every response of the given RL steps (1-based), counted by
    calls: the ci preset scores ROWS responses a step."""
    calls = [0]

    def reward(text, record):
        calls[0] += 1
        return float("nan") if (calls[0] - 1) // ROWS + 1 in steps else length_reward(text, record)
    return reward


def weight_files(run: Path) -> list[Path]:
    return sorted(run.rglob("*.safetensors"))


def weights(folder: Path) -> dict:
    return load_file(str(folder / "model.safetensors"))


def test_a_nan_reward_stops_the_run_and_keeps_the_last_good_checkpoint(nano_dir, tmp_path):
    cfg = small_cfg(nano_dir, tmp_path, steps=4, save_every=1, keep_checkpoints=1, threads=1)
    with pytest.raises(NonFiniteError) as e:
        trainer.train(cfg, reward_fn=nan_at(range(2, 5)), log=lambda s: None)
    msg = str(e.value)
    assert len(msg.splitlines()) == 1 and msg.startswith("step 2: the reward was not finite (nan in 8 of 8)")
    assert "no update was made" in msg and "ckpt-000001" in msg
    run = Path(cfg.run_dir)
    assert [s for s, _ in runs.checkpoints(run)] == [1] and not (run / "final").exists()
    assert weight_files(run) and all(torch.isfinite(t).all() for f in weight_files(run)
                                     for t in load_file(str(f)).values())
    assert [m["step"] for m in runs.read_jsonl(run / "metrics.jsonl")] == [1]


def test_the_command_line_says_it_in_one_line_exit_3(nano_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(trainer, "default_reward", nan_at({2}))
    run = tmp_path / "run"
    code = train_cli.main(["--preset", "ci", "--model", nano_dir, "--run-dir", str(run), "--steps", "3",
                           "--max-new-tokens", "16", "--no-eval", "--no-plots", "--no-progress", "--threads", "1"])
    # (transformers' own loading bars share stderr)
    err = [line for line in capsys.readouterr().err.splitlines() if "Loading weights" not in line
           and "Writing model shards" not in line and line.strip()]
    assert code == 3 and len(err) == 1, err
    assert err[0].startswith("error: step 2: the reward was not finite") and f"--resume {run}" in err[0]


def test_resume_after_the_stop_continues_from_the_last_good_checkpoint(nano_dir, tmp_path):
    """Stopped at step 2, then resumed (the reward fixed): the run equals an uninterrupted
    one, metrics and final weights bit for bit."""
    plain = trainer.train(small_cfg(nano_dir, tmp_path / "a", steps=3, save_every=1, threads=1),
                          reward_fn=length_reward, log=lambda s: None)
    cfg = small_cfg(nano_dir, tmp_path / "b", steps=3, save_every=1, threads=1)
    with pytest.raises(NonFiniteError):
        trainer.train(cfg, reward_fn=nan_at({2}), log=lambda s: None)
    resumed = trainer.train(plumbing.resume_config(cfg.run_dir, progress=False), resume=True,
                            reward_fn=length_reward, log=lambda s: None)
    assert strip(resumed["metrics"]) == strip(plain["metrics"]) and len(plain["metrics"]) == 3
    wa, wb = (weights(Path(r["paths"]["final_model"])) for r in (plain, resumed))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_skip_makes_no_update_on_the_step_and_logs_it(nano_dir, tmp_path):
    cfg = small_cfg(nano_dir, tmp_path, steps=3, save_every=1, keep_checkpoints=0, threads=1,
                    on_nonfinite="skip")
    logged = []
    res = trainer.train(cfg, reward_fn=nan_at({2}), log=logged.append)
    m = res["metrics"]
    assert [x.get("nonfinite") for x in m] == [None, ["reward: nan in 8 of 8"], None]
    assert m[1]["grad_norm"] == 0.0 and m[0]["grad_norm"] > 0 and m[2]["grad_norm"] > 0
    assert any("skipped: reward: nan in 8 of 8" in s for s in logged)
    run = Path(cfg.run_dir)
    assert json.loads((run / "metrics.jsonl").read_text().splitlines()[1])["nonfinite"] == ["reward: nan in 8 of 8"]
    # strict JSON (no bare NaN, which strict readers refuse): null, and a field saying what it was
    def refuse(c):
        raise ValueError(f"not strict JSON: {c}")
    strict = [json.loads(line, parse_constant=refuse) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert strict[1]["reward"] is None and strict[1][runs.NONFINITE_FIELD]["reward"] == "nan"
    assert math.isnan(runs.read_jsonl(run / "metrics.jsonl")[1]["reward"])     # the readers get NaN back
    w1, w2, w3 = (weights(run / f"ckpt-00000{k}") for k in (1, 2, 3))
    assert all(torch.equal(w1[k], w2[k]) for k in w1)            # step 2 changed nothing
    assert any(not torch.equal(w2[k], w3[k]) for k in w2)        # step 3 trained
    assert all(torch.isfinite(t).all() for f in weight_files(run) for t in load_file(str(f)).values())


def test_resume_may_switch_to_skip(nano_dir, tmp_path):
    cfg = small_cfg(nano_dir, tmp_path, steps=3, save_every=1, threads=1)
    with pytest.raises(NonFiniteError):
        trainer.train(cfg, reward_fn=nan_at({2}), log=lambda s: None)
    a = train_cli.parse_args(["--resume", cfg.run_dir, "--on-nonfinite", "skip"])
    assert train_cli.build_config(a).on_nonfinite == "skip"
    res = trainer.train(plumbing.resume_config(cfg.run_dir, progress=False, on_nonfinite="skip"), resume=True,
                        reward_fn=nan_at({1}), log=lambda s: None)     # its first call is step 2's
    assert [x.get("nonfinite") for x in res["metrics"]] == [None, ["reward: nan in 8 of 8"], None]


# ------------------------------------------------------------- inside the update

def nan_loss_setup(on_nonfinite):
    """A tiny Llama and a batch whose pi_ref log-probs hold one NaN: finite advantages, a NaN
    KL term, so a NaN loss (what the batch check before the update would catch; here
    grpo_update meets it alone)."""
    torch.manual_seed(0)
    model = tiny_llama()
    r = sample_groups(model, [[2, 5, 6], [2, 9]], group_size=4, max_new_tokens=8, temperature=1.0,
                      eos_token_id=1, pad_token_id=0, generator=torch.Generator().manual_seed(0))
    cfg = TrainConfig(temperature=1.0, kl_coef=0.1, mini_batch_size=8, micro_batch_size=4,
                      on_nonfinite=on_nonfinite)
    ref = torch.zeros_like(r.response_mask, dtype=torch.float32)
    ref[0, 0] = float("nan")
    b = update_batch(r, group_advantages(torch.tensor([1.0, 0, 0, 1, 0, 1, 0, 0]), 4), ref, cfg)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2), b, cfg


def test_a_nan_loss_takes_no_optimizer_step(tmp_path):
    model, opt, b, cfg = nan_loss_setup("stop")
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(NonFiniteError, match="the loss was not finite"):
        grpo_update(model, opt, b, cfg)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items()) and not opt.state
    model, opt, b, cfg = nan_loss_setup("skip")
    precision.take_skipped()
    m = grpo_update(model, opt, b, cfg)
    assert m["n_steps"] == 0 and precision.take_skipped() == ["loss: nan in 1 of 2"]
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items()) and not opt.state


def test_a_nan_gradient_with_a_finite_loss_takes_no_optimizer_step():
    model, opt, b, cfg = nan_loss_setup("stop")
    b = update_batch(b, b.advantages, torch.zeros_like(b.old_logprobs), cfg)     # a finite loss
    w = model.lm_head.weight
    w.register_hook(lambda g: g * float("inf"))            # ... and an infinite gradient
    before = w.detach().clone()
    with pytest.raises(NonFiniteError, match="the gradient norm was not finite"):
        grpo_update(model, opt, b, cfg)
    assert torch.equal(w.detach(), before)


def test_the_saver_refuses_non_finite_weights_and_deletes_no_checkpoint(nano_dir, tmp_path):
    from lopti_minimal.models import load_model_and_tokenizer
    model, tok = load_model_and_tokenizer(nano_dir, dtype=torch.float32, device="cpu")
    opt = torch.optim.AdamW(model.parameters())
    runs.save_checkpoint(tmp_path, 1, model, tok, opt, {}, keep=1)
    with torch.no_grad():
        next(model.parameters())[0, 0] = float("nan")
    with pytest.raises(NonFiniteError, match="the policy was not finite .*ckpt-000002 was not written"):
        runs.save_checkpoint(tmp_path, 2, model, tok, opt, {}, keep=1)
    assert [s for s, _ in runs.checkpoints(tmp_path)] == [1] and not list(tmp_path.glob("ckpt-000002*"))
