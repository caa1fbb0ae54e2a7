"""Shared command-line pieces of train.py, eval.py and python -m lopti_minimal.study.

Kept import-free (argparse only), so `--help` and argument errors stay instant: the
scripts import torch and transformers only after their arguments are checked.
"""
from __future__ import annotations

import argparse


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Show "(default: X)" only where argparse holds the default. Options left at None
    take their value from a preset or from the model (their help text says which), and
    store_true flags are off unless given, so "(default: None)" / "(default: False)"
    would only mislead."""

    def _get_help_string(self, action):
        if action.default in (None, False):
            return action.help
        return super()._get_help_string(action)
