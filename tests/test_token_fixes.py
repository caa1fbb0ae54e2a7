"""Beyond the paper (token_fixes.py): the high-entropy minority tokens (arXiv 2506.01939),
CISPO (arXiv 2506.13585), Clip-Cov and KL-Cov (arXiv 2505.22617): their per-token masks and
losses on hand-made tensors, what each does to the probability bins' share of the gradient
(mechanism.bin_masks), their plumbing through grpo_update, the config and the study grid.
(Equality with TRL's `_compute_loss`: tests/test_trl_grpo.py.)"""
import copy
import math
from dataclasses import replace

import pytest
import torch

from lopti_minimal import mechanism, token_fixes as TF
from lopti_minimal.config import TOKEN_FIXES, TrainConfig, TrainError, make_config
from lopti_minimal.grpo import batch_logprobs, group_advantages, grpo_update, policy_loss
from lopti_minimal.sampling import sample_groups

from conftest import BOS, EOS, PAD, load_script, tiny_llama, update_batch

LOG = math.log


# ------------------------------------------------------------------ masks by hand


def test_high_entropy_mask_by_hand():
    # 8 valid tokens, one padding position (entropy 9, must never be picked).
    H = torch.tensor([[0.1, 2.0, 0.5, 3.0, 9.0], [1.0, 0.2, 2.5, 0.0, 0.0]])
    valid = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 0]], dtype=torch.float32)
    # sorted valid: 0 .1 .2 .5 1 2 2.5 3; the 0.8-quantile (linear, position 0.8 * 7 = 5.6)
    # is 2 + 0.6 * 0.5 = 2.3: the tokens at 3.0 and 2.5 pass (2 of 8 >= 20%).
    m = TF.high_entropy_mask(H, valid, 0.2)
    assert m.tolist() == [[0, 0, 0, 1, 0], [0, 0, 1, 0, 0]]
    assert TF.high_entropy_mask(H, valid, 1.0).tolist() == valid.tolist()       # all valid tokens
    assert TF.high_entropy_mask(H, valid, 0.0).tolist() == [[0, 0, 0, 1, 0], [0, 0, 0, 0, 0]]  # the max
    # ties at the threshold are kept (TRL's >=): four equal entropies all pass
    assert TF.high_entropy_mask(torch.ones(1, 4), torch.ones(1, 4), 0.2).sum() == 4


def test_covariance_and_the_selections_by_hand():
    # Four tokens: A > 0 at p .9 and .1, A < 0 at p .1 and .9 (mean A 0, mean log p = m).
    p = torch.tensor([[0.9, 0.1, 0.1, 0.9]])
    A = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    valid = torch.ones(1, 4)
    m = (2 * LOG(0.9) + 2 * LOG(0.1)) / 4
    want = [(LOG(0.9) - m) * 1, (LOG(0.1) - m) * 1, (LOG(0.1) - m) * -1, (LOG(0.9) - m) * -1]
    cov = TF.token_covariance(p.log(), A, valid)
    assert cov[0].tolist() == pytest.approx(want, abs=1e-6)
    # High covariance = a confident token pushed up or an unlikely one pushed down: the two
    # updates that lower the entropy. KL-Cov's top half picks exactly those.
    assert TF.kl_cov_mask(cov, valid, 0.5).tolist() == [[1, 0, 1, 0]]
    one = TF.kl_cov_mask(cov, valid, 1e-9)          # a tiny k still penalises one token
    assert one.sum() == 1 and (one <= TF.kl_cov_mask(cov, valid, 0.5)).all()   # (0 and 2 tie)
    # padding takes no part in the means nor the selection
    pad = torch.cat([valid, torch.zeros(1, 2)], 1)
    cov_p = TF.token_covariance(torch.cat([p.log(), torch.full((1, 2), -9.0)], 1),
                                torch.cat([A, torch.full((1, 2), 5.0)], 1), pad)
    assert cov_p[0, :4].tolist() == pytest.approx(want, abs=1e-6) and cov_p[0, 4:].tolist() == [0, 0]
    assert TF.kl_cov_mask(cov_p, pad, 1.0)[0, 4:].tolist() == [0, 0]


def test_clip_cov_draws_uniformly_inside_the_band():
    cov = torch.tensor([[0.5, 1.0, 1.5, 2.0, 4.9, 5.0, 6.0, 3.0]])
    valid = torch.tensor([[1, 1, 1, 1, 1, 1, 1, 0]], dtype=torch.float32)   # the 3.0 is padding
    band = {2, 3, 4}                         # 1 < cov < 5, strict (1.0 and 5.0 are out)
    # r N = 0.3 * 7 = 2.1 -> 2 tokens of the 3 candidates; a tiny r still detaches one
    seen = set()
    for seed in range(30):
        m = TF.clip_cov_mask(cov, valid, 0.3, 1.0, 5.0, torch.Generator().manual_seed(seed))
        picked = set(m[0].nonzero().flatten().tolist())
        assert len(picked) == 2 and picked <= band
        seen |= picked
    assert seen == band                      # every candidate can be drawn
    g = lambda: torch.Generator().manual_seed(7)                               # noqa: E731
    assert torch.equal(TF.clip_cov_mask(cov, valid, 0.3, generator=g()),
                       TF.clip_cov_mask(cov, valid, 0.3, generator=g()))        # seeded: repeatable
    assert TF.clip_cov_mask(cov, valid, 1e-9, generator=g()).sum() == 1
    assert TF.clip_cov_mask(cov, valid, 1.0, generator=g()).sum() == 3         # fewer qualify
    assert TF.clip_cov_mask(cov, valid, 0.3, 10.0, 20.0, g()).sum() == 0        # none qualify


# --------------------------------------------------- losses: per-token gradient by hand


def d_loss_d_logp(loss_fn, logp, *args):
    logp = logp.clone().requires_grad_(True)
    loss, stats = loss_fn(logp, *args)
    (g,) = torch.autograd.grad(loss.sum(), logp)
    return g, loss.detach(), stats


def bin_shares(g, p_old, valid):
    """Each bin's share of sum |dL/d log pi|: the per-token weight on grad log pi."""
    total = float((g.abs() * valid).sum())
    return [float((g.abs() * b).sum()) / total for b in mechanism.bin_masks(p_old, valid)]


def test_cispo_keeps_the_low_bins_gradient_where_ppo_zeroes_it():
    """A fixed tiny batch after one optimizer step: the low-probability tokens moved most,
    so their rho left the clip range on the side their advantage pushes (rho 2 with A > 0,
    0.5 with A < 0), the high ones stayed near 1. PPO's clip gives the low bins 0 gradient;
    CISPO keeps it, -sg(w) A per unit of grad log pi, w = rho clipped to [1 - 1, 1 + 4]."""
    p_old = torch.tensor([[0.10, 0.20, 0.30, 0.45, 0.60, 0.90, 0.95, 0.10]])
    rho = torch.tensor([[2.00, 0.50, 2.00, 8.00, 1.05, 1.10, 0.95, 0.50]])
    A = torch.tensor([[1.0, -1.0, 1.0, 1.0, 1.0, 1.0, -1.0, -1.0]])
    valid = torch.ones_like(A)
    old = p_old.log()
    logp = old + rho.log()
    g_ppo, _, st = d_loss_d_logp(lambda lp: policy_loss(lp, old, A), logp)
    g_cis, loss, st_c = d_loss_d_logp(lambda lp: TF.cispo_loss(lp, old, A), logp)
    # PPO: clipped tokens (bins 0 and 1: rho 2 with A > 0, 0.5 with A < 0; rho 8) have no gradient
    assert g_ppo[0].tolist() == pytest.approx([0, 0, 0, 0, -1.05, -1.10, 0.95, 0], abs=1e-6)
    # CISPO: -w A, w = min(rho, 5): every token keeps its gradient, rho 8 is weighted 5
    w = [2.0, 0.5, 2.0, 5.0, 1.05, 1.10, 0.95, 0.5]
    assert g_cis[0].tolist() == pytest.approx([-wi * a for wi, a in zip(w, A[0].tolist())], abs=1e-5)
    assert loss[0].tolist() == pytest.approx([-wi * a * lp for wi, a, lp in
                                              zip(w, A[0].tolist(), logp[0].tolist())], abs=1e-5)
    assert st_c["clipped"][0].tolist() == [False, False, False, True, False, False, False, False]
    low = lambda s: s[0] + s[1]                                                 # noqa: E731
    assert low(bin_shares(g_ppo, p_old, valid)) == 0.0
    assert low(bin_shares(g_cis, p_old, valid)) == pytest.approx(
        (2 + 0.5 + 2 + 5 + 0.5) / (2 + 0.5 + 2 + 5 + 1.05 + 1.10 + 0.95 + 0.5), abs=1e-5)
    # eps_low < 1 puts a floor under the weight: rho 0.5 -> 0.8
    g_floor, _, _ = d_loss_d_logp(lambda lp: TF.cispo_loss(lp, old, A, 0.2, 4.0), logp)
    assert g_floor[0, 1].item() == pytest.approx(0.8)


def test_kl_cov_and_clip_cov_act_on_the_high_covariance_tokens():
    """The tokens of the covariance test, after a step (rho != 1): Clip-Cov removes the
    gradient of the selected high-covariance tokens, KL-Cov adds beta * sign(log rho) to
    it (the pull back to pi_old) and drops the clip everywhere. With A > 0 that is the top
    bin's token, with A < 0 the bottom bin's."""
    p_old = torch.tensor([[0.9, 0.1, 0.1, 0.9]])
    A = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    valid = torch.ones(1, 4)
    old = p_old.log()
    cov = TF.token_covariance(old, A, valid)
    sel = TF.kl_cov_mask(cov, valid, 0.5)
    assert sel.tolist() == [[1, 0, 1, 0]]
    bins = [int(b) for b in mechanism.bin_index(p_old)[0]]
    assert [bins[i] for i in (0, 2)] == [3, 0]          # top bin with A > 0, bottom bin with A < 0
    rho = torch.tensor([[1.1, 1.5, 0.9, 0.7]])          # 1.5 and 0.7 are outside PPO's clip range
    logp = old + rho.log()
    g, _, _ = d_loss_d_logp(lambda lp: TF.kl_cov_loss(lp, old, A, sel, 1.0), logp)
    # -A rho + beta sign(log rho) on the selected; -A rho (unclipped) elsewhere
    assert g[0].tolist() == pytest.approx([-1.1 + 1, -1.5, 0.9 - 1, 0.7], abs=1e-6)
    fix = TF.TokenFix("clip_cov", TrainConfig(), mask=sel)
    g_cc, _, _ = d_loss_d_logp(lambda lp: fix(lp, old, A, slice(None)), logp)
    g_ppo, _, _ = d_loss_d_logp(lambda lp: policy_loss(lp, old, A), logp)
    assert g_cc[0].tolist() == pytest.approx([0, g_ppo[0, 1].item(), 0, g_ppo[0, 3].item()])
    assert g_ppo[0, 1] == 0 and g_ppo[0, 3] == 0        # PPO-clipped: no gradient already


def test_at_ratio_one_cispo_and_kl_cov_are_grpos_gradient():
    """Design choice 3: on fresh samples (rho = 1) the per-token gradient of CISPO and KL-Cov
    is GRPO's, -A, bit for bit; entropy_top / Clip-Cov scale it by their masks."""
    old = torch.tensor([[LOG(0.1), LOG(0.5), LOG(0.9), LOG(0.3)]])
    A = torch.tensor([[1.0, -2.0, 0.5, -0.3]])
    g_ppo, _, _ = d_loss_d_logp(lambda lp: policy_loss(lp, old, A), old)
    g_cis, _, _ = d_loss_d_logp(lambda lp: TF.cispo_loss(lp, old, A), old)
    g_kl, _, _ = d_loss_d_logp(lambda lp: TF.kl_cov_loss(lp, old, A, torch.ones_like(A)), old)
    assert torch.equal(g_ppo, -A) and torch.equal(g_cis, -A) and torch.equal(g_kl, -A)
    keep = torch.tensor([[1.0, 0.0, 1.0, 0.0]])
    fix = TF.TokenFix("entropy_top", TrainConfig(), mask=keep)
    g_et, _, _ = d_loss_d_logp(lambda lp: fix(lp, old, A, slice(None)), old)
    assert torch.equal(g_et, -A * keep)


# ------------------------------------------------------------ on a model's batch


def _batch(temperature=1.0):
    model = tiny_llama()
    prompts = [[BOS, 5, 6, 7], [BOS, 9], [BOS, 10, 11, 12, 13]]
    r = sample_groups(model, prompts, group_size=4, max_new_tokens=12, temperature=temperature,
                      eos_token_id=EOS, pad_token_id=PAD, generator=torch.Generator().manual_seed(0))
    rewards = torch.tensor([3.0, -0.5, -1.0, 3.0, -3.0, -1.0, -3.0, 3.0, 3.0, -1.0, -0.5, -0.5])
    b = update_batch(r, group_advantages(rewards, 4))
    cfg = TrainConfig(temperature=temperature, kl_coef=0.0, grad_clip=1e9, mini_batch_size=12,
                      micro_batch_size=12)
    b = replace(b, old_logprobs=batch_logprobs(model, b, cfg))    # rho = 1 exactly in the first step
    return model, b, cfg


def test_entropy_is_the_full_distributions():
    model, b, cfg = _batch(temperature=0.7)
    cfg.temperature = 0.7
    H = TF.batch_entropies(model, b, cfg)
    with torch.no_grad():
        P = b.prompt_len
        logits = model(input_ids=b.input_ids, attention_mask=b.attention_mask).logits
        logq = torch.log_softmax(logits[:, P - 1:-1].float() / 0.7, -1)
        want = -(logq.exp() * logq).sum(-1) * b.response_mask
    assert float((H - want).abs().max()) < 1e-4
    assert (H[b.response_mask == 0] == 0).all()
    # one pass for both (scripts/token_selection.py): the same values as the two passes,
    # in micro-batches that split the rows unevenly
    cfg.micro_batch_size = 5
    logp, H1 = batch_logprobs(model, b, cfg, entropy=True)
    assert torch.equal(logp, batch_logprobs(model, b, cfg)) and torch.equal(H1, TF.batch_entropies(model, b, cfg))


def test_entropy_top_trains_mostly_on_low_probability_tokens():
    """On a model's batch the uncertain positions are where the sampled token is unlikely:
    the kept 20% sit in the low bins far more than the batch does, and the low bins' share of
    the squared gradient (mechanism.gradient_sq_shares, the method's own loss) rises over
    GRPO's -- the opposite of AR, which lowers it."""
    model, b, cfg = _batch()
    fix = TF.build("entropy_top", model, b, cfg)
    valid = b.response_mask
    assert 0.2 <= fix.fraction(valid) < 0.25
    bins = mechanism.bin_masks(b.old_logprobs.exp(), valid)
    low_all = float((bins[0] + bins[1]).sum() / valid.sum())
    low_kept = float(((bins[0] + bins[1]) * fix.mask).sum() / fix.mask.sum())
    assert low_kept >= 0.9 and low_kept > low_all + 0.1
    grpo = mechanism.gradient_sq_shares(model, b, cfg)
    ours = mechanism.gradient_sq_shares(model, b, cfg, fix)
    assert ours[0] + ours[1] > grpo[0] + grpo[1]



def test_token_selection_script_by_hand():
    """scripts/token_selection.py's bookkeeping: the first response token is the decision,
    the rest split by behaviour; shares kept per kind, per pi_old bin, with A < 0; pooling."""
    es = load_script("scripts/token_selection.py")
    valid = torch.tensor([[1., 1., 1., 0.], [1., 1., 1., 1.]])
    kinds = es.classify(valid, torch.tensor([False, True]))       # row 0 a guess, row 1 derives
    assert kinds["decision"].tolist() == [[1, 0, 0, 0], [1, 0, 0, 0]]
    assert kinds["guess_rest"].tolist() == [[0, 1, 1, 0], [0, 0, 0, 0]]
    assert kinds["derive_rest"].tolist() == [[0, 0, 0, 0], [0, 1, 1, 1]]
    entropy = torch.tensor([[0.5, 0.7, 0.0, 0.0], [0.4, 1.1, 1.1, 0.0]])
    kept = TF.high_entropy_mask(entropy, valid, 0.45)     # tau = 0.56, the .55-quantile of 7
    assert kept.tolist() == [[0, 1, 0, 0], [0, 1, 1, 0]]
    p_old = torch.tensor([[0.6, 0.5, 1.0, 0.0], [0.7, 0.3, 0.3, 1.0]])
    adv = torch.tensor([[-1., -1., -1., 0.], [2., 2., 2., 2.]])
    res = es.summarise(entropy, kept, p_old, kinds, adv)
    assert res["tokens"] == 7 and res["kept_share"] == pytest.approx(3 / 7)
    assert res["decision"] == {"tokens": 2, "entropy": pytest.approx(0.45), "kept": 0.0}
    assert res["guess_rest"]["kept"] == 0.5 and res["derive_rest"]["kept"] == pytest.approx(2 / 3)
    assert res["bins_of_kept"] == pytest.approx([0, 2 / 3, 1 / 3, 0])     # 0.3, 0.3 | 0.5
    assert res["kept_per_bin"] == pytest.approx([None, 1.0, 1 / 3, 0.0])
    assert res["kept_negative_adv"] == pytest.approx(1 / 3)                  # the guess's 0.7
    both = es.pool([res, res])                    # pooling a batch with itself changes no share
    assert both["tokens"] == 14 and both["kept_share"] == pytest.approx(res["kept_share"])
    assert both["bins_of_kept"] == pytest.approx(res["bins_of_kept"])
    assert both["derive_rest"]["kept"] == pytest.approx(2 / 3)

class Recorder(torch.optim.SGD):
    def __init__(self, params, lr):
        super().__init__(params, lr=lr)
        self.grads = []

    def step(self, closure=None):
        self.grads.append(torch.cat([p.grad.flatten() for g in self.param_groups for p in g["params"]]).clone())
        return super().step(closure)


def _grads(model, b, cfg, fix=None, lr=1e-2):
    m = copy.deepcopy(model)
    opt = Recorder(m.parameters(), lr)
    grpo_update(m, opt, b, cfg, pg_loss=fix)
    return opt.grads


def test_one_pass_cispo_and_kl_cov_equal_grpo_then_differ():
    """Through grpo_update on a model: the first optimizer step of CISPO and KL-Cov is
    GRPO's (rho = 1); the second pass over the same rollout is not."""
    model, b, cfg = _batch()
    cfg.ppo_epochs = 2
    g0 = _grads(model, b, cfg)
    for method in ("cispo", "kl_cov"):
        fix = TF.build(method, model, b, replace(cfg, kl_cov_ratio=0.2))
        g = _grads(model, b, cfg, fix)
        assert float((g[0] - g0[0]).abs().max()) <= 1e-6 * float(g0[0].abs().max())
        assert float((g[1] - g0[1]).abs().max()) > 1e-3 * float(g0[1].abs().max())


def test_selections_do_not_depend_on_the_micro_batch_size():
    """Design choice 2: made once per batch, so micro-batches of 3 give the same update as
    one of 12 (up to float summation order)."""
    model, b, cfg = _batch()
    for method in ("entropy_top", "clip_cov"):
        fix = TF.build(method, model, b, replace(cfg, clip_cov_ratio=0.1), torch.Generator().manual_seed(0))
        assert fix.mask.sum() > 0
        whole = _grads(model, b, cfg, fix)[0]
        small = _grads(model, b, replace(cfg, micro_batch_size=3), fix)[0]
        assert float((whole - small).abs().max()) <= 1e-5 * float(whole.abs().max())
        assert float((whole - _grads(model, b, cfg)[0]).abs().max()) > 1e-3 * float(whole.abs().max())


# --------------------------------------------------------------- config and grid


def test_config_options_and_validation():
    c = make_config("ci", method="cispo")
    assert (c.entropy_top_quantile, c.cispo_eps_low, c.cispo_eps_high) == (0.2, 1.0, 4.0)
    assert (c.clip_cov_ratio, c.clip_cov_low, c.clip_cov_high, c.kl_cov_ratio, c.kl_cov_coef) == \
        (2e-4, 1.0, 5.0, 2e-3, 1.0)
    assert not c.uses_ar and not c.uses_lopti
    for bad in (dict(entropy_top_quantile=1.5), dict(cispo_eps_low=2.0), dict(clip_cov_ratio=0.0),
                dict(clip_cov_low=5.0, clip_cov_high=1.0), dict(kl_cov_coef=-1.0)):
        with pytest.raises(TrainError):
            make_config("ci", method="kl_cov", **bad)
    with pytest.raises(ValueError, match="unknown token fix"):
        TF.build("grpo", None, None, TrainConfig())


def test_token_fixes_grid():
    from lopti_minimal.experiments import grid as G
    from lopti_minimal.experiments import study as S
    arms = G.GRIDS["token_fixes"]
    assert arms[:3] == (G.GRPO, G.GRPO_X2, G.AR_LOPTI)
    assert [v.name for v in arms[3:]] == [f"{m}-x2" for m in TOKEN_FIXES]
    assert arms[4].label == "GRPO+CISPO (2 optimizer steps per rollout)"
    assert set(G.GRID_PAIRS["token_fixes"]) == {(v, b) for v in arms[3:] for b in (G.AR_LOPTI, G.GRPO_X2)}
    assert "token_fixes" in G.GRID_TITLES
    specs = S.plan_runs(["token_fixes"], 1, 2, "ci")
    assert len(specs) == 2 * 7
    cfg = S.run_config(specs[4], "/o")
    assert (cfg.method, cfg.ppo_epochs) == ("cispo", 2)


def test_train_cli_smoke(nano_dir, tmp_path):
    """`train.py --preset ci --method entropy_top --no-eval` runs (the other three take the
    same path; entropy_top is the one with an extra forward pass)."""
    from test_train_cli import WARM, run_cli
    model = [] if WARM.exists() else ["--model", nano_dir]
    p, _ = run_cli("--preset", "ci", "--method", "entropy_top", "--run-dir", str(tmp_path / "r"),
                   "--no-eval", "--no-plots", *model)
    assert p.returncode == 0, p.stderr[-2000:]
    import json
    lines = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 2 and all(0.2 <= m["fix_fraction"] < 0.3 for m in lines)
