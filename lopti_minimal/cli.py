"""Shared command-line pieces: a dataclass field that is also an option, and the parser.

Design choices:

1. One declaration per option: `option(default, "help")` is a dataclass field whose
   metadata carries the help (the `field(metadata={"help": ...})` idiom of TRL's configs);
   `add_options` turns a dataclass's fields into argparse options and `given` reads back
   the ones the user gave. `config.TrainConfig` (train.py) and
   `experiments.warmstart.WarmStartConfig` (python -m lopti_minimal.experiments.warmstart)
   are declared this way.
2. Every generated option defaults to None, meaning "not given": a preset's value (or the
   dataclass default) stands unless the user says otherwise. transformers'
   HfArgumentParser fills every option with the dataclass default instead, which would
   overwrite a preset; hence these few lines.
3. Import-free (argparse and dataclasses only), so `--help` and argument errors stay
   instant: the scripts import torch and transformers only after their arguments are checked.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys


class TrainError(ValueError):
    """Bad input: the command line prints it as one line and exits with code 2."""


def one_line_error(message: str):
    """argparse's errors as one line and exit code 2 (its default prints the usage too):
    ``parser.error = one_line_error``."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Show "(default: X)" only where argparse holds the default. Options left at None
    take their value from a preset or from the model (their help text says which), and
    store_true flags are off unless given, so "(default: None)" / "(default: False)"
    would only mislead."""

    def _get_help_string(self, action):
        if action.default in (None, False):
            return action.help
        return super()._get_help_string(action)


def option(default=None, help: str | None = None, *, flag: str | None = None, type=None,
           choices=None, factory=None):
    """A dataclass field that is also a command-line option (help=None: not an option).

    flag: the option's name when it is not ``--field-name`` (``--data`` for rl_data, or
    ``--no-eval`` for a switch that turns a True field off); type: how to parse the text
    (default: from the field's annotation); factory: a default_factory."""
    meta = {"help": help, "flag": flag, "type": type, "choices": choices}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


_TYPES = {"int": int, "float": float, "str": str}


def _parse_type(f: dataclasses.Field):
    if f.metadata.get("type") is not None:
        return f.metadata["type"]
    return _TYPES[f.type.split("|")[0].strip()]     # "float | None" -> float


def options(cls, only=None) -> list[dataclasses.Field]:
    """The fields of a dataclass that are command-line options (``only``: these names)."""
    return [f for f in dataclasses.fields(cls) if f.metadata.get("help") and (only is None or f.name in only)]


def add_options(parser, cls, shown: str = "default", only=None) -> None:
    """One option per field of ``cls`` declared with help (``only``: these fields). Each
    defaults to None ("not given"); the help ends with the dataclass default, labelled
    ``shown``."""
    for f in options(cls, only):
        help_ = f.metadata["help"]
        flag = f.metadata.get("flag") or "--" + f.name.replace("_", "-")
        if isinstance(f.default, bool):                  # a switch: turns the default around
            parser.add_argument(flag, dest=f.name, action="store_const", const=not f.default, help=help_)
            continue
        if f.default not in (None, dataclasses.MISSING, ()):          # () = none: nothing to show
            value = ",".join(map(str, f.default)) if isinstance(f.default, tuple) else f.default
            help_ = f"{help_} [{shown}: {value}]"
        choices = f.metadata.get("choices")
        parser.add_argument(flag, dest=f.name, type=_parse_type(f), choices=choices,
                            metavar=None if choices else f.name.upper(), help=help_)


def given(args: argparse.Namespace, cls, only=None) -> dict:
    """The fields of ``cls`` that the command line gave (None = not given)."""
    names = {f.name for f in options(cls, only)}
    return {k: v for k, v in vars(args).items() if k in names and v is not None}
