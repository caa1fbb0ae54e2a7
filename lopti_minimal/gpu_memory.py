"""A rough GPU memory estimate of one RL step: the table in docs/GPU.md
(benchmarks/memory_table.py prints it; scripts/gpu_check.py sets it beside measured peaks).

Not part of the method; it sizes the GPU presets (config.py) before a GPU is at hand."""
from __future__ import annotations

BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def memory_estimate_gb(n_params: float, layers: int, kv_heads: int, head_dim: int, vocab: int,
                       rows: int, seq: int, micro_batch: int, optimizer: str = "adamw",
                       weights: str = "float32", ref: str = "bfloat16", new_tokens: int | None = None,
                       lora_params: float = 0, optimizer_states: int = 1) -> dict:
    """Rough GPU memory of one training step in GB (1e9 bytes) under a precision policy
    (precision.py): trained weights and their gradients in ``weights`` (4 B/param for
    float32 master weights, 2 for bf16); optimizer state: AdamW's two moments in the
    weights' dtype (8 or 4 B/param), torchao's 8-bit AdamW 2 B/param, Adafactor ~0; the
    frozen reference copy in ``ref``; the bf16 KV cache of one rollout chunk (rows x seq x
    layers x 2 x kv_heads x head_dim x 2 B; autocast computes keys and values in bf16);
    the float32 logits of one micro-batch [micro_batch, positions, vocab] (x2: value +
    grad), where positions are the response's ``new_tokens`` + 1 (the update asks the
    model for those only: grpo.token_logprobs) or, without ``new_tokens``, all of ``seq``
    (an upper bound). The phases do not overlap: sampling holds the KV cache (grads are
    freed after each update), the update holds grads and logits; "peak" is the larger
    phase. Checkpointed activations (~0.1-0.7 GB) and the CUDA context (~0.5 GB) come on
    top.

    LoRA (``lora_params`` > 0, lora.adapter_parameters): the ``n_params`` base weights are
    frozen (no gradient, no optimizer state) and the adapters train in float32 (peft keeps
    them float32 beside bf16 weights): "weights" holds both, "grads" and "optimizer" the
    adapters' only; the reference stays a full copy (lora.py).

    ``optimizer_states``: how many optimizer states the trained weights have; 2 for Lopti
    with one optimizer per stage (lopti_optimizer="per_stage", lopti.py's choice 8), whose
    second state lives for the whole run beside the first."""
    gb = 1e9
    w = BYTES["float32" if weights == "auto" else weights]
    state = {"adamw": 2 * w, "adamw8bit": 2, "adafactor": 0.05}
    positions = seq if new_tokens is None else new_tokens + 1
    if lora_params:
        trained, tw = lora_params, 4                 # float32 adapters
        base = w * n_params + tw * lora_params
        opt_bytes = state[optimizer] if optimizer != "adamw" else 2 * tw
    else:
        trained, tw, base, opt_bytes = n_params, w, w * n_params, state[optimizer]
    out = {
        "weights": base / gb, "grads": tw * trained / gb,
        "optimizer": optimizer_states * opt_bytes * trained / gb,
        "reference": BYTES[weights if ref == "same" else ref] * n_params / gb,
        "kv_cache": rows * seq * layers * 2 * kv_heads * head_dim * 2 / gb,
        "logits": 2 * micro_batch * positions * vocab * 4 / gb,
    }
    base = out["weights"] + out["optimizer"] + out["reference"]
    out["peak"] = max(base + out["kv_cache"], base + out["grads"] + out["logits"])
    return out


def optimizer_states(cfg) -> int:
    """The ``optimizer_states`` of a TrainConfig: 2 for Lopti with one optimizer per stage
    (lopti.py's choice 8), else 1."""
    return 2 if cfg.uses_lopti and cfg.lopti_optimizer == "per_stage" else 1
