"""K&K generator figures for the closing note (run: python benchmarks/kk_speed.py).

Prints, per n: puzzles per second on one core (sampling + uniqueness check only, and full
records with rendering, backtracking explanation and prompt), the share of candidate draws
rejected for non-uniqueness, and character lengths (mean / max) of the quiz and of the
compact explanation.  Single-threaded pure Python; numpy's RNG is the only native code.
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from lopti_minimal.task import dataset, explain, kk  # noqa: E402

COUNT = int(os.environ.get("KK_BENCH_COUNT", "1000"))


def main():
    exclude = kk.official_keys()
    total = 0.0
    print(f"{COUNT} puzzles per n, seed 0, official test puzzles excluded")
    print("n | puzzles/s (problems) | puzzles/s (records) | rejected non-unique | "
          "quiz chars mean/max | compact chars mean/max")
    for n in range(3, 8):
        stats = {}
        t = time.perf_counter()
        kk.generate_problems(n, COUNT, seed=0, exclude=exclude, stats=stats)
        t_prob = time.perf_counter() - t
        t = time.perf_counter()
        recs = dataset.generate_records(n, COUNT, seed=0, exclude=exclude)
        t_rec = time.perf_counter() - t
        total += t_rec
        quiz = [len(r["quiz"]) for r in recs]
        comp = [len(explain.compact_explanation(r)) for r in recs]
        print(f"{n} | {COUNT / t_prob:9.0f} | {COUNT / t_rec:9.0f} | "
              f"{stats['not_unique'] / stats['draws']:.1%} of {stats['draws']} draws | "
              f"{sum(quiz) / len(quiz):.0f} / {max(quiz)} | "
              f"{sum(comp) / len(comp):.0f} / {max(comp)}")
    print(f"all records for n = 3..7 ({5 * COUNT} puzzles): {total:.1f} s")


if __name__ == "__main__":
    main()
