"""precision.py: every preset's precision policy keeps an lr-1e-6 update; bad precision or
hardware settings are refused before any model is loaded.

The bug this guards against: bf16 weights under AdamW. A weight of 0.05 sits on a bf16 grid
of spacing ~2.4e-4, so a step of ~1e-6 rounds away; one such step kept 0.7% of the float32
update. The policy keeps float32 master weights (bf16 only under autocast), or bf16 weights
with stochastic rounding (torchao's 8-bit AdamW), which keeps the update in expectation."""
import dataclasses

import pytest
import torch

from conftest import DEVICES, ROOT
from lopti_minimal import plumbing, precision, trainer
from lopti_minimal.config import PRESETS, TrainError, make_config

TINY = str(ROOT / "checkpoints" / "tiny-warm")


def kept_share(cfg) -> float:
    """One optimizer step of cfg's policy on the tiny model (on cfg.device) with gradients
    of ~1e-3: its update projected on the float32 AdamW update from the same weights and
    gradients, <d, d32> / <d32, d32> (1 = all of it kept)."""
    model, _ = plumbing.load_policy(cfg)
    w0 = [p.detach().float().clone() for p in model.parameters()]
    opt = precision.build_optimizer(model, cfg)
    gen = torch.Generator().manual_seed(0)      # drawn on the CPU: the same gradients on every device
    for p in model.parameters():
        p.grad = (torch.randn(p.shape, generator=gen) * 1e-3).to(p.device, p.dtype)
    # The float32 reference: the same starting values and gradients, torch's AdamW.
    ref = [torch.nn.Parameter(w.clone()) for w in w0]
    for r, p in zip(ref, model.parameters()):
        r.grad = p.grad.float()
    torch.optim.AdamW(ref, lr=cfg.lr, betas=tuple(cfg.adam_betas), weight_decay=cfg.weight_decay).step()
    opt.step()
    num = den = 0.0
    for p, w, r in zip(model.parameters(), w0, ref):
        d, d32 = p.detach().float() - w, r.detach() - w
        num += float((d * d32).sum())
        den += float((d32 * d32).sum())
    return num / den


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("preset", list(PRESETS))
def test_every_preset_keeps_an_lr_1e6_update(preset, device, eager_compile):
    """On CUDA too (torchao's 8-bit AdamW and its stochastic rounding on the GPU: the same
    math, run eagerly here as on the CPU; scripts/gpu_check.py runs it compiled)."""
    cfg = make_config(preset, model=TINY, device=device, lr=1e-6)
    share = kept_share(cfg)
    assert 0.9 <= share <= 1.1, (preset, cfg.dtype, cfg.optimizer, share)


@pytest.mark.parametrize("device", DEVICES)
def test_bf16_weights_under_plain_adamw_lose_the_update_and_are_refused(device):
    with pytest.raises(TrainError, match="round small updates away"):
        make_config("qwen2.5-0.5b", model=TINY, device=device, dtype="bfloat16")
    # Built past the check: bf16 weights under plain AdamW keep almost nothing.
    cfg = dataclasses.replace(make_config("qwen2.5-0.5b", model=TINY, device=device, lr=1e-6), dtype="bfloat16")
    assert kept_share(cfg) < 0.1


@pytest.mark.parametrize("device", DEVICES)
def test_gpu_presets_train_float32_or_stochastically_rounded_weights(device):
    for name in ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b"):
        c = make_config(name)
        assert c.device == "cuda" and c.autocast_bf16 and c.ref_dtype == "bfloat16"
        assert precision.master_dtype(c) == torch.float32 or c.optimizer in precision.STOCHASTIC_ROUNDING
    # The reference copy may be bf16; the trained weights stay float32, both on the device.
    cfg = make_config("qwen2.5-0.5b", model=TINY, device=device)
    model, _ = plumbing.load_policy(cfg)
    ref = precision.reference_copy(model, precision.ref_dtype(cfg))
    assert next(model.parameters()).dtype == torch.float32 and next(ref.parameters()).dtype == torch.bfloat16
    assert next(model.parameters()).device.type == next(ref.parameters()).device.type == device
    assert not any(p.requires_grad for p in ref.parameters())


def test_a_gpu_preset_without_cuda_is_one_line_before_loading(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg = make_config("qwen2.5-0.5b", run_dir=str(tmp_path / "r"))
    with pytest.raises(TrainError, match="none is visible: on a CPU use --preset cpu-tiny"):
        trainer.train(cfg)
    assert not (tmp_path / "r").exists()                  # nothing written, nothing loaded


def test_bf16_on_a_gpu_without_it_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Tesla T4")
    with pytest.raises(precision.PrecisionError, match="Tesla T4.*Ampere"):
        precision.check_hardware(make_config("qwen2.5-0.5b"))
    with pytest.raises(TrainError, match="Tesla T4"):          # what the CLI prints as one line
        precision.check_hardware(make_config("qwen2.5-0.5b"))


def test_cuda_runs_turn_off_cudnn_attention(monkeypatch, tmp_path):
    """precision.py design choice 6: a CUDA run's attention avoids cuDNN's kernel (on an
    H200 it made the default run's gradient NaN at step 3, results/gpu/). The switch is
    process-wide, so it is checked on a CPU: attention_kernels("cuda") turns it off,
    "cpu" leaves it, and a run on CUDA (or "auto" with CUDA visible) asks for it."""
    from lopti_minimal import plumbing
    from lopti_minimal.config import make_config
    was = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        torch.backends.cuda.enable_cudnn_sdp(True)
        for device in ("cpu", "auto", torch.device("cpu")):
            precision.attention_kernels(device)
            assert torch.backends.cuda.cudnn_sdp_enabled()
        precision.attention_kernels("cuda")
        assert not torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(was)
    asked = []
    monkeypatch.setattr(plumbing, "check_hardware", lambda cfg: None)
    monkeypatch.setattr(plumbing, "attention_kernels", asked.append)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for device in ("cuda", "auto", "cpu"):
        plumbing.Run(make_config("ci", device=device, run_dir=str(tmp_path / device)))
    assert asked == ["cuda", "cuda", "cpu"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)   # "auto" on a CPU machine
    plumbing.Run(make_config("ci", device="auto", run_dir=str(tmp_path / "auto-cpu")))
    assert asked[-1] == "auto"


def test_an_optimizer_step_inside_autocast_is_seen_by_the_next_forward():
    """precision.py design choice 5. The update runs inside one bf16 autocast region, whose
    cached bf16 casts of the weights would outlive an optimizer step: a second mini-batch
    (or Lopti's stage 2) would then compute with the weights from before the first step.
    Two mini-batches in one region must give the weights that two regions give, one per
    mini-batch, to the bit, and a forward after the update must see it."""
    import copy
    from conftest import BOS, EOS, PAD, generator, tiny_llama, update_batch
    from lopti_minimal.config import TrainConfig
    from lopti_minimal.grpo import group_advantages, grpo_update, token_logprobs
    from lopti_minimal.sampling import sample_groups

    model = tiny_llama(seed=2)
    r = sample_groups(model.eval(), [[BOS, 5, 6, 7], [BOS, 9]], group_size=4, max_new_tokens=10,
                      temperature=1.0, eos_token_id=EOS, pad_token_id=PAD, generator=generator("cpu", 0))
    batch = update_batch(r, group_advantages(torch.tensor([3.0, -1.0, 0.5, -3.0] * 2), 4))
    cfg = TrainConfig(lr=1e-2, kl_coef=0.0, mini_batch_size=4, micro_batch_size=4)
    one, two = copy.deepcopy(model), copy.deepcopy(model)
    bf16 = lambda: torch.autocast("cpu", dtype=torch.bfloat16)   # noqa: E731

    with bf16():                                    # both mini-batches in one region
        grpo_update(one, torch.optim.SGD(one.parameters(), lr=cfg.lr), batch, cfg)
        after = token_logprobs(one, r.input_ids, r.attention_mask, r.prompt_len, 1.0)
    opt = torch.optim.SGD(two.parameters(), lr=cfg.lr)
    for half in (slice(0, 4), slice(4, 8)):          # a region per mini-batch
        with bf16():
            grpo_update(two, opt, batch.rows(half), cfg)
    with bf16():
        fresh = token_logprobs(two, r.input_ids, r.attention_mask, r.prompt_len, 1.0)
    assert all(torch.equal(a, b) for a, b in zip(one.parameters(), two.parameters()))
    assert torch.equal(after, fresh)
    # the lm_head weights (cast by autocast) really moved, so a stale cast would show above
    assert any(not torch.equal(a, b) for a, b in zip(one.lm_head.parameters(), model.lm_head.parameters()))
