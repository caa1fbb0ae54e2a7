"""`lopti_minimal.trl_grpo.LoptiGRPOTrainer` (TRL's GRPOTrainer + AR + Lopti) makes the same
update as our `grpo_update` / `lopti_update` on the same completions and rewards.

How the two are fed the same batch, honestly: TRL runs its real training loop
(`trainer.train()`: prompt tokenization, reward call, advantages, the subclass's pi_old and
AR, the generation buffer, `_compute_loss`, the optimizer step), with only its sampler
(`_generate_single_turn`) replaced by one that returns completions sampled beforehand from
the same model by our sampler. Ours gets those completions and the same reward function and
computes everything else itself (group advantages, pi_old, AR, the update). The optimizer
is passed to both as the same recording class, so the gradient of every optimizer step and
the final parameters can be compared.

Prompts all have the same token length (no left padding): with padded prompts TRL's
training forward counts the padding in the positions and ours does not (trl_grpo.py,
design choice 7).
"""
import copy

import pytest

import trl  # noqa: E402  (requirements.txt installs it)

import torch  # noqa: E402
from transformers import LlamaForCausalLM  # noqa: E402

from dataclasses import replace  # noqa: E402

from lopti_minimal import config as T  # noqa: E402
from lopti_minimal import precision  # noqa: E402
from lopti_minimal.grpo import (batch_logprobs, group_advantages, grpo_update,  # noqa: E402
                                token_advantages)
from lopti_minimal.batch import Rollout  # noqa: E402
from lopti_minimal.lopti import lopti_update, split_by_probability  # noqa: E402
from lopti_minimal.reweight import reweight_advantages  # noqa: E402
from lopti_minimal.sampling import sample_groups  # noqa: E402
from lopti_minimal.trl_grpo import NOT_IN_TRL, LoptiGRPOTrainer, make_trl_config, trl_grpo_args  # noqa: E402

G = 4
TEMPERATURE = 0.7
PROMPTS = ["Alice says Bob is a knight.", "Bob says Carl is a knave.", "Carl says Alice is a knight."]
# Per-completion rewards, group-major. The last group is constant: its advantage must be 0.
REWARDS = [3.0, -0.5, -1.0, 3.0, -3.0, 3.0, -1.0, -0.5, 0.1, 0.1, 0.1, 0.1]
KL = 0.05
MAX_NEW = 10


class RecordingSGD(torch.optim.SGD):
    """SGD that records the gradient at every step."""

    def __init__(self, params, lr):
        super().__init__(params, lr=lr)
        self.grads = []

    def step(self, closure=None):
        ps = [p for g in self.param_groups for p in g["params"]]
        self.grads.append(torch.cat([p.grad.flatten() for p in ps]).clone())
        return super().step(closure)


class RecordingAdamW(torch.optim.AdamW):
    def __init__(self, params, lr, weight_decay):
        super().__init__(params, lr=lr, betas=(0.9, 0.999), weight_decay=weight_decay)
        self.grads = []

    def step(self, closure=None):
        ps = [p for g in self.param_groups for p in g["params"]]
        self.grads.append(torch.cat([p.grad.flatten() for p in ps]).clone())
        return super().step(closure)


def flat(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


@pytest.fixture(scope="module")
def setting(tmp_path_factory):
    """A nano Llama with a spread-out next-token distribution, its tokenizer, saved to a
    folder; equal-length prompts; completions sampled from it once by our sampler.
    One torch thread while this module runs (restored afterwards)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    from lopti_minimal.models import tiny_config
    from lopti_minimal.tokenizer import build_tokenizer, kk_corpus

    out = str(tmp_path_factory.mktemp("trl_nano"))
    tok = build_tokenizer(kk_corpus(n_per_size=8, sizes=range(3, 6)), vocab_size=400)
    cfg = tiny_config("nano", len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    cfg.initializer_range = 0.2          # tokens spread over all probability bins
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    model = LlamaForCausalLM.from_pretrained(out, dtype=torch.float32)

    # Equal-length prompts (no left padding): extend each text with filler words until it
    # tokenizes to exactly L tokens.
    L = max(len(tok(text=p)["input_ids"]) for p in PROMPTS) + 3
    prompts = []
    for p in PROMPTS:
        candidates = [p]
        for _ in range(6):
            candidates = [c + w for c in candidates for w in (" .", " a", " is", " knight")]
            hit = next((c for c in candidates if len(tok(text=c)["input_ids"]) == L), None)
            if hit:
                break
        assert hit, "could not equalise prompt lengths"
        prompts.append(hit)
    prompt_ids = [tok(text=p)["input_ids"] for p in prompts]

    ro = sample_groups(model, prompt_ids, group_size=G, max_new_tokens=MAX_NEW, temperature=TEMPERATURE,
                       eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                       generator=torch.Generator().manual_seed(0))
    lengths = ro.response_mask.sum(1).long().tolist()
    # Unequal lengths, so that padding is exercised: row i keeps its first 3 + (5 i mod 8)
    # tokens (a response cut by a smaller budget is as valid a sample as any).
    completions = [ro.response_ids[i, :min(n, 3 + (5 * i) % 8)].tolist() for i, n in enumerate(lengths)]
    assert len(set(map(len, completions))) > 3
    yield dict(dir=out, tok=tok, prompts=prompts, prompt_ids=prompt_ids, completions=completions)
    torch.set_num_threads(threads)


def reward_of(setting):
    table = {}
    for c, r in zip(setting["completions"], REWARDS):
        table.setdefault(tuple(c), r)       # identical completions must score alike
    rewards = [table[tuple(c)] for c in setting["completions"]]

    def kk_like_reward(completions, completion_ids, **_):
        return [table[tuple(c)] for c in completion_ids]
    return kk_like_reward, torch.tensor(rewards)


def config(method, grad_clip=1e9, lr=1e-3, order="low_first"):
    return T.make_config("ci", method=method, group_size=G, prompts_per_step=len(PROMPTS),
                         micro_batch_size=6, mini_batch_size=256, temperature=TEMPERATURE,
                         max_new_tokens=MAX_NEW, kl_coef=KL, lr=lr, grad_clip=grad_clip,
                         autocast_bf16=False, device="cpu", threads=1, lopti_order=order)


# ------------------------------------------------------------------------------- TRL side


def run_trl(setting, method, opt_kind="sgd", lr=1e-3, order="low_first", grad_clip=1e9, record=None,
            tmp="/tmp", paper_advantages=True, scored=None, num_processes=1, patch=None):
    """One TRL update (one generation batch; two optimizer steps for Lopti) on the fixed
    completions. num_processes: the processes of `accelerate launch` sharing the global
    batch (tests/test_trl_multiprocess.py); patch(trainer): a last change before training."""
    from datasets import Dataset
    cfg = config(method, grad_clip=grad_clip, lr=lr, order=order)
    reward_fn, _ = reward_of(setting)
    model = LlamaForCausalLM.from_pretrained(setting["dir"], dtype=torch.float32)
    opt = (RecordingSGD(model.parameters(), lr=lr) if opt_kind == "sgd"
           else RecordingAdamW(model.parameters(), lr=lr, weight_decay=cfg.weight_decay))
    n_opt_steps = 2 if cfg.uses_lopti else 1
    args = make_trl_config(cfg, tmp, num_processes, max_steps=n_opt_steps, report_to="none", save_strategy="no",
                           logging_steps=1, disable_tqdm=True, shuffle_dataset=False,
                           dataloader_num_workers=0)
    trainer = LoptiGRPOTrainer(model=model, reward_funcs=reward_fn, args=args,
                               train_dataset=Dataset.from_list([{"prompt": p} for p in setting["prompts"]]),
                               processing_class=setting["tok"], optimizers=(opt, None),
                               cfg=cfg, paper_advantages=paper_advantages)

    # The only replaced piece: sampling returns the fixed completions. The prompts come in
    # dataset order (no shuffling), G rows each, and each process gets its consecutive share
    # of the global rows: local row r of process k is global row k * rows + r.
    def fixed_generation(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        first = trainer.accelerator.process_index * len(prompt_ids)
        outs = []
        for j, ids in enumerate(prompt_ids, start=first):
            assert list(ids) == setting["prompt_ids"][j // G], "TRL's rows differ from ours (order or tokens)"
            outs.append(list(setting["completions"][j]))
        return outs, None
    trainer._generate_single_turn = fixed_generation

    if scored is not None:          # the generation batch as scored, before TRL shuffles it
        orig_score = trainer._generate_and_score_completions

        def score(inputs):
            out = orig_score(inputs)
            scored.append({k: (v.clone() if torch.is_tensor(v) else v) for k, v in out.items()})
            return out
        trainer._generate_and_score_completions = score

    if record is not None:          # which tokens carry gradient, per micro-step
        orig_logps, orig_loss = trainer._get_per_token_logps_and_entropies, trainer._compute_loss

        def logps(*a, **k):
            out = orig_logps(*a, **k)
            if torch.is_grad_enabled() and out[0].requires_grad:
                out[0].register_hook(lambda g: record[-1].__setitem__("grad", g.detach().clone()))
            return out

        def loss(model_, inputs):
            record.append({"pass": trainer._lopti_pass(), "old": inputs["old_per_token_logps"].clone(),
                           "mask": inputs["completion_mask"].clone(), "adv": inputs["advantages"].clone()})
            return orig_loss(model_, inputs)
        trainer._get_per_token_logps_and_entropies = logps
        trainer._compute_loss = loss

    if patch is not None:
        patch(trainer)
    p0 = flat(model)
    trainer.train()
    assert trainer.state.global_step == n_opt_steps
    return p0, flat(trainer.model), opt.grads


# ------------------------------------------------------------------------------- our side


def run_ours(setting, method, opt_kind="sgd", lr=1e-3, order="low_first", grad_clip=1e9):
    cfg = config(method, grad_clip=grad_clip, lr=lr)
    tok = setting["tok"]
    _, rewards = reward_of(setting)
    model = LlamaForCausalLM.from_pretrained(setting["dir"], dtype=torch.float32)
    ref = copy.deepcopy(model).eval()
    opt = (RecordingSGD(model.parameters(), lr=lr) if opt_kind == "sgd"
           else RecordingAdamW(model.parameters(), lr=lr, weight_decay=cfg.weight_decay))
    comps = setting["completions"]
    R = max(len(c) for c in comps)
    resp = torch.tensor([c + [tok.pad_token_id] * (R - len(c)) for c in comps])
    rmask = torch.tensor([[1.0] * len(c) + [0.0] * (R - len(c)) for c in comps])
    prompts = torch.tensor([setting["prompt_ids"][i // G] for i in range(len(comps))])
    batch = Rollout(input_ids=torch.cat([prompts, resp], 1),
                    attention_mask=torch.cat([torch.ones_like(prompts), rmask.long()], 1),
                    response_ids=resp, response_mask=rmask, prompt_len=prompts.shape[1])
    batch = replace(batch, old_logprobs=batch_logprobs(model, batch, cfg))
    adv = token_advantages(group_advantages(rewards, G), rmask)
    if cfg.uses_ar:
        adv = reweight_advantages(adv, batch.old_logprobs, cfg.alpha)
    batch = replace(batch, advantages=adv, ref_logprobs=batch_logprobs(ref, batch, cfg))
    p0 = flat(model)
    if cfg.uses_lopti:
        lopti_update(model, opt, batch, cfg, eta=cfg.eta, order=order)
    else:
        grpo_update(model, opt, batch, cfg)
    low, high = split_by_probability(batch.old_logprobs, rmask, cfg.low_eta)
    return p0, flat(model), opt.grads, (low.sum().item(), high.sum().item())


# ------------------------------------------------------------------------------- tests


def test_mapping_table():
    cfg = T.make_config("ci", method="ar_lopti", group_size=8, prompts_per_step=8, micro_batch_size=16)
    a = trl_grpo_args(cfg, "/tmp/x")
    assert (a["epsilon"], a["epsilon_high"], a["delta"], a["beta"]) == (0.20, 0.24, 10.0, cfg.kl_coef)
    assert (a["loss_type"], a["scale_rewards"], a["num_iterations"]) == ("dapo", "group", 2)
    assert a["use_bias_correction_kl"] is False and a["mask_truncated_completions"] is False
    assert a["per_device_train_batch_size"] * a["gradient_accumulation_steps"] == 64
    assert trl_grpo_args(T.make_config("ci", method="ar"), "/tmp/x")["num_iterations"] == 1
    # 8 processes share the global batch: 64 rows per step -> 8 per process.
    a8 = trl_grpo_args(cfg, "/tmp/x", num_processes=8)
    assert a8["per_device_train_batch_size"] * a8["gradient_accumulation_steps"] * 8 == 64
    assert a8["steps_per_generation"] == a8["gradient_accumulation_steps"]
    with pytest.raises(ValueError):
        trl_grpo_args(T.make_config("ci", method="lopti", ppo_epochs=2), "/tmp/x")
    assert trl_grpo_args(T.make_config("ci", method="grpo", lr_scale=2.0), "/tmp/x")["learning_rate"] == 2e-4
    with pytest.raises(ValueError, match="probability split"):
        trl_grpo_args(T.make_config("ci", method="lopti", lopti_split="random"), "/tmp/x")


MAX_DIFFS = {}


@pytest.mark.parametrize("method", T.PAPER_METHODS)
def test_sgd_update_equals_ours(setting, method, tmp_path):
    """Parameters after the update (one SGD step, two for Lopti) equal ours."""
    p0, p_trl, g_trl = run_trl(setting, method, tmp=str(tmp_path))
    q0, p_ours, g_ours, (n_low, n_high) = run_ours(setting, method)
    assert torch.equal(p0, q0)
    if T.uses_lopti(method):
        assert n_low > 0 and n_high > 0, "both Lopti stages must have tokens in this batch"
    assert len(g_trl) == len(g_ours) == (2 if T.uses_lopti(method) else 1)
    d_trl, d_ours = p_trl - p0, p_ours - p0
    scale = float(d_ours.abs().max())
    assert scale > 1e-6, "the update must move the weights"
    diff = float((d_trl - d_ours).abs().max())
    MAX_DIFFS[method] = (diff, scale)
    print(f"{method}: max |update_TRL - update_ours| = {diff:.3e} (max |update| {scale:.3e})")
    assert diff <= 1e-4 * scale
    for a, b in zip(g_trl, g_ours):
        assert float((a - b).abs().max()) <= 1e-4 * float(b.abs().max())


def test_group_advantages_are_the_papers(setting, tmp_path):
    """Design choice 5: the advantages the subclass hands to TRL's loss are exactly
    group_advantages (std + 1e-6, the constant group 0), and AR's are Eq. 4 of them with
    the pi_old the subclass computed. TRL's own (std + 1e-4) differ."""
    _, rewards = reward_of(setting)
    want = group_advantages(rewards, G)
    assert torch.equal(want[8:], torch.zeros(4))
    for method in ("grpo", "ar"):
        scored = []
        run_trl(setting, method, tmp=str(tmp_path), scored=scored)
        out = scored[0]
        m = out["completion_mask"].float()
        if method == "grpo":
            assert torch.equal(out["advantages"], want)
        else:
            alpha = T.paper_settings("ar")["alpha"]
            ar = (alpha * out["old_per_token_logps"].exp() + 1 - alpha) * want.view(-1, 1) * m
            assert float((out["advantages"] * m - ar).abs().max()) <= 1e-6    # float rounding
            assert (out["advantages"][m > 0] != want.view(-1, 1).expand_as(m)[m > 0]).any()
    scored = []
    run_trl(setting, "grpo", tmp=str(tmp_path), scored=scored, paper_advantages=False)
    assert float((scored[0]["advantages"] - want).abs().max()) > 1e-6


def test_methods_differ(setting):
    """The parity above could not pass by accident: AR changes the update, and each Lopti
    stage's gradient differs from GRPO's full gradient, by far more than the tolerance.
    (Lopti's two SGD steps together equal GRPO's one to first order in the lr -- the
    stages' gradients add up to the full one -- which is why its stages are compared.)"""
    base = run_ours(setting, "grpo")
    u0 = base[1] - base[0]
    ar = run_ours(setting, "ar")
    assert float(((ar[1] - ar[0]) - u0).abs().max()) > 0.05 * float(u0.abs().max())
    full = base[2][0]
    for m in filter(T.uses_lopti, T.METHODS):
        stage1, stage2 = run_ours(setting, m)[2]
        for g in (stage1, stage2):
            assert float((g - full).abs().max()) > 0.05 * float(full.abs().max())


def test_adamw_gradients_equal_ours(setting, tmp_path):
    """AR+Lopti with AdamW (betas, weight decay of the config) and the real clip 1.0: the
    gradient of each stage equals ours, stage 2's taken on the parameters stage 1 produced,
    and so do the final weights.

    At the reference's lr 1e-6. AdamW's first step is lr * g / (|g| + eps): a gradient
    component at float-rounding level moves its weight by a sizeable fraction of lr in a
    direction the rounding picks, so at lr 1e-3 stage 2's gradient differs from ours by
    ~2e-3 of its scale (measured) for that reason alone; the SGD test covers large steps.
    """
    lr = 1e-6
    p0, p_trl, g_trl = run_trl(setting, "ar_lopti", opt_kind="adamw", lr=lr, grad_clip=1.0,
                               tmp=str(tmp_path))
    _, p_ours, g_ours, _ = run_ours(setting, "ar_lopti", opt_kind="adamw", lr=lr, grad_clip=1.0)
    assert len(g_trl) == len(g_ours) == 2
    for a, b in zip(g_trl, g_ours):
        diff = float((a - b).abs().max())
        print(f"AdamW grad: max abs diff {diff:.3e} (max |grad| {float(b.abs().max()):.3e})")
        assert diff <= 1e-4 * float(b.abs().max())
    diff = float((p_trl - p_ours).abs().max())
    print(f"AdamW weights: max abs diff {diff:.3e} (max |update| {float((p_ours - p0).abs().max()):.3e})")
    # The lr-1e-6 update is ~100 float32 ulps of the weights: allow one rounding step.
    assert diff <= 2 * torch.finfo(torch.float32).eps * float(p0.abs().max())
    assert float((p_ours - p0).abs().max()) > 50 * diff


@pytest.mark.parametrize("order", ["low_first", "high_first"])
def test_lopti_stage_order(setting, order, tmp_path):
    """Which tokens carry gradient in each TRL pass: pass 0 only the first stage's tokens
    (pi_old < eta for low_first, the others for high_first), pass 1 only the second's; every
    token of the stage with a non-zero advantage does carry gradient."""
    record = []
    _, _, _ = run_trl(setting, "lopti", order=order, record=record, tmp=str(tmp_path))
    eta = T.paper_settings("lopti")["eta"]
    assert sorted({r["pass"] for r in record}) == [0, 1]
    # pi_old is not recomputed between the stages: pass 1 replays the same micro-batches
    # with the very old log-probs of pass 0.
    n = len(record) // 2
    assert [r["pass"] for r in record] == [0] * n + [1] * n
    for a, b in zip(record[:n], record[n:]):
        assert torch.equal(a["old"], b["old"]) and torch.equal(a["mask"], b["mask"])
    for r in record:
        low = (r["old"].exp() < eta) & (r["mask"] > 0)
        high = (~low) & (r["mask"] > 0)
        first = low if order == "low_first" else high
        stage = first if r["pass"] == 0 else (high if order == "low_first" else low)
        carries = r["grad"] != 0
        assert not (carries & ~stage).any(), "a token outside the stage carries gradient"
        adv = r["adv"] if r["adv"].dim() == 2 else r["adv"].unsqueeze(1).expand_as(stage)
        assert (carries | ~(stage & (adv != 0))).all(), "a stage token with advantage has no gradient"
        assert stage.any()


def _prepared(setting, method, tmp_path):
    """A LoptiGRPOTrainer for `method` (args from make_trl_config) and one prepared batch of
    the fixed completions: pi_old shifted so that ratios are 20, 0.05 or ~1, a reference
    policy within |log-ratio| < 2.6 (no k3 clamp active), per-token advantages of both signs. Returns (trainer, model, inputs, batch for grpo_update, cfg)."""
    from lopti_minimal.grpo import token_logprobs
    from datasets import Dataset
    cfg = config(method)
    reward_fn, _ = reward_of(setting)
    tok = setting["tok"]
    model = LlamaForCausalLM.from_pretrained(setting["dir"], dtype=torch.float32)
    trainer = LoptiGRPOTrainer(
        model=model, reward_funcs=reward_fn, processing_class=tok, cfg=cfg,
        train_dataset=Dataset.from_list([{"prompt": p} for p in setting["prompts"]]),
        args=make_trl_config(cfg, str(tmp_path), report_to="none", save_strategy="no",
                             disable_tqdm=True, dataloader_num_workers=0))
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = trainer.args.gradient_accumulation_steps
    comps = setting["completions"]
    B, R = len(comps), max(len(c) for c in comps)
    cids = torch.tensor([c + [tok.pad_token_id] * (R - len(c)) for c in comps])
    cmask = torch.tensor([[1] * len(c) + [0] * (R - len(c)) for c in comps])
    pids = torch.tensor([setting["prompt_ids"][i // G] for i in range(B)])
    ids, am = torch.cat([pids, cids], 1), torch.cat([torch.ones_like(pids), cmask], 1)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        logp0 = token_logprobs(model, ids, am, pids.shape[1], TEMPERATURE)
    shift = torch.tensor([3.0, -3.0, 0.05, -0.05])[torch.randint(0, 4, (B, R), generator=gen)]
    old = (logp0 - shift) * cmask
    ref = (logp0 + 0.5 * torch.randn(B, R, generator=gen)) * cmask
    adv = torch.randn(B, R, generator=gen) * cmask
    inputs = {"prompt_ids": pids, "prompt_mask": torch.ones_like(pids), "completion_ids": cids,
              "completion_mask": cmask, "advantages": adv, "old_per_token_logps": old,
              "ref_per_token_logps": ref, "num_items_in_batch": cmask.sum()}
    batch = Rollout(input_ids=ids, attention_mask=am, response_ids=cids, response_mask=cmask.float(),
                    prompt_len=pids.shape[1], old_logprobs=old, advantages=adv,
                    ref_logprobs=ref)
    return trainer, model, inputs, batch, cfg


def _trl_loss_and_grad(trainer, model, inputs):
    model.zero_grad()
    loss = trainer._compute_loss(model, dict(inputs))
    loss.backward()
    return float(loss), torch.cat([p.grad.flatten() for p in model.parameters()]).clone()


def _our_loss_and_grad(model, batch, cfg, fix):
    """One grpo_update with the method's hook and an lr-0 SGD: its loss and gradient."""
    opt = RecordingSGD(model.parameters(), lr=0.0)
    m = grpo_update(model, opt, batch, cfg, pg_loss=fix)
    return m["loss"], opt.grads[0]


def _assert_same_update(trainer, model, inputs, batch, cfg, fix, name):
    """TRL's _compute_loss and our grpo_update with the method's hook: the same loss and
    gradient (relative 1e-5 / 1e-4). Returns ours."""
    l_trl, g_trl = _trl_loss_and_grad(trainer, model, inputs)
    l_ours, g_ours = _our_loss_and_grad(model, batch, cfg, fix)
    print(f"{name}: |loss diff| {abs(l_trl - l_ours):.3e}, max |grad diff| "
          f"{float((g_trl - g_ours).abs().max()):.3e} (max |grad| {float(g_ours.abs().max()):.3e})")
    assert abs(l_trl - l_ours) <= 1e-5 * abs(l_ours) + 1e-7
    assert float((g_trl - g_ours).abs().max()) <= 1e-4 * float(g_ours.abs().max())
    return l_ours, g_ours


def test_delta_is_the_dual_clip(setting, tmp_path):
    """Design choice 6: TRL's `delta` = our dual clip c = 10, value and gradient, on ratios far
    from 1. The subclass's `_compute_loss` gets a prepared batch whose pi_old makes some
    ratios 20 (dual clip active where A < 0), some 0.05, some near 1; our `policy_loss` +
    `kl_k3` with a token-mean must give the same loss and gradient. Without delta TRL's
    loss differs (so the check is sensitive)."""
    from lopti_minimal.grpo import kl_k3, policy_loss, token_logprobs
    trainer, model, inputs, batch, cfg = _prepared(setting, "grpo", tmp_path)
    ids, am, old, ref, adv = batch.input_ids, batch.attention_mask, batch.old_logprobs, \
        batch.ref_logprobs, batch.advantages
    m = batch.response_mask
    l_trl, g_trl = _trl_loss_and_grad(trainer, model, inputs)
    model.zero_grad()
    logp = token_logprobs(model, ids, am, batch.prompt_len, TEMPERATURE)
    pg, st = policy_loss(logp, old, adv, cfg.eps_low, cfg.eps_high, cfg.clip_c)
    assert st["dual_clipped"][m > 0].any(), "no dual-clipped token"
    ours = ((pg + cfg.kl_coef * kl_k3(logp, ref)) * m).sum() / m.sum()
    ours.backward()
    g_ours = torch.cat([p.grad.flatten() for p in model.parameters()])
    print(f"delta = clip_c: |loss diff| {abs(l_trl - float(ours)):.3e}, "
          f"max |grad diff| {float((g_trl - g_ours).abs().max()):.3e} (max |grad| {float(g_ours.abs().max()):.3e})")
    assert abs(l_trl - float(ours)) <= 1e-5 * abs(float(ours)) + 1e-7
    assert float((g_trl - g_ours).abs().max()) <= 1e-4 * float(g_ours.abs().max())
    trainer.args.delta = None                           # plain TRL clipping: no dual clip
    l_plain, _ = _trl_loss_and_grad(trainer, model, inputs)
    assert abs(l_plain - float(ours)) > 1e-3 * abs(float(ours))
    trainer.args.delta = cfg.clip_c
    trainer.args.use_bias_correction_kl = True          # TRL's default: k3 * rho
    l_corr, _ = _trl_loss_and_grad(trainer, model, inputs)
    assert abs(l_corr - float(ours)) > 1e-3 * abs(float(ours))


def test_entropy_top_equals_trls_top_entropy_quantile(setting, tmp_path):
    """entropy_top (token_fixes.py) = TRL's `top_entropy_quantile=0.2`, loss and gradient,
    on the dual-clip test's batch (ratios far from 1). TRL takes the entropies from pi_theta
    in `_compute_loss` and the quantile over the micro-batch it is given; ours from the model
    before the update and over the whole batch: the same here, where TRL gets the whole
    batch at once (so are the two masks, compared directly). With the batch split in two
    micro-batches, TRL's per-micro-batch thresholds pick other tokens (the documented
    difference, NOT_IN_TRL)."""
    from lopti_minimal import token_fixes as TF
    trainer, model, inputs, batch, cfg = _prepared(setting, "entropy_top", tmp_path)
    assert trainer.args.top_entropy_quantile == 0.2 and trainer.args.loss_type == "dapo"
    fix = TF.build("entropy_top", model, batch, cfg)
    m = batch.response_mask
    # the entropies TRL's fused head computes, and its mask
    with torch.no_grad():
        _, H_trl, _ = trainer._get_per_token_logps_and_entropies(
            model, batch.input_ids, batch.attention_mask, inputs["completion_ids"].size(1),
            compute_entropy=True)
    H_ours = TF.batch_entropies(model, batch, cfg)
    assert float(((H_trl - H_ours) * m).abs().max()) < 1e-5
    trl_mask = trainer.get_high_entropy_mask(H_trl, m, 1 - 0.2).float()
    assert torch.equal(trl_mask, fix.mask) and 0 < fix.fraction(m) < 0.3
    l_ours, g_ours = _assert_same_update(trainer, model, inputs, batch, cfg, fix, "entropy_top")
    trainer.top_entropy_quantile = 1.0                  # every token: TRL's loss changes
    l_all, _ = _trl_loss_and_grad(trainer, model, inputs)
    assert abs(l_all - l_ours) > 1e-3 * abs(l_ours)
    # TRL with two micro-batches of 6 rows: each its own 0.8-quantile
    halves = torch.cat([trainer.get_high_entropy_mask(H_trl[s], m[s], 0.8).float()
                        for s in (slice(0, 6), slice(6, 12))])
    assert not torch.equal(halves, fix.mask)
    print(f"entropy_top: two TRL micro-batches select {int((halves != fix.mask).sum())} tokens "
          f"differently from the whole-batch quantile ({int(fix.mask.sum())} selected)")


def test_cispo_equals_trls_loss_type_cispo(setting, tmp_path):
    """cispo (token_fixes.py) = TRL's `loss_type="cispo"` with epsilon_high = 1 + 4 = 5, loss
    and gradient, on ratios of 20 (weight clipped to 5), 0.05 and ~1: TRL clips the weight
    at epsilon_high itself and has no lower bound, ours at 1 + cispo_eps_high with the lower
    bound 1 - cispo_eps_low = 0 (none). TRL's dapo loss and our PPO term differ (so the
    check is sensitive)."""
    from lopti_minimal import token_fixes as TF
    trainer, model, inputs, batch, cfg = _prepared(setting, "cispo", tmp_path)
    assert trainer.args.loss_type == "cispo" and trainer.epsilon_high == 5.0
    fix = TF.build("cispo", model, batch, cfg)
    l_ours, g_ours = _assert_same_update(trainer, model, inputs, batch, cfg, fix, "cispo")
    _, g_ppo = _our_loss_and_grad(model, batch, cfg, None)
    assert float((g_ppo - g_ours).abs().max()) > 1e-2 * float(g_ours.abs().max())
    trainer.loss_type = "dapo"
    l_dapo, _ = _trl_loss_and_grad(trainer, model, inputs)
    assert abs(l_dapo - l_ours) > 1e-3 * abs(l_ours)
    with pytest.raises(ValueError, match="no lower bound"):
        trl_grpo_args(T.make_config("ci", method="cispo", cispo_eps_low=0.2), "/tmp/x")
    with pytest.raises(ValueError, match="not in TRL"):
        trl_grpo_args(T.make_config("ci", method="kl_cov"), "/tmp/x")


def test_core_does_not_import_trl():
    """The core package, the trainer and the CLI never import TRL or this module."""
    import subprocess
    import sys
    code = ("import sys, lopti_minimal, lopti_minimal.trainer, lopti_minimal.grpo, lopti_minimal.lopti; "
            "import train; "
            "assert 'trl' not in sys.modules and 'lopti_minimal.trl_grpo' not in sys.modules, "
            "[m for m in sys.modules if 'trl' in m]")
    import os
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    subprocess.run([sys.executable, "-c", code], cwd=root, check=True,
                   env=dict(os.environ, OMP_NUM_THREADS="1"))


def test_per_stage_optimizers_are_refused_in_one_line():
    """Lopti with one optimizer per stage (lopti.py, choice 8) is not expressible on TRL,
    whose Trainer steps one optimizer in both passes: the mapping and the subclass refuse
    it, before anything is built; the default (shared, the reference's) maps."""
    cfg = T.make_config("ci", method="lopti", lopti_optimizer="per_stage")
    for build in (lambda: trl_grpo_args(cfg, "/tmp/x"), lambda: LoptiGRPOTrainer(cfg=cfg)):
        with pytest.raises(ValueError, match="lopti_optimizer='per_stage' is not supported on TRL") as e:
            build()
        assert "\n" not in str(e.value)
    assert trl_grpo_args(T.make_config("ci", method="lopti"), "/tmp/x")["num_iterations"] == 2
    with pytest.raises(T.TrainError, match="applies to Lopti"):       # without Lopti: refused earlier
        T.make_config("ci", method="grpo", lopti_optimizer="per_stage")


def test_dynamic_sampling_is_refused_in_one_line():
    """DAPO's dynamic sampling (dynamic_sampling.py) has no TRL 1.16 counterpart: its
    GRPOTrainer trains on every group it generates. The mapping and the subclass refuse it."""
    cfg = T.make_config("ci", method="ar_lopti", dynamic_sampling=2)
    for build in (lambda: trl_grpo_args(cfg, "/tmp/x"), lambda: LoptiGRPOTrainer(cfg=cfg)):
        with pytest.raises(ValueError, match="dynamic_sampling is not supported on TRL") as e:
            build()
        assert "\n" not in str(e.value)
    assert "dynamic_sampling > 0" in NOT_IN_TRL


# --------------------------------------------------------------- non-finite values (choice 10)


def _stopped_run(setting, tmp_path, method, breaks):
    """A TRL run whose ``breaks(trainer)`` puts a non-finite value in; returns the error and
    whether any weight moved or any optimizer step was taken."""
    box = {}

    def patch(trainer):
        breaks(trainer)
        box["trainer"], box["p0"] = trainer, flat(trainer.model)
    with pytest.raises(precision.NonFiniteError) as e:
        run_trl(setting, method, tmp=str(tmp_path), patch=patch)
    t = box["trainer"]
    moved = not torch.equal(flat(t.model), box["p0"])
    return str(e.value), moved, t.state.global_step


@pytest.mark.parametrize("method", ["grpo", "ar_lopti"])
def test_nonfinite_reward_loss_or_gradient_stops_before_the_update(setting, tmp_path, method):
    """HF's Trainer by itself only filters a NaN loss out of its logs and steps on it. The
    subclass stops (precision.py's choice 7; trl_grpo.py, choice 10) on an infinite reward,
    a NaN loss or an infinite gradient, in one line, before the optimizer steps on it."""
    def inf_reward(trainer):
        fn = trainer.reward_funcs[0]

        def bad(completions, completion_ids, **kw):
            out = fn(completions, completion_ids, **kw)
            return [float("inf")] + out[1:]
        bad.__name__ = fn.__name__
        trainer.reward_funcs[0] = bad

    def nan_loss(trainer):
        orig = trainer._compute_loss
        trainer._compute_loss = lambda model, inputs: orig(model, inputs) * float("nan")

    def inf_gradient(trainer):
        p = next(trainer.model.parameters())
        p.register_hook(lambda g: g * float("inf"))

    for breaks, what in ((inf_reward, "the reward was not finite (inf in 1 of 12)"),
                         (nan_loss, "the loss was not finite (nan"),
                         (inf_gradient, "the gradient norm was not finite (")):
        text, moved, steps = _stopped_run(setting, tmp_path, method, breaks)
        assert what in text and "before TRL's optimizer step 1" in text and "\n" not in text, text
        assert not moved and steps == 0


def test_save_model_refuses_nonfinite_weights(setting, tmp_path):
    """The subclass's save_model (the final folder and every checkpoint) writes nothing for
    a policy with a NaN weight (choice 10); tests/test_trl_multiprocess.py saves a finite one."""
    import types
    model = LlamaForCausalLM.from_pretrained(setting["dir"], dtype=torch.float32)
    with torch.no_grad():
        next(model.parameters())[0, 0] = float("nan")
    out = tmp_path / "final"
    with pytest.raises(precision.NonFiniteError, match="nothing was saved"):
        LoptiGRPOTrainer.save_model(types.SimpleNamespace(model=model), str(out))
    assert not out.exists()


def test_skipping_nonfinite_steps_is_refused_in_one_line():
    """on_nonfinite "skip" has no place in HF's training loop: refused before anything is built."""
    cfg = T.make_config("ci", method="grpo", on_nonfinite="skip")
    for build in (lambda: trl_grpo_args(cfg, "/tmp/x"), lambda: LoptiGRPOTrainer(cfg=cfg)):
        with pytest.raises(ValueError, match="on_nonfinite='skip' is not supported on TRL") as e:
            build()
        assert "\n" not in str(e.value)
