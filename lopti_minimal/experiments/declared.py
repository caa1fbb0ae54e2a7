"""The study's declared test: what the ten-seed study asks, decided before its new seeds ran.

docs/STUDY.md ("The declared test") states it in words; this module holds the same choices
as constants, so the report (report.py) and the power statement (scripts/study_power.py)
read one definition.

Design choices:

1. Two families of four comparisons, each an arm minus its twin, paired by seed. The primary
   family asks what carries Lopti's head start over GRPO (Lopti alone, eta 0.4, the
   paper's Lopti-only K&K setting): its second optimizer step (Lopti - GRPO x2), its
   criterion (a random split of the same size - Lopti), its order (high first - Lopti),
   its shared optimizer state (a state per stage - Lopti). The secondary family asks the
   same of AR+Lopti (alpha 0.3, eta 0.5): reported with the same test, its own Holm.
2. Measures: steps to 80% derivations and the derivation-share area (its continuous
   twin; aggregate.selection) are primary; final held-out accuracy (400 puzzles) is
   secondary. Holm runs over a family's comparisons x primary measures (8 tests); the
   secondary measure gets its own Holm over the 4 comparisons.
3. The test: exact paired sign-flip p (stats.sign_flip_p), Holm-adjusted; equivalence by
   two one-sided sign-flip tests within MARGINS, Holm-adjusted the same way; the verdict
   "different", "equivalent" or "undetermined" at ALPHA (stats.verdict).
4. Margins (one per measure, chosen from the five-seed spreads with the power statement
   in docs/STUDY.md): 2 steps, 0.04 of derivation area, 0.05 of held-out accuracy.
"""
from __future__ import annotations

from .grid import (AR_LOPTI, AR_LOPTI_HIGH, AR_LOPTI_PER_STAGE, AR_LOPTI_RANDOM, GRPO_X2, LOPTI,
                   LOPTI_HIGH, LOPTI_PER_STAGE, LOPTI_RANDOM)

ALPHA = 0.05
SEEDS = 10                        # the declared sample: seeds 0-9 of every arm below
PRIMARY = ((LOPTI, GRPO_X2), (LOPTI_RANDOM, LOPTI), (LOPTI_HIGH, LOPTI), (LOPTI_PER_STAGE, LOPTI))
SECONDARY = ((AR_LOPTI, GRPO_X2), (AR_LOPTI_RANDOM, AR_LOPTI), (AR_LOPTI_HIGH, AR_LOPTI),
             (AR_LOPTI_PER_STAGE, AR_LOPTI))
FAMILIES = {"primary": PRIMARY, "secondary": SECONDARY}
# aggregate.selection's keys and the held-out accuracy; primary measures share one Holm
PRIMARY_MEASURES = ("steps_to_80", "derive_auc")
SECONDARY_MEASURES = ("heldout",)
MARGINS = {"steps_to_80": 2.0, "derive_auc": 0.04, "heldout": 0.05}
MEASURE_WORDS = {"steps_to_80": "steps to 80% derivations", "derive_auc": "derivation-share area",
                 "heldout": "final held-out accuracy"}
