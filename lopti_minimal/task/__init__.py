"""The task: Knights & Knaves (K&K) logic puzzles, as the paper trains and tests on them.

    kk.py          the puzzles: statement grammar, solver, the official sampler and
                   renderer, JSON Lines I/O, the official 3..7-person test sets
    explain.py     explanations of a solution: the official backtracking trace and the
                   compact trace the tiny model learns
    prompts.py     the paper's Qwen prompt, the tiny model's compact prompt, and the
                   supervised target (explanation + answer)
    dataset.py     full records (puzzle + explanation + prompt), and the generator
                   command `python -m lopti_minimal.task.dataset`
    phrasing.py    free rewordings of a target (the warm start's phrased derivations)
    behaviours.py  guess vs derive: the two behaviours of the warm start, and how a
                   response is classified
    reward.py      the Logic-RL reward: 3 right, -0.5 wrong, -1 unparseable, -3 bad format
    evaluate.py    the evaluation rule: greedy accuracy per size (a response is right
                   iff it scores 3), the failure modes, the report

Design choices:

1. The paper's task (Yang et al. 2025, arXiv 2505.12929; the puzzles of Xie et al. 2024,
   the reward of Logic-RL). Everything the RL code needs to know about the task lives
   here: its data, its prompts, its reward and its evaluation rule.
2. Dependencies run one way: kk <- explain <- prompts <- dataset, and reward depends on
   nothing here. This __init__ imports nothing, so `from lopti_minimal.task import kk`
   stays as cheap as kk itself.
"""
