"""Every number of diagnostics.py checked by hand on a bare softmax head.

The model below is a "bigram" softmax head: h_i = E[x_i] (the final hidden state is the
embedding of the previous token), logits = W h_i. For the token y sampled after x at
temperature T, with pi = softmax(W E[x] / T):

    d log pi_y / d h       = W^T (e_y - pi) / T
    d log pi_y / d W       = (e_y - pi) h^T / T          (only W and the row E[x] are used)
    d log pi_y / d E[x]    = W^T (e_y - pi) / T
"""
import json
import math
import os
from types import SimpleNamespace

import pytest
import torch

from lopti_minimal.batch import Rollout
from lopti_minimal.config import PAPER_METHODS
from lopti_minimal.experiments import diagnostics as D


class Bigram(torch.nn.Module):
    """The smallest model the project's token_logprobs / grpo_update accept."""

    def __init__(self, V=6, d=5, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.emb = torch.nn.Embedding(V, d)
        self.lm_head = torch.nn.Linear(d, V, bias=False)
        with torch.no_grad():
            self.emb.weight.copy_(torch.randn(V, d, generator=g))
            self.lm_head.weight.copy_(torch.randn(V, d, generator=g) * 1.5)

    def get_output_embeddings(self):
        return self.lm_head

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=False,
                logits_to_keep=0):
        h = self.emb(input_ids)
        if logits_to_keep:
            h = h[:, -logits_to_keep:]
        return SimpleNamespace(logits=self.lm_head(h))


def make_rollout(prompts, responses):
    """A Rollout from explicit prompt/response token lists (response lists may differ in
    length: right-padded with 0 and masked)."""
    P = len(prompts[0])
    R = max(len(r) for r in responses)
    B = len(responses)
    ids = torch.zeros(B, P + R, dtype=torch.long)
    attn = torch.zeros(B, P + R, dtype=torch.long)
    rmask = torch.zeros(B, R)
    for b, r in enumerate(responses):
        ids[b, :P] = torch.tensor(prompts[b])
        ids[b, P:P + len(r)] = torch.tensor(r)
        attn[b, :P + len(r)] = 1
        rmask[b, :len(r)] = 1
    return Rollout(input_ids=ids, attention_mask=attn, response_ids=ids[:, P:],
                   response_mask=rmask, old_logprobs=torch.zeros(B, R), prompt_len=P)


def analytic(model, x, y, T):
    """(pi over the vocabulary, hidden-grad norm, parameter-grad norm) of token y after x."""
    W = model.lm_head.weight.detach().double()
    h = model.emb.weight.detach().double()[x]
    pi = torch.softmax(W @ h / T, -1)
    e = torch.zeros_like(pi)
    e[y] = 1
    gh = W.T @ (e - pi) / T
    gW = torch.outer(e - pi, h) / T
    return pi, float(gh.norm()), math.sqrt(float(gh.norm() ** 2 + gW.norm() ** 2))


CFG = dict(temperature=0.7, tokens_per_bin=50, micro_batch_size=2, seed=0)


# ----------------------------------------------------------------------- bins, shares


def test_bin_edges_follow_the_paper():
    p = torch.tensor([0.0, 0.2499, 0.25, 0.4999, 0.5, 0.74, 0.75, 0.99, 1.0])
    assert D.bin_index(p).tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 3]


def test_shares_means_and_rise_share_by_hand():
    p = torch.tensor([[0.1, 0.3, 0.9, 0.95], [0.2, 0.6, 0.8, 0.0]])
    valid = torch.tensor([[1., 1., 1., 1.], [1., 1., 1., 0.]])       # last one is padding
    masks = D.bin_masks(p, valid)
    assert [int(m.sum()) for m in masks] == [2, 1, 1, 3]
    assert D.token_shares(masks) == pytest.approx([2 / 7, 1 / 7, 1 / 7, 3 / 7])
    adv = torch.tensor([[1., 1., 1., 1.], [-2., -2., -2., 0.]])
    assert D.per_bin_mean(adv, masks) == pytest.approx([-0.5, 1.0, -2.0, 0.0])
    dp = torch.tensor([[0.01, -0.02, 0.0, 0.03], [0.5, 0.5, -0.5, 9.0]])
    shares, counts = D.rise_share(dp, adv, masks)
    # A > 0 tokens: bin 0 {0.01 up}, bin 1 {-0.02 down}, bin 2 none, bin 3 {0.0 not up, 0.03 up}
    assert counts == [1, 1, 0, 2]
    assert shares == [1.0, 0.0, None, 0.5]
    # Among the A > 0 tokens that moved at all, the unchanged 0.0 drops out of bin 3.
    assert D.rise_share_resolved(dp, adv, masks) == [1.0, 0.0, None, 1.0]


# ------------------------------------------------------------------- gradient norms


def test_gradient_norms_equal_the_analytic_softmax_head():
    torch.manual_seed(0)
    model = Bigram()
    ro = make_rollout([[1, 2], [3, 4]], [[5, 0, 3], [2, 2]])
    chosen = [(0, 0), (0, 2), (1, 1)]
    hidden, params = D.gradient_norms(model, ro, 0.7, chosen)
    for b, t in [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]:
        x = int(ro.input_ids[b, ro.prompt_len + t - 1])      # the token before o_t
        y = int(ro.input_ids[b, ro.prompt_len + t])
        _, gh, gp = analytic(model, x, y, 0.7)
        assert hidden[b, t] == pytest.approx(gh, rel=1e-4)
        if (b, t) in params:
            assert params[(b, t)] == pytest.approx(gp, rel=1e-4)
    assert hidden[1, 2] == 0                                 # padding
    assert set(params) == set(chosen)


# ------------------------------------------------------- a constructed interference case


def interference_model(p_ctx, T=1.0):
    """V = d = 4; the context token 0 has h = e_0 and logits T * log p_ctx, so that
    pi(. | 0) = p_ctx exactly at temperature T; after token 3, pi(3 | 3) = .1."""
    m = Bigram(V=4, d=4)
    with torch.no_grad():
        m.emb.weight.copy_(torch.eye(4))
        W = torch.zeros(4, 4)
        W[:, 0] = T * torch.log(torch.tensor(p_ctx))
        W[:, 1:3] = torch.randn(4, 2, generator=torch.Generator().manual_seed(1)) * 0.1
        W[:, 3] = T * torch.log(torch.tensor([0.3, 0.3, 0.3, 0.1]))   # pi(3 | 3) = .1
        m.lm_head.weight.copy_(W)
    return m


def interference_case():
    """Two responses of one prompt, both sampled after the same context token 0: one is
    the low-probability token 1 (pi = .1), the other the high-probability token 2 (pi = .8),
    and both have A > 0; a third response, A < 0, samples token 3 after the context
    token 3 (h = e_3, which touches other weights: to first order it does not interact)."""
    model = interference_model([0.05, 0.1, 0.8, 0.05])
    ro = make_rollout([[0], [0], [3]], [[1], [2], [3]])
    adv = torch.tensor([[1.0], [1.0], [-1.0]])
    return model, ro, adv


def manual_sgd_delta(model, ro, adv, steps, lr, T, kl_coef=0.001):
    """pi_new - pi_old by hand: for each token mask in `steps`, one plain SGD step
    theta -= lr * grad of the GRPO loss restricted to the mask,

        (1/N) sum_{t in mask} [ -A_t rho_t + kl_coef * k3_t ],   N = all valid tokens,

    with rho_t = pi(o_t) / pi_old(o_t) and k3 against pi_old (the model is its own
    reference). No clip is active here (rho stays within [0.8, 1.24]). At the first step
    rho = 1 and grad k3 = 0, so it is -(1/N) sum A_t grad log pi(o_t)."""
    import copy
    m = copy.deepcopy(model)
    P = ro.prompt_len
    N = float(ro.response_mask.sum())

    def logp(mod):
        logits = mod(ro.input_ids).logits[:, P - 1:-1] / T
        return torch.log_softmax(logits, -1).gather(-1, ro.input_ids[:, P:, None])[..., 0]

    lp0 = logp(m).detach()
    for mask in steps:
        lp = logp(m)
        rho = (lp - lp0).exp()
        assert ((rho > 0.8) & (rho < 1.24)).all()
        k3 = (lp0 - lp).exp() - (lp0 - lp) - 1
        loss = ((-adv * rho + kl_coef * k3) * mask).sum() / N
        grads = torch.autograd.grad(loss, list(m.parameters()))
        with torch.no_grad():
            for q, g in zip(m.parameters(), grads):
                q -= lr * g
    return logp(m).exp().detach() - lp0.exp()


def test_probability_changes_and_interference_on_a_constructed_case():
    model, ro, adv = interference_case()
    before = D.snapshot(model)
    cfg = D.DiagConfig(group_size=3, lr=0.1, temperature=1.0, tokens_per_bin=4,
                       micro_batch_size=2)
    res = D.analyse(model, ro, adv, cfg, log=lambda s: None)
    # The model is restored exactly.
    for n, q in model.named_parameters():
        assert torch.equal(q, before[n])
    assert res["bin_counts"] == [2, 0, 0, 1]          # tokens 1 and 3 low, token 2 high
    assert res["token_share"] == pytest.approx([2 / 3, 0, 0, 1 / 3])
    assert res["mean_adv"] == [0.0, None, None, 1.0]
    assert res["share_pos_adv"] == [0.5, None, None, 1.0]

    # delta p after one SGD step equals the hand-made step, for every update.
    valid = ro.response_mask
    low = torch.tensor([[1.0], [0.0], [1.0]])
    high = valid - low
    for key, mask in (("all", valid), ("bin0", low), ("bin3", high)):
        want = manual_sgd_delta(model, ro, adv, [mask], 0.1, 1.0)
        got_pos = res["sgd"][key]["pos_adv"]
        # A > 0: row 0 (bin 0) and row 1 (bin 3); A < 0: row 2 (bin 0)
        assert got_pos[0] == pytest.approx(float(want[0, 0]), rel=1e-4, abs=1e-7)
        assert got_pos[3] == pytest.approx(float(want[1, 0]), rel=1e-4, abs=1e-7)
        assert res["sgd"][key]["neg_adv"][0] == pytest.approx(float(want[2, 0]), rel=1e-4, abs=1e-7)

    # The signs, by construction: updating only the low-probability token (A > 0) pushes
    # its own probability up and, in the same context, the high-probability token's DOWN
    # although that token has A > 0 too (paper Fig. 1e); updating the high bin alone lifts it.
    assert res["sgd"]["bin0"]["pos_adv"][0] > 0
    assert res["sgd"]["bin0"]["pos_adv"][3] < 0
    assert res["sgd"]["bin3"]["pos_adv"][3] > 0
    # The low token moves the high token more than the high token moves itself (Fig. 1e vs f).
    assert abs(res["sgd"]["bin0"]["pos_adv"][3]) > abs(res["sgd"]["bin3"]["pos_adv"][3])
    # Shared denominator: bin gradients add up to the all-token gradient (norms obey the
    # triangle inequality and are positive).
    norms = [res["sgd"][f"bin{k}"]["loss_grad_norm"] for k in range(4)]
    assert norms[1] == norms[2] == 0.0
    assert res["sgd"]["all"]["loss_grad_norm"] <= norms[0] + norms[3] + 1e-6

    # Fig. 3 by hand: GRPO = the all-token step; Lopti (eta .4) = low step then high step.
    sgd = res["fig3"]["sgd"]
    want = manual_sgd_delta(model, ro, adv, [valid], 0.1, 1.0)
    assert sgd["grpo"]["rise_share"] == [float(want[0, 0] > 0), None, None, float(want[1, 0] > 0)]
    want = manual_sgd_delta(model, ro, adv, [low, high], 0.1, 1.0)
    assert sgd["lopti"]["rise_share"] == [float(want[0, 0] > 0), None, None, float(want[1, 0] > 0)]
    assert sgd["lopti"]["mean_delta_pos"][3] == pytest.approx(float(want[1, 0]), rel=1e-4)
    # AR (alpha .2) scales A by .2 pi + .8: the low token's push shrinks, so the high
    # token's probability ends higher than under GRPO.
    assert sgd["ar"]["mean_delta_pos"][3] > sgd["grpo"]["mean_delta_pos"][3]


def test_gradient_numbers_of_the_constructed_case():
    model, ro, adv = interference_case()
    cfg = D.DiagConfig(group_size=3, lr=1e-3, temperature=1.0, tokens_per_bin=4)
    res = D.analyse(model, ro, adv, cfg, log=lambda s: None)
    p_low = analytic(model, 0, 1, 1.0)
    p_high = analytic(model, 0, 2, 1.0)
    p_neg = analytic(model, 3, 3, 1.0)
    assert res["grad_hidden"][0] == pytest.approx((p_low[1] + p_neg[1]) / 2, rel=1e-4)
    assert res["grad_hidden"][3] == pytest.approx(p_high[1], rel=1e-4)
    assert res["grad_params"][3] == pytest.approx(p_high[2], rel=1e-4)
    assert res["grad_params_n"] == [2, 0, 0, 1]
    # Prop. 4.2 in miniature: the low-probability tokens' gradients are the larger.
    assert res["grad_hidden"][0] > res["grad_hidden"][3]
    # |A|-weighted: |A| = 1 for every token here, so it equals the unweighted mean.
    assert res["grad_hidden_adv_weighted"][0] == pytest.approx(res["grad_hidden"][0], rel=1e-6)


# ------------------------------------------------------------------------ CLI smoke


def test_cli_writes_json_and_figures(tmp_path, kk_tokenizer):
    from lopti_minimal.models import make_tiny_model
    model = make_tiny_model("nano", len(kk_tokenizer), tokenizer=kk_tokenizer, seed=0)
    ckpt = tmp_path / "nano"
    model.save_pretrained(ckpt)
    kk_tokenizer.save_pretrained(ckpt)
    out = tmp_path / "diag"
    rc = D.main(["--model", str(ckpt), "--out", str(out), "--prompts", "2", "--group-size", "2",
                 "--max-new-tokens", "12", "--tokens-per-bin", "2", "--adamw"])
    assert rc == 0
    res = json.loads((out / "diagnostics.json").read_text())
    assert sum(res["bin_counts"]) == res["n_tokens"] > 0
    assert set(res["fig3"]) == {"sgd", "adamw"}
    assert set(res["fig3"]["sgd"]) == set(PAPER_METHODS)
    for f in ("fig1.png", "fig3.png"):
        assert os.path.getsize(out / f) > 1000
