"""Prompts and supervised target responses for K&K.

Design choices:

1. Both prompt styles end in "<think>", so that the model's response is what follows the
   opening think tag -- exactly the string the Logic-RL reward scores (reward.py).
2. `qwen_prompt(quiz)` is the prompt of the paper's runs (Yang et al. 2025, via Logic-RL):
   Qwen2.5-Instruct's ChatML chat template with Logic-RL's system message, already
   applied. It must be byte-identical to the `prompt` field of the official records (the
   tests check all 500), which is why the system message below is reproduced character
   for character, including its quirks ("and<answer>", the double space before "Now").
3. `compact_prompt(quiz)` is a plain prompt for the tiny model trained from scratch, which
   has no chat template: the quiz, a newline, "<think>".
4. `qwen_messages` gives the (system, user) contents for a chat template. All prompt
   functions accept the quiz text or a whole record.
5. `answer_block` and `target_response` build the supervised warm-start target that
   continues either prompt: an explanation (explain.py), "</think>", then the answer in
   the format the reward parses; prompt + target then scores 3 under
   reward.score_response.
"""
from __future__ import annotations

from . import explain

# Logic-RL's system message (must stay byte-exact; see the module docstring).
QWEN_SYSTEM = (
    "You are a helpful assistant. The assistant first thinks about the reasoning process in "
    "the mind and then provides the user with the answer. The reasoning process and answer "
    "are enclosed within <think> </think> and<answer> </answer> tags, respectively, i.e., "
    "<think> reasoning process here </think><answer> answer here </answer>.  Now the user "
    "asks you to solve a logical reasoning problem. After thinking, when you finally reach a "
    "conclusion, clearly state the identity of each character within <answer> </answer> "
    "tags. i.e., <answer> (1) Zoey is a knight\n(2) ... </answer>.\n"
)

THINK_OPEN = "<think>"


def _quiz(quiz_or_record) -> str:
    """Every prompt function takes the quiz text or a whole record."""
    return quiz_or_record["quiz"] if isinstance(quiz_or_record, dict) else quiz_or_record


def qwen_messages(quiz_or_record) -> tuple[str, str]:
    """(system, user) message contents.  Passed through Qwen2.5's chat template with a
    generation prompt and followed by "<think>", they give exactly `qwen_prompt`: in the
    official data each message's text ends with a newline before <|im_end|>."""
    return QWEN_SYSTEM, _quiz(quiz_or_record) + "\n"


def qwen_prompt(quiz_or_record) -> str:
    """ChatML: system turn, user turn (the quiz), and the opened assistant turn, which
    already starts thinking ("<think>")."""
    system, user = qwen_messages(quiz_or_record)
    return (
        "<|im_start|>system\n" + system + "<|im_end|>\n"
        "<|im_start|>user\n" + user + "<|im_end|>\n"
        "<|im_start|>assistant\n" + THINK_OPEN
    )


def compact_prompt(quiz_or_record) -> str:
    """Plain prompt for the tiny model: the quiz, then "<think>" on its own line."""
    return _quiz(quiz_or_record) + "\n" + THINK_OPEN


def answer_block(solution_text_format: str) -> str:
    """The end of a response: close the thinking, then the answer in the form the system
    message asks for ("<answer> (1) Zoey is a knight\\n(2) ... </answer>")."""
    return "</think>\n<answer> " + solution_text_format + " </answer>"


def target_response(record: dict, style: str = "compact") -> str:
    """The full supervised target that continues the prompt (which ends in "<think>"):
    "\\n" + explanation + "\\n" + answer_block.

    style="compact": explain.compact_explanation (for the tiny model, n = 3..5);
    style="backtracking": the official backtracking explanation (explain.backtracking_explanation)."""
    if style == "compact":
        text = explain.compact_explanation(record)
    elif style == "backtracking":
        text = explain.backtracking_explanation(record)
    else:
        raise ValueError(f"unknown style {style!r} (use 'compact' or 'backtracking')")
    return "\n" + text + "\n" + answer_block(record["solution_text_format"])
