"""The experiments built on the method: the warm start, the study, the diagnostics.

    warmstart.py         the supervised warm start of the tiny model, and the recipe of the
                         shipped checkpoints (python -m lopti_minimal.experiments.warmstart)
    warmstart_data.py    its data: the puzzle stream, target responses, bucketed batches
    grid.py              what the study compares: variants, grids, the paper's numbers
    study.py             the study runner: every (variant, seed) run, skip / resume / start,
                         equal budgets, one process or several
                         (python -m lopti_minimal.experiments.study)
    stats.py             Student-t intervals and paired differences (no scipy)
    declared.py          the ten-seed study's declared test: families, measures, margins
    aggregate.py         finished runs -> one JSON of tables
    report.py            that JSON -> docs/RESULTS.md (a row per arm), its full tables, figures
    findings.py          the report's opening: the declared test's findings and table
    mechanism_report.py  the mechanism's per-step metrics in the report
    diagnostics.py       the paper's Fig. 1 and Fig. 3 measurements on any model
                         (python -m lopti_minimal.experiments.diagnostics)
    diagnostic_plots.py  their figures

Design choices:

1. They import the core (lopti_minimal/*.py and lopti_minimal/task/), and the core never
   imports them (tests/test_public_api.py checks it).
"""
