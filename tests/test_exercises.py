"""The tutorial's exercises (lopti_minimal/experiments/exercises.py): each checker passes the tutorial's own
solutions, taken from the committed notebook's solutions cell, and fails its stub and every
wrong function below, on a real batch of the shipped tiny model (a few seconds on one core).
"""
import dataclasses
import json

import pytest
import torch

from conftest import ROOT
from lopti_minimal import config, grpo, models, precision, reweight, sampling
from lopti_minimal.experiments import exercises
from lopti_minimal.task import dataset

NOTEBOOK = ROOT / "tutorial.ipynb"
CHECKS = {"my_ar_factor": "ar_factor", "my_split": "split", "my_lopti_update": "two_stages",
          "my_clipped_loss": "clipped_loss"}


def _code_cells() -> list[str]:
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    return ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]


@pytest.fixture(scope="module")
def real():
    """The tutorial's names, on a smaller batch: 2 three-person puzzles x G = 8 at T 0.7 from
    checkpoints/tiny-warm, with pi_old, advantages (one per response, both signs), pi_ref,
    and AR's advantages (batch_ar)."""
    torch.manual_seed(0)
    model, tok = models.load_model_and_tokenizer(str(ROOT / "checkpoints" / "tiny-warm"),
                                                 dtype=torch.float32, device="cpu")
    cfg = config.make_config("cpu-tiny")
    _, prompt_ids = models.encode_prompts(dataset.generate_records(3, 2, seed=1), tok, cfg.prompt_style,
                                          cfg.max_prompt_len)
    ro = sampling.sample_groups(model, prompt_ids, group_size=cfg.group_size, max_new_tokens=cfg.max_new_tokens,
                                temperature=cfg.temperature, eos_token_id=tok.eos_token_id,
                                pad_token_id=tok.pad_token_id, generator=torch.Generator().manual_seed(0))
    adv = torch.linspace(-1.5, 1.5, ro.response_mask.shape[0])
    batch = dataclasses.replace(ro, old_logprobs=grpo.batch_logprobs(model, ro, cfg))
    batch = dataclasses.replace(batch, advantages=grpo.token_advantages(adv, ro.response_mask),
                                ref_logprobs=grpo.batch_logprobs(precision.reference_copy(model), batch, cfg))
    batch_ar = dataclasses.replace(batch, advantages=reweight.reweight_advantages(batch.advantages,
                                                                                   batch.old_logprobs, cfg.alpha))
    return {"model": model, "batch": batch, "batch_ar": batch_ar, "mask": batch.response_mask, "CFG": cfg,
            "ETA": cfg.eta, "exercises": exercises, "grpo": grpo, "torch": torch}


def _check(name: str, fn, r) -> bool:
    b, cfg = r["batch"], r["CFG"]
    if name == "my_ar_factor":
        return exercises.check_ar_factor(fn, b.old_logprobs, r["mask"])
    if name == "my_split":
        return exercises.check_split(fn, b.old_logprobs, r["mask"])
    if name == "my_lopti_update":
        return exercises.check_two_stages(fn, r["model"], r["batch_ar"], cfg, r["ETA"])
    return exercises.check_clipped_loss(fn, b.old_logprobs, b.advantages, r["mask"], cfg.eps_low, cfg.eps_high, cfg.clip_c)


def test_the_stubs_print_not_yet(real, capsys):
    stubs = [c for c in _code_cells() if "raise NotImplementedError" in c]
    assert len(stubs) == len(CHECKS), f"{len(stubs)} stub cells"
    for src in stubs:
        ns = dict(real)
        exec(src, ns)
        (name,) = [n for n in CHECKS if n in ns]
        assert _check(name, ns[name], real) is False
        assert "not yet" in capsys.readouterr().out


def test_the_solutions_pass(real, capsys):
    (src,) = [c for c in _code_cells() if "solved = {" in c]
    ns = dict(real)
    before = {n: p.detach().clone() for n, p in real["model"].named_parameters()}
    exec(src, ns)
    assert ns["solved"] == {v: True for v in CHECKS.values()}, capsys.readouterr().out
    assert capsys.readouterr().out.count(": correct") == len(CHECKS)
    # the checker restores the model: the next exercise starts from the same weights
    assert all(torch.equal(p, before[n]) for n, p in real["model"].named_parameters())


def _wrong_two_stages(order="low", fresh_second=False, unmasked_second=False):
    def fn(model, optimizer, batch, cfg, eta):
        valid = batch.response_mask > 0
        low = ((batch.old_logprobs.exp() < eta) & valid).float()
        high = valid.float() - low
        first, second = (low, high) if order == "low" else (high, low)
        grpo.grpo_update(model, optimizer, batch, cfg, token_mask=first)
        opt2 = precision.build_optimizer(model, cfg) if fresh_second else optimizer
        grpo.grpo_update(model, opt2, batch, cfg, token_mask=None if unmasked_second else second)
    return fn


def _clipped(eps_low_high=None, dual=True, combine=torch.maximum):
    def fn(logp, old_logp, advantages, eps_low, eps_high, clip_c):
        rho = (logp - old_logp).exp()
        hi = eps_high if eps_low_high is None else eps_low_high
        loss = combine(-advantages * rho, -advantages * rho.clamp(1 - eps_low, 1 + hi))
        return torch.where(advantages < 0, torch.minimum(loss, -advantages * clip_c), loss) if dual else loss
    return fn


WRONG = {
    "my_ar_factor": [lambda old, a: a * old.exp() + 1,                 # 1 - alpha forgotten
                     lambda old, a: (1 - a) * old.exp() + a,           # the two weights swapped
                     lambda old, a: a * old + 1 - a],                  # log pi_old, not pi_old
    "my_split": [lambda old, m, eta: ((old.exp() < eta).float(), (old.exp() >= eta).float()),   # padding in both
                 lambda old, m, eta: (((old.exp() > eta) & (m > 0)).float(), ((old.exp() <= eta) & (m > 0)).float())],
    "my_lopti_update": [_wrong_two_stages(order="high"), _wrong_two_stages(fresh_second=True),
                        _wrong_two_stages(unmasked_second=True)],
    "my_clipped_loss": [_clipped(eps_low_high=0.20),                    # symmetric clip: no clip-higher
                        _clipped(dual=False),                           # no dual clip
                        _clipped(combine=torch.minimum)],               # min instead of max
}


@pytest.mark.parametrize("name,i", [(n, i) for n, fns in WRONG.items() for i in range(len(fns))])
def test_a_wrong_function_fails(real, capsys, name, i):
    assert _check(name, WRONG[name][i], real) is False
    assert "not yet" in capsys.readouterr().out


def test_a_function_that_errs_is_not_yet_and_raises_nothing(real, capsys):
    assert exercises.check_ar_factor(lambda old, a: old.nope, real["batch"].old_logprobs, real["mask"]) is False
    assert "not yet: AttributeError" in capsys.readouterr().out
