"""`python -m lopti_minimal.diagnostics ...`: command kept at its old path; the code lives
in lopti_minimal/experiments/diagnostics.py."""
import sys

from lopti_minimal.experiments.diagnostics import main

if __name__ == "__main__":
    sys.exit(main())
