"""LoRA adapters (peft) as an option: train low-rank adapters instead of all weights.

The paper (Yang et al. 2025) trains all weights; this is for a GPU too small for that.
AR (Eq. 4) and Lopti (Algorithm 1) need nothing from it: they act on advantages and token
masks, and the update only sees fewer trainable parameters.

Design choices:

1. Optional: peft is an extra (".[lora]"; requirements.txt installs it),
   imported only when `lora_rank > 0`.
2. Adapters on every linear layer of the attention and MLP blocks, LoRA's scale alpha = 2 x
   rank, no dropout (dropout would make pi_theta random and the PPO ratio noisy).
3. pi_ref is the base model, frozen before the adapters are added: at the start the LoRA
   B matrices are zero, so the adapted policy equals it exactly, as with full training.
4. What a run saves is always a plain Hugging Face checkpoint with the adapters merged
   (`merged_copy`), so eval.py and `--model` load it like any other; the adapter weights
   themselves go into trainer_state.pt (`adapter_state`), for --resume. The merge, and so
   the saved checkpoint, is float32 whatever the base's dtype: merged into a bf16 base,
   W + s * B A would round back onto bf16's grid, on which an lr-1e-6 update is far below
   one step (precision.py, choice 1), and the saved policy would be the base again. A
   bf16 base's checkpoint is then twice the base's size; a float32 base (every CPU preset:
   float32 master weights) saves as before. Kept unmerged instead, the adapters would
   make every run directory depend on its base's path.
5. An adapter *folder* (`save_adapter`: peft's adapter_config.json + the adapter weights,
   no base weights) is what a supervised warm start of a pretrained LM ships
   (experiments/lm_warmstart.py): a few MB instead of the base's hundreds.
   `load_adapter_folder` loads its base (named in the config, a path relative to the
   current directory or to the checkout) and merges the adapter into it, in float32 as
   choice 4, then casts the merged weights to the dtype the caller loads in (a bf16 load
   rounds them once, as it rounds any checkpoint's), so models.load_model_and_tokenizer,
   and with it train.py and eval.py, take such a folder as --model like any checkpoint.
"""
from __future__ import annotations

import copy
import json
import os
import shutil

import torch

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _peft():
    try:
        import peft
    except ImportError as e:
        raise ImportError("lora_rank > 0 needs peft: pip install -r requirements.txt "
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
    """A plain transformers model with the adapters merged in, in float32 on the CPU
    (choice 4: what is saved); the original is untouched. A model without adapters is
    returned as it is."""
    if not is_lora(model):
        return model
    # the copy leaves the device at once (saving goes through the CPU anyway); float32
    # before the merge, so that W + s * B A keeps the update (a bf16 base's values are
    # exact in float32)
    return copy.deepcopy(model).to(device="cpu", dtype=torch.float32).merge_and_unload()


def adapter_state(model) -> dict:
    """The adapter weights only (what --resume restores on top of the base model)."""
    return _peft().get_peft_model_state_dict(model)


def load_adapter_state(model, state: dict) -> None:
    _peft().set_peft_model_state_dict(model, state)


ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def is_adapter_folder(path) -> bool:
    """A folder `save_adapter` (or peft's save_pretrained) wrote: adapter config, no model config."""
    return os.path.isfile(os.path.join(path, ADAPTER_CONFIG)) and \
        not os.path.isfile(os.path.join(path, "config.json"))


def save_adapter(model, out: str, base: str, dtype: torch.dtype = torch.bfloat16,
                 extra: dict | None = None) -> None:
    """The adapter of ``model`` (wrapped by `add_lora`) as a folder: adapter_config.json
    naming ``base`` as given (keep it relative: the folder then works in any checkout), the
    adapter weights cast to ``dtype`` (bf16 halves the file; what the folder holds is what
    every later load evaluates), and ``extra`` JSON files. Written to OUT.tmp, then one
    rename, as runs.save_hf_atomic."""
    from safetensors.torch import save_file
    tmp = out.rstrip("/") + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    # Only the fields add_lora sets (and peft's own two): a config that every peft the
    # requirements admit reads, whatever version wrote it (a newer peft's full dump names
    # fields an older one refuses).
    full = model.peft_config["default"]
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base,
              "r": full.r, "lora_alpha": full.lora_alpha, "lora_dropout": full.lora_dropout,
              "bias": full.bias, "target_modules": sorted(full.target_modules)}
    with open(os.path.join(tmp, ADAPTER_CONFIG), "w") as f:
        json.dump(config, f, indent=1, default=str)
    state = {k: v.detach().to(dtype).contiguous() for k, v in adapter_state(model).items()}
    save_file(state, os.path.join(tmp, ADAPTER_WEIGHTS))
    for name, obj in (extra or {}).items():
        with open(os.path.join(tmp, name), "w") as f:
            json.dump(obj, f, indent=1, default=str)
    from .paths import swap_in
    swap_in(tmp, out)


def adapter_base(folder: str) -> str:
    """The base model an adapter folder names, resolved as any --model is
    (paths.resolve_model: as written, else relative to the checkout, else a hub id)."""
    from .paths import resolve_model
    with open(os.path.join(folder, ADAPTER_CONFIG)) as f:
        return resolve_model(json.load(f)["base_model_name_or_path"])


def load_adapter_folder(folder: str, load_base):
    """(model, tokenizer): ``load_base(source)`` of the folder's base, then the adapter
    merged in (a plain transformers model: pi_ref of an RL run from it is the merged model,
    as for any checkpoint). The tokenizer is the base's."""
    import dataclasses

    from safetensors.torch import load_file
    peft = _peft()
    model, tokenizer = load_base(adapter_base(folder))
    dtype = next(model.parameters()).dtype
    with open(os.path.join(folder, ADAPTER_CONFIG)) as f:
        saved = json.load(f)
    known = {f.name for f in dataclasses.fields(peft.LoraConfig)}     # this peft's fields
    config = peft.LoraConfig(**{k: v for k, v in saved.items() if k in known and k != "peft_type"})
    model = peft.get_peft_model(model.to(torch.float32), config)     # merged in float32 (choice 5)
    load_adapter_state(model, load_file(os.path.join(folder, ADAPTER_WEIGHTS)))
    return model.merge_and_unload().to(dtype).eval(), tokenizer
