"""The SmolLM2 RL presets: smollm2-kk4 is smollm2-kk on 4-person puzzles, and its budgets
hold what its comment in config.py says, measured in SmolLM2's own tokenizer (seconds, no
model is run)."""
import pytest
from conftest import ROOT

from lopti_minimal.config import PRESETS, make_config

# What 4 people change: the RL puzzles, the sampling budget, the official set and its budget;
# and, since each step samples longer responses, fewer steps with a checkpoint after each.
KK4_CHANGES = {"rl_sizes": (4,), "max_new_tokens": 1024, "eval_sizes": (4,), "eval_max_new_tokens": {4: 1024},
               "steps": 6, "save_every": 1}


def test_kk4_is_smollm2_kk_on_four_people_with_the_papers_method():
    kk3, kk4 = PRESETS["smollm2-kk"], PRESETS["smollm2-kk4"]
    assert {k: v for k, v in kk4.items() if kk3.get(k) != v} == KK4_CHANGES
    assert set(kk3) <= set(kk4)                      # nothing of smollm2-kk dropped
    c = make_config("smollm2-kk4")
    # No method in the preset: the paper's AR+Lopti with its K&K alpha and eta (config.METHODS)
    assert (c.method, c.alpha, c.eta, c.steps, c.preset) == ("ar_lopti", 0.3, 0.5, 6, "smollm2-kk4")
    assert "method" not in kk4


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(smollm2_dir)


def test_every_four_person_prompt_fits_and_the_budget_cuts_almost_no_faithful_trace(tokenizer):
    """No held-out or official 4-person prompt is dropped (the longest, 298 tokens, is well
    inside max_prompt_len), and at most 0.5% of the held-out puzzles' faithful compact traces
    (the warm start's targets, counted as the sampler counts them) exceed max_new_tokens,
    where 384 (smollm2-kk's) cuts off over 40%."""
    from lopti_minimal.experiments.lm_warmstart import encode
    from lopti_minimal.models import encode_prompts
    from lopti_minimal.task import kk
    cfg = make_config("smollm2-kk4")
    heldout = kk.load_jsonl(ROOT / "data/heldout4.jsonl")
    for records in (heldout, kk.load_official([4])):
        kept, ids = encode_prompts(records, tokenizer, cfg.prompt_style, cfg.max_prompt_len)
        assert len(kept) == len(records)
        assert 250 < max(map(len, ids)) <= 300      # the measured maximum: 298
    lengths = [len(ids) - p for ids, p in (encode(tokenizer, r, "compact") for r in heldout)]
    assert sum(n > cfg.max_new_tokens for n in lengths) / len(lengths) <= 0.005
    assert sum(n > make_config("smollm2-kk").max_new_tokens for n in lengths) / len(lengths) > 0.4
