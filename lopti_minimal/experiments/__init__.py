"""The experiments built on the method: the study, its statistics and report, the diagnostics.

    grid.py              what the study compares: variants, grids, the paper's numbers
    study.py             the study runner: every (variant, seed) run, skip / resume / start,
                         equal budgets, one process or several (python -m lopti_minimal.study)
    stats.py             Student-t intervals and paired differences (no scipy)
    report.py            finished runs -> tables, figures and docs/RESULTS.md
    diagnostics.py       the paper's Fig. 1 and Fig. 3 measurements on any model
                         (python -m lopti_minimal.diagnostics)
    diagnostic_plots.py  their figures

Design choices:

1. They import the core (lopti_minimal/*.py and lopti_minimal/task/), and the core never
   imports them.
"""
