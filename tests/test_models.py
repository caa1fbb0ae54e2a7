"""Models: tiny presets, the loader, gradient checkpointing
on both tiers, dtype/device defaults and one-line errors for bad input."""

import pytest
import torch

from lopti_minimal import models
from lopti_minimal.task import kk, prompts
from lopti_minimal.models import (TINY_PRESETS, ModelLoadError, count_parameters, kk_prompt,
                                  load_model_and_tokenizer, make_tiny_model,
                                  set_gradient_checkpointing)



def _one_line_error(fn, *words):
    with pytest.raises(ModelLoadError) as e:
        fn()
    msg = str(e.value)
    assert "\n" not in msg, msg
    for w in words:
        assert w in msg, msg
    return msg


def test_presets_are_llama_sdpa_tied_and_ordered(kk_tokenizer):
    sizes = []
    for name in TINY_PRESETS:
        m = make_tiny_model(name, len(kk_tokenizer), tokenizer=kk_tokenizer)
        assert m.config.model_type == "llama" and m.config.tie_word_embeddings
        assert m.config._attn_implementation == "sdpa"
        assert m.get_input_embeddings().weight is m.get_output_embeddings().weight
        assert m.config.eos_token_id == kk_tokenizer.eos_token_id
        assert m.config.pad_token_id == kk_tokenizer.pad_token_id
        sizes.append(count_parameters(m))
    assert sizes == sorted(sizes) and sizes[0] < 500_000 and 1_000_000 < sizes[1] < 20_000_000


def test_make_tiny_model_is_deterministic_for_a_seed():
    a, b = make_tiny_model("nano", 100, seed=3), make_tiny_model("nano", 100, seed=3)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))


def _grads(model, ids, mask, checkpointing):
    set_gradient_checkpointing(model, checkpointing)
    model.train()   # checkpointing is active only in training mode
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
                                             ids[:, 1:].reshape(-1))
    loss.backward()
    out = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    set_gradient_checkpointing(model, False)
    return loss.item(), out


def _assert_same_grads(model, ids, mask, rtol, atol):
    l0, g0 = _grads(model, ids, mask, False)
    l1, g1 = _grads(model, ids, mask, True)
    assert l0 == pytest.approx(l1, rel=1e-6)
    assert g0.keys() == g1.keys() and len(g0) > 0
    for k in g0:
        torch.testing.assert_close(g1[k], g0[k], rtol=rtol, atol=atol, msg=k)


def test_gradient_checkpointing_same_gradients_tiny(kk_tokenizer):
    model = make_tiny_model("nano", len(kk_tokenizer), tokenizer=kk_tokenizer, seed=1)
    r = kk.load_official([3])[0]
    enc = kk_tokenizer([prompts.compact_prompt(r["quiz"]), "Amelia: not Evelyn"],
                       return_tensors="pt", padding=True)
    assert model.supports_gradient_checkpointing
    _assert_same_grads(model, enc["input_ids"], enc["attention_mask"], rtol=1e-5, atol=1e-7)


def test_gradient_checkpointing_same_gradients_smollm2(smollm2_dir):
    model, tok = load_model_and_tokenizer(smollm2_dir, device="cpu")
    r = kk.load_official([3])[0]
    enc = tok([r["quiz"][:200], r["quiz"][-150:]], return_tensors="pt", padding=True)
    _assert_same_grads(model, enc["input_ids"], enc["attention_mask"], rtol=1e-4, atol=1e-6)


def test_checkpointing_switch_and_no_side_effect_on_eval(kk_tokenizer):
    model = make_tiny_model("nano", len(kk_tokenizer), gradient_checkpointing=True)
    assert models.is_gradient_checkpointing(model)
    set_gradient_checkpointing(model, False)
    assert not models.is_gradient_checkpointing(model)


def test_save_and_load_tiny_round_trip(kk_tokenizer, tmp_path):
    model = make_tiny_model("nano", len(kk_tokenizer), tokenizer=kk_tokenizer, seed=2).eval()
    model.save_pretrained(tmp_path)
    kk_tokenizer.save_pretrained(tmp_path)
    loaded, tok = load_model_and_tokenizer(str(tmp_path))
    assert loaded.dtype == torch.float32 and loaded.device.type == "cpu" and not loaded.training
    ids = tok("Amelia is a knight", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits)


def test_dtype_and_device_defaults():
    assert models.default_dtype("cpu") == torch.float32
    assert models.default_dtype("cuda") == torch.bfloat16
    assert models.default_device().type == ("cuda" if torch.cuda.is_available() else "cpu")


def test_prompt_styles(kk_tokenizer):
    r = kk.load_official([3])[0]
    assert kk_prompt(r, kk_tokenizer) == prompts.compact_prompt(r["quiz"])   # auto: no template
    assert kk_prompt(r, kk_tokenizer).endswith("<think>")
    _one_line_error(lambda: kk_prompt(r, kk_tokenizer, "qwen"), "chat template", "compact")
    _one_line_error(lambda: kk_prompt(r, kk_tokenizer, "fancy"), "qwen")


# --- bad input: one line that names the fix ---------------------------------------------

def test_missing_path(tmp_path):
    _one_line_error(lambda: load_model_and_tokenizer(str(tmp_path / "missing")), "not found")
    _one_line_error(lambda: load_model_and_tokenizer("tests/no-such-model"), "not found")
    _one_line_error(lambda: load_model_and_tokenizer("/nowhere/model.gguf"), "fetch_smollm2")


def test_folder_without_config(tmp_path):
    _one_line_error(lambda: load_model_and_tokenizer(str(tmp_path)), "config.json", "save_pretrained")


def test_corrupt_weights(kk_tokenizer, tmp_path):
    make_tiny_model("nano", len(kk_tokenizer), tokenizer=kk_tokenizer).save_pretrained(tmp_path)
    kk_tokenizer.save_pretrained(tmp_path)
    with open(tmp_path / "model.safetensors", "wb") as f:
        f.write(b"this is not a safetensors file")
    _one_line_error(lambda: load_model_and_tokenizer(str(tmp_path)), "corrupt", "re-create")


def test_corrupt_config(kk_tokenizer, tmp_path):
    make_tiny_model("nano", len(kk_tokenizer), tokenizer=kk_tokenizer).save_pretrained(tmp_path)
    kk_tokenizer.save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text("{ not json")
    _one_line_error(lambda: load_model_and_tokenizer(str(tmp_path)), "re-create")


def test_corrupt_gguf(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    _one_line_error(lambda: load_model_and_tokenizer(str(bad)), "re-create")


def test_tokenizer_not_matching_model(kk_tokenizer, tmp_path):
    # A model with a 200-entry vocabulary saved next to the 700+-entry K&K tokenizer.
    make_tiny_model("nano", 200).save_pretrained(tmp_path)
    kk_tokenizer.save_pretrained(tmp_path)
    _one_line_error(lambda: load_model_and_tokenizer(str(tmp_path)), "tokenizer", "same folder")


def test_unknown_preset():
    with pytest.raises(ModelLoadError, match="nano"):
        make_tiny_model("huge", 100)


def test_the_vocabulary_size_the_docstrings_state_is_the_shipped_one():
    """models.py and tokenizer.py state the shipped tokenizer's size as a number; it is the
    one every shipped checkpoint has (config.json and the tokenizer itself), and the tiny
    preset's parameter count follows from it."""
    import json
    import re
    from pathlib import Path
    from transformers import AutoTokenizer
    root = Path(models.__file__).resolve().parent
    stated = {int(re.search(r"vocabulary of ([\d,]+) entries", (root / "models.py").read_text()).group(1)
                  .replace(",", "")),
              int(re.search(r"([\d,]+)\s+entries for the shipped tokenizer", (root / "tokenizer.py").read_text())
                  .group(1).replace(",", ""))}
    assert len(stated) == 1
    (n,) = stated
    shipped = root.parent / "checkpoints" / "tiny-warm"
    assert json.loads((shipped / "config.json").read_text())["vocab_size"] == n
    assert len(AutoTokenizer.from_pretrained(shipped)) == n
    for cfg in sorted(root.parent.glob("checkpoints/*/config.json")):
        assert json.loads(cfg.read_text())["vocab_size"] == n, cfg
    assert count_parameters(models.make_tiny_model("tiny", n)) == 3_361_792
