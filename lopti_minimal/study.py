"""`python -m lopti_minimal.study ...`: command kept at its old path; the code lives in
lopti_minimal/experiments/study.py (the runner), with report.py and stats.py beside it."""
import sys

from lopti_minimal.experiments.study import command

if __name__ == "__main__":
    sys.exit(command())
