"""Where does the warm start go wrong?  Teacher-forced token errors per kind of line.

    python scripts/teacher_forced_errors.py                      # shipped checkpoint, 40 + 40 puzzles
    python scripts/teacher_forced_errors.py --model DIR --sizes 3 4 5 --count 20

The model reads prompt + target response (the compact derivation of explain.py, then the
answer) in one forward pass; at every response position we compare its argmax with the
target token.  Each target token is attributed to the kind of line it sits on:

    claim   "  Amelia: not Evelyn (at Evelyn)"               restating the quiz
    try     "try Amelia=T Penelope=F"                        the search
    check   "  Amelia=T: not Evelyn=F = T ok"                testing a claim
    found   "found ..."                                      the solution line
    other   blank lines, tags, the answer block

Printed per size: tokens, wrong tokens and mean negative log-likelihood per kind, and in
how many puzzles the *first* wrong token lies on each kind (where greedy decoding would
first leave the target).
"""
import argparse
import collections
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from lopti_minimal.experiments import warmstart_data  # noqa: E402
from lopti_minimal.models import load_model_and_tokenizer  # noqa: E402
from lopti_minimal.task import kk  # noqa: E402
from lopti_minimal.task.explain import line_kind  # noqa: E402


def token_kinds(tokenizer, response_ids: list[int]) -> list[str]:
    """The kind of line of each response token (a newline token belongs to the line it ends).

    The vocabulary is byte-level BPE over ASCII K&K text, so each token decodes on its own
    and its newlines can be counted per token (one pass, not a decode per prefix)."""
    lines = tokenizer.decode(response_ids).split("\n")
    kinds, line_no = [], 0
    for tid in response_ids:
        kinds.append(line_kind(lines[min(line_no, len(lines) - 1)]))
        line_no += tokenizer.decode([tid]).count("\n")
    return kinds


@torch.no_grad()
def errors_for(model, tokenizer, records: list[dict]):
    """Per kind of line: response tokens, wrong argmax tokens, summed NLL, and the number of
    puzzles whose first wrong token lies on that kind."""
    tokens, wrong, nll, first = (collections.Counter() for _ in range(4))
    for r in records:
        ids, n_prompt = warmstart_data.encode_example(tokenizer, warmstart_data.default_prompt(r),
                                                      warmstart_data.default_response(r))
        x = torch.tensor([ids])
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(x).logits.float()[0, n_prompt - 1:-1]    # predictions of the response
        target = x[0, n_prompt:]
        token_nll = -torch.log_softmax(logits, -1).gather(-1, target[:, None])[:, 0]
        is_wrong = (logits.argmax(-1) != target).tolist()
        kinds = token_kinds(tokenizer, ids[n_prompt:])
        for kind, bad, loss in zip(kinds, is_wrong, token_nll.tolist()):
            tokens[kind] += 1
            nll[kind] += loss
            wrong[kind] += bad
        if any(is_wrong):
            first[kinds[is_wrong.index(True)]] += 1
    return tokens, wrong, nll, first


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="checkpoints/tiny-warm")
    ap.add_argument("--sizes", type=int, nargs="+", default=[3, 4])
    ap.add_argument("--count", type=int, default=40, help="official puzzles per size (the first ones)")
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    model, tokenizer = load_model_and_tokenizer(a.model, dtype=torch.float32, device="cpu")
    model.eval()
    for n in a.sizes:
        tokens, wrong, nll, first = errors_for(model, tokenizer, kk.load_official([n])[:a.count])
        print(f"{n} people, {a.count} official puzzles (first wrong token in: "
              + ", ".join(f"{k} {v}" for k, v in first.items()) + ")")
        for kind in ("claim", "try", "check", "found", "other"):
            if tokens[kind]:
                print(f"  {kind:6s} {tokens[kind]:6d} tokens  {wrong[kind] / tokens[kind]:6.1%} wrong  "
                      f"nll {nll[kind] / tokens[kind]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
