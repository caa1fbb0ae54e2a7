"""`python -m lopti_minimal.kk ...`: command kept at its old path; the code lives in
lopti_minimal/task/dataset.py (the generator itself in lopti_minimal/task/kk.py)."""
import sys

from lopti_minimal.task.dataset import main

if __name__ == "__main__":
    sys.exit(main())
