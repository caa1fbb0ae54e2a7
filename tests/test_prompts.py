"""Prompts and supervised targets (lopti_minimal/task/prompts.py)."""
import pytest

from lopti_minimal.task import dataset, kk, prompts, reward

OFFICIAL = kk.load_official()


def test_qwen_prompt_byte_identical_for_all_official_records():
    for r in OFFICIAL:
        assert prompts.qwen_prompt(r["quiz"]) == r["prompt"]
        assert prompts.qwen_prompt(r).encode() == r["prompt"].encode()
        system, user = prompts.qwen_messages(r)
        chatml = (f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}"
                  "<|im_end|>\n<|im_start|>assistant\n<think>")
        assert chatml == r["prompt"]


def test_both_prompts_end_in_think():
    quiz = OFFICIAL[0]["quiz"]
    assert prompts.qwen_prompt(quiz).endswith("<think>")
    assert prompts.compact_prompt(quiz) == quiz + "\n<think>"
    assert prompts.compact_prompt(OFFICIAL[0]) == quiz + "\n<think>"


def test_answer_block_shape():
    block = prompts.answer_block("(1) A is a knight\n(2) B is a knave")
    assert block == "</think>\n<answer> (1) A is a knight\n(2) B is a knave </answer>"


@pytest.mark.parametrize("style", ["compact", "backtracking"])
def test_target_responses_score_3(style):
    records = OFFICIAL + dataset.generate_records(4, 30, seed=1)
    for r in records:
        resp = prompts.target_response(r, style=style)
        assert resp.startswith("\n") and resp.endswith(" </answer>")
        for strict in (False, True):
            res = reward.score_response(resp, r, strict=strict)
            assert res.total == 3 and res.correct and res.format_ok, (style, resp)


def test_target_response_rejects_unknown_style():
    with pytest.raises(ValueError):
        prompts.target_response(OFFICIAL[0], style="verbose")
