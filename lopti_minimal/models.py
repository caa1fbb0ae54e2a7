"""Models: the tiny Llama presets, and one loader for any causal LM.

Design choices:

1. Two tiers: the *tiny* tier, a Llama-architecture model from ``transformers`` with a
   small config and our own K&K tokenizer (tokenizer.py), trained from scratch on a CPU
   (experiments/warmstart.py); the *pretrained* tier, any Hugging Face causal LM, from a local
   directory, a hub id (where the hub is reachable) or a ``.gguf`` file (dequantized by
   transformers on load).
2. Both are ordinary ``PreTrainedModel`` objects, so the RL code never cares which tier it
   trains, and both are saved with ``save_pretrained``.
3. Prompting through the model (a known pitfall of GRPO implementations: an instruct model
   needs its chat template, or it never stops): ``kk_prompt`` builds the official
   Qwen-style system + user prompt through the tokenizer's chat template for instruct
   models, and the compact prompt for our tiny model, which has no chat template.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from .task import prompts


class ModelLoadError(ValueError):
    """A one-line message saying what is wrong with the input and how to fix it."""


# ---------------------------------------------------------------------------------------
# Tiny presets
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TinyPreset:
    hidden: int            # d_model
    layers: int
    heads: int
    kv_heads: int          # grouped-query attention as in Llama/Qwen; == heads means MHA
    intermediate: int      # SwiGLU width (~8/3 * hidden, rounded)
    max_positions: int     # longest prompt + response the RoPE cache is sized for


# Sizes for a 2-core CPU.  Parameter counts (docs/TASK_AND_MODELS.md) are for the shipped
# tokenizer's vocabulary of 771 entries (tokenizer.py asks its BPE for up to 1,024; the K&K
# corpus has no more pairs worth merging; tests/test_models.py checks the number) with tied
# input/output embeddings (tying saves vocab x hidden parameters, a large share at this size).
TINY_PRESETS: dict[str, TinyPreset] = {
    # Tests only: a forward+backward of a few hundred tokens in milliseconds.
    "nano": TinyPreset(hidden=64, layers=2, heads=4, kv_heads=4, intermediate=176, max_positions=4096),
    # The shipped warm-start model.
    "tiny": TinyPreset(hidden=256, layers=4, heads=4, kv_heads=4, intermediate=688, max_positions=4096),
    # Wider and deeper: better per step, ~3x slower per step on a CPU.
    "small": TinyPreset(hidden=384, layers=6, heads=6, kv_heads=6, intermediate=1024, max_positions=4096),
}


def tiny_config(preset: str, vocab_size: int, *, bos_token_id: int = 1, eos_token_id: int = 2,
                pad_token_id: int = 0) -> LlamaConfig:
    """The ``LlamaConfig`` of a named preset (see ``TINY_PRESETS``)."""
    if preset not in TINY_PRESETS:
        raise ModelLoadError(f"unknown tiny preset {preset!r}: choose one of {', '.join(TINY_PRESETS)}")
    p = TINY_PRESETS[preset]
    return LlamaConfig(
        vocab_size=vocab_size, hidden_size=p.hidden, num_hidden_layers=p.layers,
        num_attention_heads=p.heads, num_key_value_heads=p.kv_heads,
        intermediate_size=p.intermediate, max_position_embeddings=p.max_positions,
        tie_word_embeddings=True, rms_norm_eps=1e-5, rope_theta=10000.0,
        bos_token_id=bos_token_id, eos_token_id=eos_token_id, pad_token_id=pad_token_id,
        attn_implementation="sdpa",  # fused scaled-dot-product attention, also on CPU
        use_cache=True,
    )


def make_tiny_model(preset: str, vocab_size: int, *, tokenizer=None, seed: int = 0,
                    gradient_checkpointing: bool = False) -> LlamaForCausalLM:
    """A freshly initialised tiny Llama (float32).  Pass ``tokenizer`` to copy its special ids."""
    ids = {}
    if tokenizer is not None:
        ids = dict(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                   pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(seed)   # the init draws from the global generator
    model = LlamaForCausalLM(tiny_config(preset, vocab_size, **ids))
    set_gradient_checkpointing(model, gradient_checkpointing)
    return model


# ---------------------------------------------------------------------------------------
# Stand-ins for the GPU tier: a randomly initialised Qwen2 of any shape, a ChatML tokenizer
# ---------------------------------------------------------------------------------------

# The ChatML layout of Qwen2.5-Instruct's template (system, user, then the assistant turn
# opened for generation), written here so that nothing is downloaded.
CHATML_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

# Qwen2.5-Instruct shapes (their config.json): hidden, layers, heads, kv heads, MLP width.
QWEN2_SHAPES = {
    "qwen2.5-0.5b": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, intermediate_size=4864, tie_word_embeddings=True),
    "qwen2.5-1.5b": dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, intermediate_size=8960, tie_word_embeddings=True),
    "qwen2.5-3b": dict(hidden_size=2048, num_hidden_layers=36, num_attention_heads=16,
                       num_key_value_heads=2, intermediate_size=11008, tie_word_embeddings=True),
    # Scaled down for tests: the same classes and grouped-query attention, 2 layers.
    "scaled-down": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, intermediate_size=128, tie_word_embeddings=True),
}
QWEN2_VOCAB = 151_936


def chatml_tokenizer(tokenizer):
    """A copy of ``tokenizer`` that behaves like an instruct tokenizer: ChatML markers
    ``<|im_start|>`` / ``<|im_end|>`` as special tokens, ``<|im_end|>`` as eos (as in
    Qwen2.5-Instruct) and a chat template, so `kk_prompt` takes the instruct path."""
    import copy as _copy
    tok = _copy.deepcopy(tokenizer)
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.eos_token = "<|im_end|>"
    tok.chat_template = CHATML_TEMPLATE
    return tok


def random_qwen2(tokenizer, shape: str = "scaled-down", vocab_size: int | None = None, seed: int = 0,
                 device=None, dtype: torch.dtype | None = None):
    """A randomly initialised ``Qwen2ForCausalLM`` of a named shape (QWEN2_SHAPES), with
    ``tokenizer``'s special ids. ``vocab_size`` may exceed the tokenizer (Qwen's 151,936
    rows, for realistic logits memory). At least 64 spare rows, rounded to a multiple of
    64, as Qwen2.5 has (151,936 rows for 151,665 tokens): loaded next to a Qwen2 config,
    transformers reads the tokenizer as a Qwen2 one, which adds ``<|endoftext|>``.
    ``device``, ``dtype`` (default: the CPU, float32): where and in which dtype the weights
    are created and initialised, as transformers' loader creates them: a GPU draws a 3B
    model's weights in about a second where a CPU's generator takes tens of seconds, and a
    bf16 model never holds a float32 copy. The values differ between devices (their
    generators differ), their distribution and the shapes do not."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    if shape not in QWEN2_SHAPES:
        raise ModelLoadError(f"unknown shape {shape!r}: choose one of {', '.join(QWEN2_SHAPES)}")
    rows = max(vocab_size or 0, -(-(len(tokenizer) + 64) // 64) * 64)
    cfg = Qwen2Config(vocab_size=rows, max_position_embeddings=8192,
                      bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                      pad_token_id=tokenizer.pad_token_id, attn_implementation="sdpa",
                      **QWEN2_SHAPES[shape])
    torch.manual_seed(seed)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype or torch.float32)      # what the parameters are created in
    try:
        with torch.device(device or "cpu"):
            return Qwen2ForCausalLM(cfg)
    finally:
        torch.set_default_dtype(default)


def count_parameters(model: torch.nn.Module) -> int:
    """Distinct parameters (a tied embedding counts once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def set_gradient_checkpointing(model, enabled: bool) -> None:
    """Switch gradient checkpointing: recompute each decoder layer's activations in the
    backward pass instead of keeping them, trading ~1 extra forward for memory.

    Non-reentrant checkpointing is used because it is exact (same gradients) and works
    when the inputs (token ids) do not require grad.
    """
    # transformers >= 5.x names it "activation checkpointing"; older versions only have
    # the gradient_checkpointing_* methods (deprecated since, same behaviour).
    if enabled:
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        # transformers also hooks the input embeddings to make their output require grad,
        # which only reentrant checkpointing needs (frozen embeddings under LoRA). Without
        # the hook the gradients are the same (tested), and the model stays free of hooks, so
        # the lean decode loop (decode.py, which refuses hooked models) still serves it.
        if getattr(model, "_require_grads_hook", None) is not None:
            model.disable_input_require_grads()
    elif hasattr(model, "activation_checkpointing_disable"):
        model.activation_checkpointing_disable()
    else:
        model.gradient_checkpointing_disable()


def is_gradient_checkpointing(model) -> bool:
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if hasattr(type(model), name):
            return bool(getattr(model, name))
    return False


# ---------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------

def default_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def default_dtype(device: torch.device | str) -> torch.dtype:
    """bf16 on a GPU (halves memory, native speed); float32 on a CPU, where bf16 matmuls
    are only fast under autocast and exact float32 log-probs keep the tests tight."""
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


def load_model_and_tokenizer(source: str, dtype: torch.dtype | None = None,
                             device: torch.device | str | None = None):
    """Load ``(model, tokenizer)`` from a local HF directory, a ``.gguf`` file or a hub id.

    - directory: must hold ``config.json`` plus weights, and a tokenizer; or a LoRA adapter
      folder (lora.save_adapter: ``adapter_config.json``, no ``config.json``): its base
      loaded, the adapter merged in (lora.load_adapter_folder);
    - ``*.gguf``: weights dequantized by transformers (needs the ``gguf`` package);
    - anything else that looks like ``owner/name``: a hub id (needs the network).

    The model is put in eval mode on ``device`` with ``dtype`` (defaults above), and the
    tokenizer is checked against the model (see ``check_tokenizer_matches``).
    """
    device = torch.device(device) if device is not None else default_device()
    dtype = dtype or default_dtype(device)
    kwargs: dict = {}
    if source.endswith(".gguf"):
        if not os.path.isfile(source):
            raise ModelLoadError(f"GGUF file not found: {source}: check the path "
                                 "(for SmolLM2 run `python scripts/fetch_smollm2.py`)")
        folder, kwargs["gguf_file"] = os.path.split(os.path.abspath(source))
        source = folder
    elif os.path.isdir(source):
        from .lora import is_adapter_folder, load_adapter_folder
        if is_adapter_folder(source):
            return load_adapter_folder(source, lambda base: load_model_and_tokenizer(base, dtype, device))
        if not os.path.isfile(os.path.join(source, "config.json")):
            raise ModelLoadError(f"{source} has no config.json: point at a folder written by "
                                 "save_pretrained (e.g. checkpoints/tiny-warm)")
    elif os.path.exists(source) or _looks_like_path(source):
        raise ModelLoadError(f"model path not found or not a model folder: {source}: check the "
                             "path, or run `python scripts/fetch_smollm2.py` for models/smollm2-135m-instruct")
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **kwargs)
    except ModelLoadError:
        raise
    except OSError as e:
        if os.path.exists(source):   # local files that transformers could not read
            raise ModelLoadError(f"cannot load {source} (corrupt or incomplete files?): {_first_line(e)} "
                                 "-- re-create it (save_pretrained, or re-run the fetch script)") from e
        raise ModelLoadError(f"cannot load {source}: {_first_line(e)} -- check the path or hub id "
                             "(offline, use a local folder)") from e
    except Exception as e:  # corrupt weights / config / gguf: name the file and the fix
        raise ModelLoadError(f"cannot load {source} (corrupt or incomplete files?): {_first_line(e)} "
                             "-- re-create it (save_pretrained, or re-run the fetch script)") from e
    _drop_gguf_quantizer(model)
    check_tokenizer_matches(model, tokenizer)
    if tokenizer.pad_token is None:
        # Some instruct tokenizers ship without pad; eos as pad is safe because our masks
        # come from lengths, not from comparing ids with pad (a known pitfall: pad == eos
        # must not mask the sampled EOS).
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    model.to(device).eval()
    return model, tokenizer


def _looks_like_path(s: str) -> bool:
    """True unless ``s`` can only be a hub id ("owner/name").  "checkpoints/x" whose first
    part is a local folder is a path (a missing one), not a hub id to look up online."""
    if s.startswith((".", "/", "~")) or s.count("/") != 1 or s.endswith((".json", ".safetensors", ".bin")):
        return True
    return os.path.isdir(s.split("/")[0])


def _first_line(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    return msg[0] if msg else type(e).__name__


def _drop_gguf_quantizer(model) -> None:
    """A model loaded from GGUF is already dequantized to ``dtype``, but transformers keeps
    a GGUF "quantizer" on it that refuses ``save_pretrained``.  Dropping it makes the model
    an ordinary float model (what it is), savable as safetensors."""
    if getattr(model, "hf_quantizer", None) is not None and \
            type(model.hf_quantizer).__name__.lower().startswith("gguf"):
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config


def check_tokenizer_matches(model, tokenizer) -> None:
    """A tokenizer that does not fit the model fails loudly here instead of producing
    garbage: every token id must index the embedding table."""
    n_emb = model.get_input_embeddings().weight.shape[0]
    if len(tokenizer) > n_emb:
        raise ModelLoadError(f"tokenizer has {len(tokenizer)} tokens but the model embeds only {n_emb}: "
                             "load the tokenizer saved with this model (same folder)")
    for name in ("eos_token_id", "bos_token_id"):
        tid = getattr(tokenizer, name)
        if tid is not None and tid >= n_emb:
            raise ModelLoadError(f"tokenizer {name}={tid} is outside the model's {n_emb} embeddings: "
                                 "load the tokenizer saved with this model (same folder)")


def is_instruct(tokenizer) -> bool:
    """An instruct model is one whose tokenizer carries a chat template."""
    return bool(getattr(tokenizer, "chat_template", None))


# ---------------------------------------------------------------------------------------
# Prompts
# ---------------------------------------------------------------------------------------

def kk_prompt(record: dict, tokenizer, style: str = "auto") -> str:
    """The K&K prompt text for ``record`` as this tokenizer's model expects it.

    style: ``"qwen"`` — the official system prompt and user turn through the tokenizer's
    chat template, then ``"<think>"`` (as in the paper's runs); ``"compact"`` — the tiny
    model's prompt (prompts.compact_prompt); ``"auto"`` — qwen if the tokenizer has a chat
    template, else compact.  Both end in ``"<think>"``.
    """
    if style == "auto":
        style = "qwen" if is_instruct(tokenizer) else "compact"
    if style == "compact":
        return prompts.compact_prompt(record["quiz"])
    if style != "qwen":
        raise ModelLoadError(f"unknown prompt style {style!r}: use 'qwen', 'compact' or 'auto'")
    if not is_instruct(tokenizer):
        raise ModelLoadError("this tokenizer has no chat template, so the instruct (qwen) prompt cannot "
                             "be built: use style='compact' for the tiny model, or an instruct model")
    # The official records' user turn is the quiz plus a newline (prompts.qwen_prompt); with
    # a ChatML template (Qwen2.5, SmolLM2) this reproduces their `prompt` field exactly.
    messages = [{"role": "system", "content": prompts.QWEN_SYSTEM},
                {"role": "user", "content": record["quiz"] + "\n"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return text + prompts.THINK_OPEN


def adds_bos(tokenizer) -> bool:
    """A chat-template prompt already holds its special tokens (Qwen has no bos); our tiny
    tokenizer's post-processor adds bos, which its model always saw at position 0."""
    return not is_instruct(tokenizer)


def encode_prompts(records: list[dict], tokenizer, style: str, max_len: int) -> tuple[list[dict], list[list[int]]]:
    """Prompt token ids (the tokenizer adds bos where its model expects it); prompts longer
    than max_len tokens are dropped. Returns (kept records, their ids)."""
    kept, ids = [], []
    for r in records:
        p = tokenizer(kk_prompt(r, tokenizer, style), add_special_tokens=adds_bos(tokenizer))["input_ids"]
        if len(p) <= max_len:
            kept.append(r)
            ids.append(p)
    return kept, ids
