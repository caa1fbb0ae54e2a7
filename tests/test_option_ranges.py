"""No silent failure at the door: every numeric option of train.py (a TrainConfig field) and
of eval.py lies in its range (config.RANGES, one row per field), and a value outside it --
NaN, an infinity where the number must be finite, a probability outside its interval, a
count below its least -- is refused with one line that names the option, the value and the
range, exit code 2, nothing written. The boundary values themselves are accepted."""
import dataclasses
import math

import pytest

import eval as eval_cli
import train as train_cli
from lopti_minimal.config import INT_MAX, RANGES, TrainConfig, TrainError, make_config


# (train.py's arguments, the option's name and the value as the refusal prints them)
BAD_TRAIN = [
    (["--lr", "inf"], "lr", "inf"), (["--lr", "1e300"], "lr", "1e+300"), (["--lr", "0"], "lr", "0.0"),
    (["--lr", "nan"], "lr", "nan"),
    (["--top-p", "0"], "top-p", "0.0"), (["--top-p", "-1"], "top-p", "-1.0"), (["--top-p", "1.5"], "top-p", "1.5"),
    (["--top-k", "-5"], "top-k", "-5"),
    (["--kl-coef", "-1"], "kl-coef", "-1.0"), (["--kl-coef", "nan"], "kl-coef", "nan"),
    (["--kl-coef", "inf"], "kl-coef", "inf"),
    (["--eps-low", "2"], "eps-low", "2.0"), (["--eps-low", "1"], "eps-low", "1.0"),
    (["--eps-high", "-0.1"], "eps-high", "-0.1"), (["--eps-high", "inf"], "eps-high", "inf"),
    (["--clip-c", "1"], "clip-c", "1.0"), (["--clip-c", "inf"], "clip-c", "inf"),
    (["--temperature", "inf"], "temperature", "inf"), (["--temperature", "0"], "temperature", "0.0"),
    (["--temperature", "nan"], "temperature", "nan"),
    (["--threads", "-3"], "threads", "-3"), (["--threads", "0"], "threads", "0"),
    (["--grad-clip", "0"], "grad-clip", "0.0"), (["--grad-clip", "nan"], "grad-clip", "nan"),
    (["--weight-decay", "-0.01"], "weight-decay", "-0.01"),
    (["--alpha", "nan"], "alpha", "nan"), (["--eta", "inf"], "eta", "inf"),
    (["--kl-log-ratio-clamp", "21"], "kl-log-ratio-clamp", "21.0"),
    (["--group-size", "1"], "group-size", "1"), (["--steps", "0"], "steps", "0"),
    (["--seed", "-1"], "seed", "-1"), (["--max-new-tokens", "0"], "max-new-tokens", "0"),
    (["--rollout-chunk", "-1"], "rollout-chunk", "-1"), (["--lora-rank", "-1"], "lora-rank", "-1"),
    (["--mmap-threshold-mb", "2048"], "mmap-threshold-mb", "2048"),
    (["--eval-per-size", "0"], "eval-per-size", "0"), (["--save-every", "-1"], "save-every", "-1"),
    (["--cispo-eps-high", "nan"], "cispo-eps-high", "nan"),
    (["--clip-cov-low=-inf"], "clip-cov-low", "-inf"),
    (["--entropy-top-quantile", "1.5"], "entropy-top-quantile", "1.5"),
    (["--dynamic-sampling", "33"], "dynamic-sampling", "33"), (["--dynamic-sampling", "-1"], "dynamic-sampling", "-1"),
]


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize("args, name, shown", BAD_TRAIN, ids=[" ".join(a) for a, _, _ in BAD_TRAIN])
def test_train_refuses_a_number_out_of_range(args, name, shown, tmp_path, capsys):
    run = tmp_path / "run"
    method = ["--method", "ar_lopti"] if name in ("alpha", "eta") else []
    code = train_cli.main(["--preset", "ci", "--steps", "1", "--no-eval", "--run-dir", str(run),
                           "--no-progress", *method, *args])
    assert code == 2
    line = one_line(capsys)
    assert line.startswith(f"error: {name} must ") and line.endswith(f"got {shown}"), line
    assert not run.exists()


def test_the_warm_start_budget_is_checked_too(capsys):
    for bad in ("0", "-5", "nan", "inf"):
        with pytest.raises(SystemExit) as e:
            train_cli.parse_args(["--rebuild-warmstart", "--warmstart-minutes", bad])
        assert e.value.code == 2 and "warmstart-minutes must be" in one_line(capsys)


# Each range's ends (and a value just inside an open end) are accepted.
BOUNDARIES = dict(lr=[1.0, 1e-12], top_p=[1.0, 1e-9], top_k=[0, INT_MAX], kl_coef=[0.0], eps_low=[0.0, 0.999],
                  eps_high=[0.0], clip_c=[1.0000001], temperature=[0.01, 100.0], threads=[1, 1024],
                  grad_clip=[math.inf, 1e-9], weight_decay=[0.0, 1.0], kl_log_ratio_clamp=[20.0],
                  group_size=[2], seed=[0, INT_MAX], rollout_chunk=[0], lora_rank=[0], save_every=[0],
                  keep_checkpoints=[0], mmap_threshold_mb=[0, 2047], entropy_top_quantile=[0.0, 1.0],
                  clip_cov_low=[-1e9], kl_cov_coef=[0.0], eval_every=[0], grad_shares_every=[0],
                  dynamic_sampling=[0, 32])


@pytest.mark.parametrize("field, value", [(f, v) for f, vs in BOUNDARIES.items() for v in vs])
def test_the_boundaries_are_accepted(field, value):
    assert getattr(make_config("ci", **{field: value}), field) == value


def test_the_boundaries_through_the_command_line():
    a = train_cli.parse_args(["--preset", "ci", "--lr", "1", "--top-p", "1", "--top-k", "0", "--kl-coef", "0",
                              "--eps-low", "0", "--temperature", "100", "--threads", "1", "--clip-c", "1.5",
                              "--grad-clip", "inf", "--alpha", "1", "--eta", "1"])
    cfg = train_cli.build_config(a)
    assert (cfg.lr, cfg.top_p, cfg.top_k, cfg.grad_clip, cfg.alpha, cfg.eta) == (1.0, 1.0, 0, math.inf, 1.0, 1.0)


def test_every_numeric_field_has_a_range():
    """A new numeric field must say its range (config.RANGES); the table names no other field."""
    numeric = {f.name for f in dataclasses.fields(TrainConfig) if f.type.split("|")[0].strip() in ("int", "float")}
    assert numeric == set(RANGES)


@pytest.mark.parametrize("kw, words", [
    (dict(steps=2.5), "steps must be an integer >= 1, got 2.5"),      # not through argparse: a float
    (dict(lr=0.6, lr_scale=2.0), "lr x lr-scale"),                    # across fields
    (dict(adam_betas=(0.9, 1.0)), "adam-betas"),
    (dict(clip_cov_low=5.0, clip_cov_high=1.0), "clip-cov-low < clip-cov-high"),
    (dict(on_nonfinite="ignore"), "on-nonfinite"),
])
def test_rules_beyond_the_table(kw, words):
    with pytest.raises(TrainError, match=words.replace("+", r"\+").replace("(", r"\(")):
        make_config("ci", **kw)


BAD_EVAL = [
    (["--temperature", "inf"], "--temperature", "inf"),
    (["--temperature", "0", "--samples", "2"], "--temperature", "0.0"),
    (["--samples", "0"], "--samples", "0"), (["--per-size", "0"], "--per-size", "0"),
    (["--batch-size", "-1"], "--batch-size", "-1"), (["--max-new-tokens", "0"], "--max-new-tokens", "0"),
    (["--seed", "-1"], "--seed", "-1"), (["--threads", "-3"], "--threads", "-3"),
    (["--mmap-threshold-mb", "-1"], "--mmap-threshold-mb", "-1"),
]


@pytest.mark.parametrize("args, name, shown", BAD_EVAL, ids=[" ".join(a) for a, _, _ in BAD_EVAL])
def test_eval_refuses_a_number_out_of_range(args, name, shown, tmp_path, capsys):
    out = tmp_path / "rep.json"
    assert eval_cli.main(["--model", "/nonexistent/model", "--no-progress", "--out", str(out), *args]) == 2
    line = one_line(capsys)
    assert line.startswith(f"error: {name} must ") and line.endswith(f"got {shown}"), line
    assert not out.exists()


def test_eval_options_take_their_training_fields_ranges():
    """eval.py's options are checked against the rows of the TrainConfig fields they stand for."""
    a = eval_cli.parse_args(["--model", "m", "--temperature", "0.01", "--threads", "1024", "--per-size", "1",
                             "--batch-size", "1", "--max-new-tokens", "1", "--seed", "0", "--mmap-threshold-mb", "0"])
    eval_cli.check_options(a)
    assert set(eval_cli.OPTION_FIELDS.values()) <= set(RANGES)
