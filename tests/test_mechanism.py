"""The per-step mechanism metrics (mechanism.py): the bins, the rise / fall shares of Fig. 3,
each bin's share of the squared gradient norm (Fig. 1b), and that the trainer logs them."""
import copy
import json
import math
from dataclasses import replace

import pytest
import torch

from lopti_minimal import mechanism, trainer
from lopti_minimal.config import TrainConfig
from lopti_minimal.grpo import group_advantages, kl_k3, policy_loss, token_logprobs
from lopti_minimal.reweight import reweight_advantages
from lopti_minimal.sampling import sample_groups

from conftest import BOS, EOS, PAD, tiny_llama, update_batch
from test_trainer import length_reward, small_cfg

LOG = math.log


def test_step_shares_by_hand():
    # One row of 8 tokens (the last is padding); pi_old per token and its bin:
    #   0.1 (0), 0.2 (0), 0.3 (1), 0.6 (2), 0.8 (3), 0.9 (3), 1.0 (3), pad
    p_old = torch.tensor([[0.1, 0.2, 0.3, 0.6, 0.8, 0.9, 1.0, 0.5]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 1, 0]], dtype=torch.float32)
    old = p_old.log()
    #                         up    down  up    down  up    up    same  (pad)
    new = old + torch.tensor([[0.1, -0.1, 0.2, -0.3, 0.05, 0.01, 0.0, 9.0]])
    adv = torch.tensor([[1.0, 1.0, -1.0, -2.0, 1.0, -1.0, 1.0, 1.0]])
    s = mechanism.step_shares(old, new, adv, mask)
    assert s["bin_share"] == pytest.approx([2 / 7, 1 / 7, 1 / 7, 3 / 7], abs=1e-5)
    # bin 0: two A > 0 tokens, one rose; no A < 0 token. bin 1: its only token has A < 0 and rose.
    # bin 2: A < 0, fell. bin 3: A > 0 at 0.8 (rose) and at 1.0 (unchanged); A < 0 at 0.9 rose.
    assert s["rise_pos"] == [0.5, None, None, 0.5]
    assert s["fall_neg"] == [None, 0.0, 1.0, 0.0]
    assert s["rise_pos_moved"] == [0.5, None, None, 1.0]      # the saturated token is left out
    assert s["fall_neg_moved"] == [None, 0.0, 1.0, 0.0]
    assert s["nll"] == pytest.approx(-sum(LOG(x) for x in (0.1, 0.2, 0.3, 0.6, 0.8, 0.9, 1.0)) / 7, abs=1e-5)


def _batch():
    torch.manual_seed(0)
    model = tiny_llama()
    prompts = [[BOS, 5, 6, 7], [BOS, 9], [BOS, 10, 11, 12, 13]]
    r = sample_groups(model, prompts, group_size=4, max_new_tokens=12, temperature=0.7,
                      eos_token_id=EOS, pad_token_id=PAD, generator=torch.Generator().manual_seed(0))
    rewards = torch.tensor([3.0, -0.5, -1.0, 3.0, -3.0, -1.0, -3.0, 3.0, 3.0, -1.0, -0.5, -0.5])
    return model, update_batch(r, group_advantages(rewards, 4))


def _bin_grad_sq_by_hand(model, batch, cfg, masks):
    """||d loss_k / d theta||^2 for the loss restricted to each bin, token-mean over all tokens."""
    out = []
    n_all = batch.response_mask.sum()
    for m in masks:
        model.zero_grad()
        logp = token_logprobs(model, batch.input_ids, batch.attention_mask, batch.prompt_len,
                              cfg.temperature)
        pg, _ = policy_loss(logp, batch.old_logprobs, batch.advantages * m, cfg.eps_low,
                            cfg.eps_high, cfg.clip_c)
        per_tok = pg + cfg.kl_coef * kl_k3(logp, batch.ref_logprobs, cfg.kl_log_ratio_clamp)
        ((per_tok * m).sum() / n_all).backward()
        out.append(sum(float((p.grad ** 2).sum()) for p in model.parameters() if p.grad is not None))
    model.zero_grad()
    return out


def test_gradient_sq_shares_by_hand_and_the_weights_stay():
    model, batch = _batch()
    cfg = TrainConfig(temperature=0.7)
    with torch.no_grad():
        old = token_logprobs(model, batch.input_ids, batch.attention_mask, batch.prompt_len, 0.7) \
            * batch.response_mask
    # a KL term with gradient
    batch = replace(batch, old_logprobs=old, ref_logprobs=(old - 0.3) * batch.response_mask)
    before = copy.deepcopy(model.state_dict())
    shares = mechanism.gradient_sq_shares(model, batch, cfg)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    masks = mechanism.bin_masks(batch.old_logprobs.exp(), batch.response_mask)
    sq = _bin_grad_sq_by_hand(model, batch, cfg, masks)
    assert sum(s for s in shares if s is not None) == pytest.approx(1.0, abs=1e-4)
    assert shares == pytest.approx([x / sum(sq) for x in sq], abs=2e-5)
    assert sum(1 for m in masks if m.sum() > 0) >= 3                    # not vacuous

    # AR (Eq. 4) gives the low-probability tokens the smaller weights: their share falls.
    ar = replace(batch, advantages=reweight_advantages(batch.advantages, batch.old_logprobs, 0.3))
    shares_ar = mechanism.gradient_sq_shares(model, ar, TrainConfig(temperature=0.7, kl_coef=0.0))
    shares_grpo = mechanism.gradient_sq_shares(model, batch, TrainConfig(temperature=0.7, kl_coef=0.0))
    assert shares_ar[0] + shares_ar[1] < shares_grpo[0] + shares_grpo[1]


def test_the_trainer_logs_the_mechanism(nano_dir, tmp_path):
    """Every step logs the bin shares and the rise / fall shares; the squared-gradient shares
    only on steps 1, 1 + N, ... with grad_shares_every = N, and not at all by default."""
    res = trainer.train(small_cfg(nano_dir, tmp_path / "a", method="ar_lopti", steps=3, grad_shares_every=2),
                        reward_fn=length_reward, log=lambda s: None)
    ms = [json.loads(l) for l in (tmp_path / "a" / "run" / "metrics.jsonl").read_text().splitlines()]
    assert ms == json.loads(json.dumps(res["metrics"]))
    for m in ms:
        assert len(m["bin_share"]) == len(m["rise_pos"]) == len(m["fall_neg"]) == 4
        assert sum(x for x in m["bin_share"] if x) == pytest.approx(1.0, abs=1e-4)
        assert m["nll"] > 0
    assert ["grad_sq_share" in m for m in ms] == [True, False, True]
    assert any(x for m in ms for x in m["rise_pos"] if x is not None)     # the updates moved tokens
    plain = trainer.train(small_cfg(nano_dir, tmp_path / "b", method="grpo", steps=1),
                          reward_fn=length_reward, log=lambda s: None)
    assert "grad_sq_share" not in plain["metrics"][0] and "rise_pos" in plain["metrics"][0]
    assert all(m["mechanism_s"] >= 0 for m in ms)
    # The run records the code it ran on (a report says which commit its runs used).
    import subprocess
    code = json.loads((tmp_path / "a" / "run" / "run.json").read_text())["code"]
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert code["commit"] == head and isinstance(code["dirty"], bool)


def test_the_report_compares_the_mechanism_paired_by_seed(tmp_path):
    """Synthetic study runs with known mechanism metrics: run_scalars' numbers, the paired
    difference from GRPO in the aggregate, and the report's table and figure."""
    from lopti_minimal.experiments import aggregate as A, grid as G, report as R, study as S
    from lopti_minimal.experiments.mechanism_report import run_scalars
    from test_study import write_finished
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    out = tmp_path / "study"

    def steps(rise_top, grad_low):      # 3 steps; grad shares at steps 1 and 3
        ms = []
        for i in range(3):
            m = {"rise_pos_moved": [0.5, None, 0.5, rise_top[i]], "fall_neg_moved": [0.9, 0.8, 0.7, 0.6],
                 "bin_share": [0.1, 0.1, 0.2, 0.6], "nll": 0.3 - 0.1 * i}
            if i != 1:
                m["grad_sq_share"] = [grad_low[i] / 2, grad_low[i] / 2, 0.0, 1 - grad_low[i]]
            ms.append(m)
        return ms

    runs = {G.GRPO: [steps([.4, .5, .6], [.8, 0, .6]), steps([.3, .3, .3], [.7, 0, .7])],
            G.Variant("lopti", eta=0.4): [steps([.6, .6, .6], [.8, 0, .6]), steps([.5, .5, .5], [.7, 0, .7])]}
    for v, per_seed in runs.items():
        for seed, extra in enumerate(per_seed):
            spec = S.RunSpec("ci", v, seed, "main")
            write_finished(spec.run_dir(out), S.run_config(spec, out, {"model": str(model), "steps": 3}),
                           {3: .5}, extra=extra)
    sc = run_scalars([json.loads(l) for l in (out / "ci" / "grpo-s0" / "metrics.jsonl").read_text().splitlines()])
    assert sc["rise_b3"] == pytest.approx(0.5) and sc["rise_b1"] is None and sc["fall_b0"] == pytest.approx(0.9)
    assert sc["grad_low_first"] == pytest.approx(0.8) and sc["grad_low_mean"] == pytest.approx(0.7)
    assert sc["nll_first"] == pytest.approx(0.3) and sc["nll_last"] == pytest.approx(0.1)
    res = A.aggregate(out, window=1)
    lo = res["presets"]["ci"]["grids"]["main"]["rows"]["lopti-e0.4"]
    d = lo["mechanism"]["rise_b3"]["vs_grpo"]        # seed 0: .6 - .5; seed 1: .5 - .3
    assert d["mean"] == pytest.approx(0.15) and d["seeds"] == [0, 1]
    assert lo["mechanism"]["grad_low_first"]["vs_grpo"]["mean"] == pytest.approx(0.0)
    c = lo["mechanism_curves"]["A > 0 that rose, [.75,1]"]
    assert c["step"] == [1, 2, 3] and c["mean"] == pytest.approx([0.55, 0.55, 0.55])
    assert lo["mechanism_curves"]["low bins' share of the squared gradient norm"]["step"] == [1, 3]
    report, figs = tmp_path / "RESULTS.md", tmp_path / "figures"
    R.write_report(res, report, figs)
    text = (tmp_path / "RESULTS_TABLES.md").read_text()             # the mechanism: in the full tables
    assert "| method | rose, A > 0, [0,.25) |" in text
    assert "0.550 ± " in text and "Δ +0.150 (2 of 2 higher)" in text     # two seeds: their signs
    assert (figs / "study-ci-main-mechanism.png").stat().st_size > 1000


def test_gradient_by_token_replays_a_run_and_splits_its_bins(nano_dir, tmp_path):
    """scripts/gradient_by_token.py: the replay measures the very shares the run logged, the
    decomposition's whole-bin norms give those shares, and its parts cover each bin."""
    from conftest import load_script
    gt = load_script("scripts/gradient_by_token.py")
    cfg = small_cfg(nano_dir, tmp_path / "a", method="clip_cov", steps=2, grad_shares_every=1)
    trainer.train(cfg, reward_fn=length_reward, log=lambda s: None)
    res = gt.replay(cfg.run_dir, 2, str(tmp_path / "work"), reward_fn=length_reward, block=4, max_tokens=64)
    assert res["replayed"] == res["logged"] and res["logged"] is not None
    total = sum(b["sq"] for b in res["bins"])
    assert [round(b["sq"] / total, 5) for b in res["bins"]] == res["logged"]
    for b in (b for b in res["bins"] if b["tokens"]):
        assert sum(p["tokens"] for p in b["blocks"]) == b["tokens"]
        assert len(b["top_row"]["tokens"]) == b["rows"][0]["tokens"]
        assert all(0 <= t["p_old"] <= 1 and t["sq"] >= 0 for t in b["top_row"]["tokens"])
    assert "|g|^2" in gt.format_report(res)
