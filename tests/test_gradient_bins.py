"""On the warm-started tiny model with sampled K&K responses, the mean
per-token gradient norm of log p (unit weight) falls from the lowest probability bin
[0, .25) to the highest [.75, 1] -- with respect to the final hidden state and with
respect to all parameters -- by more than a factor of 2 (paper Fig. 1(d), Prop. 4.2).
"""
import math

import torch

from lopti_minimal import models
from lopti_minimal.grpo import token_logprobs
from lopti_minimal.sampling import sample_groups
from lopti_minimal.task import dataset

BINS = (0.0, 0.25, 0.5, 0.75, 1.0 + 1e-9)       # the paper's fixed bins, last one closed
PARAM_TOKENS_PER_BIN = 12                        # per-token parameter gradients: a sample


def bin_index(p: torch.Tensor) -> torch.Tensor:
    return torch.bucketize(p, torch.tensor(BINS[1:-1]), right=True)


def hidden_and_logprobs(model, input_ids, attention_mask, prompt_len):
    """log p of the response tokens (T = 1) and the final hidden states feeding lm_head."""
    captured = {}

    def grab(_module, args):
        args[0].retain_grad()
        captured["h"] = args[0]

    handle = model.get_output_embeddings().register_forward_pre_hook(grab)
    try:
        logp = token_logprobs(model, input_ids, attention_mask, prompt_len, 1.0)
    finally:
        handle.remove()
    return logp, captured["h"]


def per_token_norms(model, rollout, per_bin_params=PARAM_TOKENS_PER_BIN, seed=0):
    """Per valid token: its probability, ||d log p / d h_final|| and, for a stratified
    sample of up to `per_bin_params` tokens per bin, ||d log p / d theta|| over all
    parameters. Returns (p, hidden_norms, param_token_index, param_norms)."""
    model.eval()                        # no dropout; gradients still flow
    P, R = rollout.prompt_len, rollout.response_ids.shape[1]
    logp, h = hidden_and_logprobs(model, rollout.input_ids, rollout.attention_mask, P)
    valid = rollout.response_mask > 0
    # log p_t depends on the final hidden state only at its own position (lm_head acts per
    # position), so one backward of the sum gives every token's hidden-state gradient.
    (logp * valid).sum().backward(retain_graph=True)
    gh = h.grad[:, -(R + 1):-1, :]                      # positions predicting the responses
    hidden_norms = gh.norm(dim=-1)[valid]
    p = logp.detach().exp()[valid]

    # Parameter gradients need one backward per token: sample a few tokens per bin.
    params = [q for q in model.parameters() if q.requires_grad]
    flat_idx = valid.nonzero()
    bins = bin_index(p)
    gen = torch.Generator().manual_seed(seed)
    chosen = []
    for k in range(4):
        members = (bins == k).nonzero().squeeze(-1)
        pick = members[torch.randperm(len(members), generator=gen)[:per_bin_params]]
        chosen.extend(pick.tolist())
    param_norms = []
    for i in chosen:
        b, t = flat_idx[i].tolist()
        grads = torch.autograd.grad(logp[b, t], params, retain_graph=True, allow_unused=True)
        param_norms.append(math.sqrt(sum(float((g.double() ** 2).sum()) for g in grads
                                         if g is not None)))
    return p, hidden_norms.detach(), torch.tensor(chosen), torch.tensor(param_norms)


def bin_means(p, norms):
    bins = bin_index(p)
    return [float(norms[bins == k].mean()) if (bins == k).any() else float("nan")
            for k in range(4)]


def test_gradient_norms_fall_from_low_to_high_probability_bin(tiny_warm):
    model, tok = tiny_warm
    records = dataset.generate_records(3, 6, seed=4242)
    prompt_ids = [tok(models.kk_prompt(r, tok, "compact"))["input_ids"] for r in records]
    rollout = sample_groups(model, prompt_ids, group_size=4, max_new_tokens=96,
                            temperature=1.0, eos_token_id=tok.eos_token_id,
                            pad_token_id=tok.pad_token_id,
                            generator=torch.Generator().manual_seed(0))
    p, hidden_norms, chosen, param_norms = per_token_norms(model, rollout)

    counts = torch.bincount(bin_index(p), minlength=4)
    assert counts[0] >= 10 and counts[3] >= 10, f"tokens per bin {counts.tolist()}"

    # Prop. 4.2 at the last layer: d log p / d h = W^T (e_y - pi), so its norm is at most
    # ||W||_2 * sqrt(2) * (1 - p) for every token.
    W = model.get_output_embeddings().weight.detach().double()
    top = float(torch.linalg.matrix_norm(W, ord=2))
    assert (hidden_norms.double() <= top * math.sqrt(2) * (1 - p.double()) + 1e-6).all()

    h_means = bin_means(p, hidden_norms)
    sel_p = p[chosen]
    p_means = bin_means(sel_p, param_norms)
    msg = f"hidden {h_means} params {p_means} counts {counts.tolist()}"
    assert h_means[0] > h_means[3] and h_means[0] / h_means[3] > 2, msg
    assert p_means[0] > p_means[3] and p_means[0] / p_means[3] > 2, msg
