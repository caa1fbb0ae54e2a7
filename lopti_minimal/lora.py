"""LoRA adapters (peft) as an option: train low-rank adapters instead of all weights.

The paper (Yang et al. 2025) trains all weights; this is for a GPU too small for that.
AR (Eq. 4) and Lopti (Algorithm 1) need nothing from it: they act on advantages and token
masks, and the update only sees fewer trainable parameters.

Design choices:

1. Optional: peft is an extra (`pip install -r requirements-lora.txt`, or ".[lora]"),
   imported only when `lora_rank > 0`.
2. Adapters on every linear layer of the attention and MLP blocks, LoRA's scale alpha = 2 x
   rank, no dropout (dropout would make pi_theta random and the PPO ratio noisy).
3. pi_ref is the base model, frozen before the adapters are added: at the start the LoRA
   B matrices are zero, so the adapted policy equals it exactly, as with full training.
4. What a run saves is always a plain Hugging Face checkpoint with the adapters merged
   (`merged_copy`), so eval.py and `--model` load it like any other; the adapter weights
   themselves go into trainer_state.pt (`adapter_state`), for --resume.
"""
from __future__ import annotations

import copy

import torch

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _peft():
    try:
        import peft
    except ImportError as e:
        raise ImportError("lora_rank > 0 needs peft: pip install -r requirements-lora.txt "
                          "(or pip install 'lopti-minimal[lora]')") from e
    return peft


def add_lora(model, rank: int, seed: int = 0):
    """The model wrapped with fresh rank-`rank` adapters; only the adapters train.

    The adapters' random init is drawn from `seed` alone, not from the global random state,
    so a run (and its --resume) does not depend on what ran before it in the process."""
    peft = _peft()
    config = peft.LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, bias="none",
                             target_modules=list(TARGETS), task_type="CAUSAL_LM")
    device = next(model.parameters()).device
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        return peft.get_peft_model(model, config)


def adapter_parameters(config, rank: int) -> int:
    """The parameters ``add_lora`` trains on a Llama/Qwen2-style model of ``config`` (a
    transformers config), without building it: rank x (in + out) for each TARGETS
    projection of every layer (what the GPU memory estimate counts; tested against peft)."""
    h, inter = config.hidden_size, config.intermediate_size
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    d = getattr(config, "head_dim", None) or h // heads
    shapes = {"q_proj": (h, heads * d), "k_proj": (h, kv * d), "v_proj": (h, kv * d),
              "o_proj": (heads * d, h), "gate_proj": (h, inter), "up_proj": (h, inter),
              "down_proj": (inter, h)}
    return config.num_hidden_layers * sum(rank * (i + o) for i, o in (shapes[t] for t in TARGETS))


def is_lora(model) -> bool:
    return hasattr(model, "peft_config")


def merged_copy(model):
    """A plain transformers model with the adapters merged in (the original is untouched)."""
    return copy.deepcopy(model).merge_and_unload() if is_lora(model) else model


def adapter_state(model) -> dict:
    """The adapter weights only (what --resume restores on top of the base model)."""
    return _peft().get_peft_model_state_dict(model)


def load_adapter_state(model, state: dict) -> None:
    _peft().set_peft_model_state_dict(model, state)
