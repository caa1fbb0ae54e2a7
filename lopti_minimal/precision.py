"""Precision: float32 master weights, bf16 compute, and optimizers that keep every update.

The design choices, each with its reason:

1. The optimizer updates float32 master weights; bf16 is for compute. bfloat16 keeps 8
   bits of mantissa: a weight of 0.05 sits on a grid of spacing 2^-12 ~ 2.4e-4 (half of it
   for round-to-nearest), so an AdamW step of lr = 1e-6 (the paper's) rounds away. Pure bf16
   weights under AdamW keep under 1% of the float32 update (tests/test_precision.py shows
   it). The reference (verl with FSDP mixed precision) keeps float32 parameters and
   computes in bf16; we do the same with `torch.autocast` (``cfg.autocast_bf16``), on a CPU
   and on CUDA by the same line of code.
2. The frozen reference policy pi_ref may be bf16 (``cfg.ref_dtype``): it is never updated,
   and its log-probs are computed under the same bf16 autocast anyway. It halves the
   memory of the copy (as in the reference, whose ref worker holds bf16 parameters).
3. Where float32 weights plus AdamW's two float32 moments (16 B/parameter with the
   gradient) do not fit the GPU (1.5B and 3B on 24 GB), we do not write our own
   optimizer: ``optimizer="adamw8bit"`` is torchao's ``AdamW8bit`` (PyTorch's own
   library for low-precision training), with 8-bit blockwise-quantised moments (2
   B/parameter) and *stochastic rounding* of bf16 weights (``bf16_stochastic_round``):
   a weight rounds up with probability equal to the fraction of the grid step the update
   covers, so the update is kept in expectation instead of being rounded away. Why
   torchao rather than bitsandbytes: it is plain PyTorch (it runs on a CPU, so the test
   suite checks it without a GPU) and it has the stochastic rounding built in.
   Low-precision weights with any other optimizer are refused (``check_precision``).
4. Hardware is checked before any model is loaded (``check_hardware``): a CUDA device on
   a machine without CUDA, or bf16 on a GPU without it, is a one-line error that says what
   to use instead.
5. An optimizer step forgets autocast's bf16 copies of the weights (``weights_changed``).
   Inside one autocast region torch casts each float32 weight to bf16 once and reuses that
   copy until the region ends; an optimizer step changes the weights in place, which the
   copy does not see. The update runs inside one region (trainer.rl_step), so without this
   a second optimizer step (Lopti's stage 2, Algorithm 1; a second mini-batch) and the
   probe after the update computed with the weights from before the first step, where the
   reference's FSDP mixed precision casts the current parameters at every forward.
   Clearing the copies costs one cast per weight per step (tests/test_precision.py).
6. On CUDA, attention never runs cuDNN's kernel (``attention_kernels``); PyTorch's flash
   and memory-efficient kernels do. With cuDNN's kernel the default tiny run's gradient
   norm went NaN, a decode step failed inside cuDNN, and sampling was several times slower
   (a new cuDNN graph for each new sequence length): results/gpu/ has the measurement.
7. A non-finite number never updates the weights. Before a step's update the rewards, the
   advantages (one NaN reward makes its whole group's NaN) and log pi_old / pi_ref are
   checked (``finite_values``, trainer.rl_step: Lopti's stage 1 steps before stage 2's
   loss exists); before each optimizer step, its micro-batches' losses and the gradient
   norm (``finite_step``, grpo.grpo_update: a NaN loss can leave the gradient finite, where
   a clamp's backward zeroes it). What then happens is the run's choice,
   ``cfg.on_nonfinite``: "stop" (the default) raises `NonFiniteError`, one line naming the
   value and the step, and the run ends without saving anything of that step, so its last
   checkpoint is its last good policy and --resume continues from it; "skip" makes no
   update on it (the step's whole update for a non-finite batch, else that one optimizer
   step, as torch.amp's GradScaler skips a step with inf gradients; the other steps of the
   update stand) and the step's metrics line lists it (``take_skipped``). Stopping is the
   default because a NaN usually means a bug (a reward function, a learning rate) that
   skipping would hide for the rest of the run. The one saver (runs.save_hf_atomic)
   refuses non-finite weights too, so no NaN policy is ever written as a checkpoint or
   final/, and no older checkpoint is deleted for one.
"""
from __future__ import annotations

import copy

import torch

from . import host_memory
from .cli import TrainError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
OPTIMIZERS = ("adamw", "adafactor", "adamw8bit")
STOCHASTIC_ROUNDING = ("adamw8bit",)     # optimizers that keep updates of bf16 weights
GPU_ONLY_HINT = "on a CPU use --preset cpu-tiny or smollm2-cpu (--device cpu runs this preset's code path on the CPU, slowly)"


class PrecisionError(TrainError):
    """A precision or device setting that cannot work: one line, what to use instead."""


def master_dtype(cfg) -> torch.dtype:
    """The dtype of the trained weights: float32 unless a preset asks for bf16 weights
    with a stochastic-rounding optimizer ("auto" = float32 on every device)."""
    return torch.float32 if cfg.dtype == "auto" else DTYPES[cfg.dtype]


def check_precision(cfg) -> None:
    """Config-level checks (no hardware needed); raises PrecisionError."""
    if cfg.dtype not in ("auto", *DTYPES):
        raise PrecisionError(f"unknown dtype {cfg.dtype!r}: auto, {', '.join(DTYPES)}")
    if cfg.ref_dtype not in ("same", *DTYPES):
        raise PrecisionError(f"unknown ref dtype {cfg.ref_dtype!r}: same, {', '.join(DTYPES)}")
    if cfg.optimizer not in OPTIMIZERS:
        raise PrecisionError(f"unknown optimizer {cfg.optimizer!r}: {', '.join(OPTIMIZERS)}")
    if master_dtype(cfg) != torch.float32 and cfg.optimizer not in STOCHASTIC_ROUNDING:
        raise PrecisionError(
            f"{cfg.dtype} weights under {cfg.optimizer} round small updates away (an lr-1e-6 step "
            "of a 0.05 weight is below bf16's resolution): use dtype float32 (float32 master "
            "weights, bf16 autocast), or optimizer adamw8bit (bf16 stochastic rounding)")


def check_hardware(cfg) -> None:
    """Device-level checks, before any model is loaded; raises PrecisionError."""
    dev = cfg.device
    if dev.startswith("cuda") and not torch.cuda.is_available():
        raise PrecisionError(f"preset {cfg.preset} runs on a CUDA GPU (device {dev}) and none is "
                             f"visible: {GPU_ONLY_HINT}")
    if dev.startswith("cuda") or (dev == "auto" and torch.cuda.is_available()):
        wants_bf16 = cfg.autocast_bf16 or "bfloat16" in (cfg.dtype, cfg.ref_dtype)
        if wants_bf16 and not torch.cuda.is_bf16_supported():
            name = torch.cuda.get_device_name(torch.device(dev if dev != "auto" else "cuda"))
            raise PrecisionError(f"this GPU ({name}) has no bfloat16 (it needs compute capability 8.0+, "
                                 "Ampere or newer): use such a GPU, or --device cpu")


def attention_kernels(device) -> None:
    """Design choice 6: turn off cuDNN's attention for CUDA runs (a process-wide switch of
    torch's scaled_dot_product_attention, which transformers' attention calls)."""
    if str(device).startswith("cuda"):       # "cuda", "cuda:1" or a torch.device; not "cpu"/"auto"
        torch.backends.cuda.enable_cudnn_sdp(False)


def autocast(cfg, device):
    """bf16 autocast for compute when cfg.autocast_bf16 (the weights keep their dtype).
    One code path for CPU and CUDA: only the device type differs."""
    device_type = torch.device(device).type
    enabled = cfg.autocast_bf16 and device_type in ("cpu", "cuda")
    return torch.autocast(device_type, dtype=torch.bfloat16, enabled=enabled)


def weights_changed() -> None:
    """Design choice 5: after an optimizer step inside an autocast region, drop autocast's
    cached bf16 casts of the weights, so that the next forward casts the updated ones."""
    torch.clear_autocast_cache()


class NonFiniteError(RuntimeError):
    """Choice 7, on_nonfinite "stop": ``what`` (the reward, the loss, ...) was not finite
    (``value`` says how) and nothing was updated or saved from it. The RL loop adds the
    ``step`` and how to go on (``resume``), so that str() is the one line a user reads."""

    def __init__(self, what: str, value: str, action: str = "no update was made on it"):
        super().__init__(what)
        self.what, self.value, self.action = what, value, action
        self.step, self.resume = None, None

    def __str__(self) -> str:
        where = f"step {self.step}: " if self.step is not None else ""
        then = f"; {self.resume}" if self.resume else ""
        return f"{where}the {self.what} was not finite ({self.value}): {self.action}{then}"


def nonfinite(x: torch.Tensor) -> str | None:
    """None if every entry of ``x`` is finite; else what is not, e.g. "nan in 4 of 8"."""
    x = x.detach()
    n = int((~torch.isfinite(x)).sum())
    if not n:
        return None
    kinds = "/".join(k for k, hit in (("nan", torch.isnan(x)), ("inf", torch.isinf(x))) if bool(hit.any()))
    return f"{kinds} in {n} of {x.numel()}" if x.numel() > 1 else f"{float(x):g}"


_SKIPPED: list[str] = []      # choice 7, on_nonfinite "skip": what was skipped since take_skipped


def _no_update(what: str, value: str, cfg) -> bool:
    """Choice 7 for a non-finite ``what``: NonFiniteError ("stop"), or False and a record ("skip")."""
    if getattr(cfg, "on_nonfinite", "stop") != "skip":
        raise NonFiniteError(what, value)
    _SKIPPED.append(f"{what}: {value}")
    return False


def finite_values(values: dict, cfg) -> bool:
    """Choice 7, before an update: True if every tensor of ``values`` ({what: tensor}; None
    is left out) is finite. Else NonFiniteError, or False under on_nonfinite "skip"."""
    for what, x in values.items():
        bad = None if x is None else nonfinite(x)
        if bad:
            return _no_update(what, bad, cfg)
    return True


def finite_step(losses: torch.Tensor, grad_norm: torch.Tensor, cfg) -> bool:
    """Choice 7, between a mini-batch's backward and its optimizer step: True if its
    micro-batches' ``losses`` and its gradient norm are finite, so the step may be taken.
    Else NonFiniteError, or False (take no step) under on_nonfinite "skip"."""
    return finite_values({"loss": losses, "gradient norm": grad_norm}, cfg)


def take_skipped() -> list[str]:
    """What choice 7 skipped (on_nonfinite "skip") since the last call, e.g. ["loss: nan"]."""
    out = list(_SKIPPED)
    _SKIPPED.clear()
    return out


def nonfinite_weights(model) -> str | None:
    """None if every floating-point weight of ``model`` is finite; else which are not."""
    bad = [k for k, v in model.state_dict().items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]
    if not bad:
        return None
    return f"in {bad[0]}" + (f" and {len(bad) - 1} more tensors" if len(bad) > 1 else "")


def reference_copy(model, dtype: torch.dtype | None = None):
    """pi_ref: a frozen copy of the initial policy, in ``dtype`` if given (choice 2)."""
    ref = copy.deepcopy(model)
    if dtype is not None:
        ref.to(dtype)
    ref.eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


def ref_dtype(cfg) -> torch.dtype | None:
    return None if cfg.ref_dtype == "same" else DTYPES[cfg.ref_dtype]


class StageOptimizers:
    """lopti.py's choice 8, ``lopti_optimizer="per_stage"``: one optimizer per token set,
    ``low`` and ``high``, over the same parameters; `lopti_update` steps each in its stage
    only (lopti.py imports it from here: precision stays below grpo and lopti).

    To the run's plumbing it is one optimizer: `state_dict` holds both states (a
    checkpoint's trainer_state.pt, runs.save_checkpoint) and `load_state_dict` restores
    both (--resume), so a resumed run repeats the uninterrupted one bit for bit."""

    def __init__(self, low, high):
        self.low, self.high = low, high

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in (self.low, self.high):
            opt.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        # plain containers of tensors and numbers: runs.read_state loads it weights-only
        return {"per_stage": {"low": self.low.state_dict(), "high": self.high.state_dict()}}

    def load_state_dict(self, state: dict) -> None:
        if "per_stage" not in state:
            raise ValueError("this optimizer state is one shared by both Lopti stages; the run has "
                             "one per stage (lopti_optimizer='per_stage'): resume it with the config it "
                             "was saved with")
        self.low.load_state_dict(state["per_stage"]["low"])
        self.high.load_state_dict(state["per_stage"]["high"])


def build_optimizer(model, cfg):
    """The optimizer of ``cfg.optimizer`` over the model's trainable (master) weights (LoRA:
    the adapters only), with cfg.optimizer_lr (lr x lr_scale), cfg.adam_betas and
    cfg.weight_decay. Lopti with ``lopti_optimizer="per_stage"``: two of them over the same
    weights, one per stage (`StageOptimizers`, lopti.py choice 8); every kind works so,
    as each keeps its state per optimizer (adamw8bit its 8-bit moments, adafactor its
    factored ones), and the state costs twice its memory."""
    params = [p for p in model.parameters() if p.requires_grad]
    if cfg.uses_lopti and cfg.lopti_optimizer == "per_stage":
        return StageOptimizers(low=_optimizer(params, cfg), high=_optimizer(params, cfg))
    return _optimizer(params, cfg)


def _optimizer(params: list, cfg):
    """One optimizer of ``cfg.optimizer`` over ``params`` (`build_optimizer`)."""
    lr = cfg.optimizer_lr
    if cfg.optimizer == "adamw":
        # The reference actor's AdamW: float32 state, verl's betas and weight decay.
        return torch.optim.AdamW(params, lr=lr, betas=tuple(cfg.adam_betas),
                                 weight_decay=cfg.weight_decay)
    if cfg.optimizer == "adafactor":
        # Adafactor (Shazeer & Stern 2018) as shipped by transformers, with an explicit lr:
        # factored second moments, no first moment -- a few MB of state instead of 2 x params.
        from transformers.optimization import Adafactor
        return Adafactor(params, lr=lr, scale_parameter=False, relative_step=False,
                         warmup_init=False, weight_decay=cfg.weight_decay)
    try:
        from torchao.optim import AdamW8bit
    except ImportError as e:
        raise PrecisionError("optimizer adamw8bit needs torchao: pip install torchao") from e
    sr = any(p.dtype == torch.bfloat16 for p in params)
    return AdamW8bit(params, lr=lr, betas=tuple(cfg.adam_betas), weight_decay=cfg.weight_decay,
                     bf16_stochastic_round=sr)


def free_memory(device) -> None:
    """Hand cached, now unused blocks back between the phases of a step (after each rollout
    chunk, after the update), so the next phase finds room: CUDA's cached blocks, or on a
    CPU the free pages of glibc's heap (host_memory.trim_heap)."""
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
    else:
        host_memory.trim_heap()
