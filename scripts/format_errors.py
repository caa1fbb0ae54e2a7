"""What are a model's format errors?  Sorts the responses without a well-formed answer.

    python eval.py --model checkpoints/tiny-derive-stage1 --sizes 3 4 5 --save-responses --out /tmp/e.json
    python scripts/format_errors.py /tmp/e.responses.jsonl

For every response that scores -3 (reward.py: a tag missing or repeated; here always a
response cut at the length cap) it finds the first search line ("try ...") written a
second time and asks whether the node tried just before was all-knave ("=F" for everyone
in it): the last node of the depth-first search (explain.compact_trace), so the search had
run out of candidates.
"""
import argparse
import collections
import json


def classify(response: str) -> str:
    lines = response.split("\n")
    seen, tries = set(), []
    for line in lines:
        if line.startswith("try "):
            if line in seen:
                return "loop after the search ran out" if "=T" not in tries[-1] else "loop mid-search"
            seen.add(line)
            tries.append(line)
    return "no repeated node"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("responses", nargs="+", help="JSON Lines written by eval.py --save-responses")
    a = ap.parse_args(argv)
    counts = collections.Counter()
    for path in a.responses:
        for line in open(path):
            r = json.loads(line)
            if r["reward"] == -3:
                counts[(r["n_people"], classify(r["response"]))] += 1
    for (n, kind), c in sorted(counts.items()):
        print(f"{n} people: {c:3d}  {kind}")
    print(f"all: {sum(counts.values())} format errors")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
