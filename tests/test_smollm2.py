"""The pretrained tier, offline: SmolLM2-135M-Instruct, fetched once (the `smollm2_dir`
fixture runs scripts/fetch_smollm2.py when models/ lacks it), loads in seconds, builds
the official prompt through its chat template, attempts a K&K answer, and yields per-token
log-probs; its GGUF original loads through the same loader with the same weights."""
import os
import time

import pytest
import torch
from conftest import ROOT

from lopti_minimal.batch import position_ids_from_mask
from lopti_minimal.models import is_instruct, kk_prompt, load_model_and_tokenizer
from lopti_minimal.sampling import sample_groups
from lopti_minimal.task import kk, reward

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def teacher_forced_logprobs(model, input_ids, attention_mask, prompt_len):
    """log pi(o_t) of every response token, recomputed by one forward pass."""
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=attention_mask,
                       position_ids=position_ids_from_mask(attention_mask)).logits
    R = input_ids.shape[1] - prompt_len
    lp = torch.log_softmax(logits[:, prompt_len - 1:prompt_len - 1 + R].float(), -1)
    return lp.gather(-1, input_ids[:, prompt_len:].unsqueeze(-1)).squeeze(-1)


def test_smollm2_answers_with_the_official_prompt_and_gives_logprobs(smollm2_dir):
    t0 = time.time()
    model, tok = load_model_and_tokenizer(smollm2_dir, device="cpu")
    assert time.time() - t0 < 30          # converted safetensors: no dequantization
    assert model.dtype == torch.float32 and model.config.model_type == "llama"
    assert is_instruct(tok)

    record = kk.load_official([3])[0]
    prompt = kk_prompt(record, tok)        # auto: instruct -> chat template
    assert prompt == record["prompt"]      # byte-identical to the paper's prompt
    ids = tok(prompt)["input_ids"]
    roll = sample_groups(model, [ids], group_size=1, max_new_tokens=48, greedy=True,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    n = int(roll.response_mask.sum())
    text = tok.decode(roll.response_ids[0, :n].tolist(), skip_special_tokens=True)
    assert len(text.strip()) > 0
    result = reward.score_response(text, record)
    assert result.total in (3, -0.5, -1, -3)

    lp = teacher_forced_logprobs(model, roll.input_ids, roll.attention_mask, roll.prompt_len)[0, :n]
    assert torch.isfinite(lp).all() and (lp <= 0).all()
    torch.testing.assert_close(lp, roll.old_logprobs[0, :n], rtol=1e-4, atol=1e-4)
    # Greedy tokens are the argmax, so each has probability at least 1/V and usually far more.
    assert lp.exp().mean() > 0.2


def test_gguf_loads_through_the_same_loader_with_the_same_weights(smollm2_dir):
    a, tok_a = load_model_and_tokenizer(os.path.join(smollm2_dir, GGUF_NAME), device="cpu")
    b, tok_b = load_model_and_tokenizer(smollm2_dir, device="cpu")
    text = "A very special island is inhabited only by knights and knaves."
    assert tok_a(text)["input_ids"] == tok_b(text)["input_ids"]
    ids = tok_b(text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(a(ids).logits, b(ids).logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("folder, marker", [("smollm2-kk-sft-compact", "\ntry "),
                                            ("smollm2-kk-sft-compact-396", "\ntry "),
                                            ("smollm2-kk-sft", "Let's think step by step")])
def test_shipped_adapter_answers_in_the_rewards_format(smollm2_dir, folder, marker):
    """Each shipped adapter (experiments/lm_warmstart.py: a 4.9 MB LoRA adapter; the compact
    trace after 250 and 396 steps, and the official backtracking text) loads as SmolLM2 with the adapter merged, and
    where SmolLM2 alone writes no format-valid response (results/smollm2-probe), it answers
    in the reward's format in its own chain of thought (the compact search's "try" lines,
    or the official opening), </think>, then one role per person (greedy, 3 held-out
    puzzles; 400 of 400 format-valid in results/smollm2-kk-compact/start/ and
    results/smollm2-sft/, 389 in results/smollm2-kk-compact/pilot-sft-s0-146steps/)."""
    from lopti_minimal.task.evaluate import read_records
    model, tok = load_model_and_tokenizer(str(ROOT / "checkpoints" / folder), device="cpu")
    records = read_records(str(ROOT / "data" / "heldout3.jsonl"))[:3]
    ids = [tok(kk_prompt(r, tok), add_special_tokens=False)["input_ids"] for r in records]
    roll = sample_groups(model, ids, group_size=1, max_new_tokens=384, greedy=True,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    for b, r in enumerate(records):
        n = int(roll.response_mask[b].sum())
        text = tok.decode(roll.response_ids[b, :n].tolist(), skip_special_tokens=True)
        assert marker in text, text
        assert reward.score_response(text, r).format_ok, text
