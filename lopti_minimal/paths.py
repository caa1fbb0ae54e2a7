"""Where the files of a run live: in a source checkout, or in an installed copy (a wheel).

Design choices:

1. A checkout is the repository: the package's parent holds pyproject.toml. There the
   default run reads checkpoints/tiny-warm and data/kk_benchmark and writes runs/ and
   cache/ next to them.
2. An installed copy has no repository around it. The two read-only things the default
   run needs -- the shipped warm start and the official test sets (the paper's K&K
   metric) -- are copied into the wheel as lopti_minimal/_shipped/ (pyproject.toml,
   [tool.setuptools.package-dir]); what a run writes (runs/, cache/) goes under the
   current directory instead of site-packages.
3. Only the names in SHIPPED are redirected; any other relative path means what it says.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
CHECKOUT = PACKAGE.parent
# repository path -> its place in an installed copy
SHIPPED = {"checkpoints/tiny-warm": PACKAGE / "_shipped" / "tiny_warm",
           "data/kk_benchmark": PACKAGE / "_shipped" / "kk_benchmark"}


def in_checkout() -> bool:
    """True when running from the repository (not from an installed wheel)."""
    return (CHECKOUT / "pyproject.toml").is_file()


def work_root() -> Path:
    """The folder runs/ and cache/ are written under: the repository, or else the current
    directory (never site-packages)."""
    return CHECKOUT if in_checkout() else Path.cwd()


def shipped(rel: str) -> Path:
    """A file or folder the package ships ("checkpoints/tiny-warm", "data/kk_benchmark"),
    wherever this copy keeps it."""
    return CHECKOUT / rel if in_checkout() else SHIPPED[rel]


def resolve_model(src: str) -> str:
    """A model argument as given if it exists; a repository-relative path of the checkout
    (so the default works from any working directory); the shipped warm start in an
    installed copy. Anything else (a hub id, a missing path) is returned unchanged for the
    loader to report."""
    if os.path.isabs(src) or os.path.exists(src):
        return src
    if in_checkout() and (CHECKOUT / src).exists():
        return str(CHECKOUT / src)
    key = src.rstrip("/").removeprefix("./")
    if key in SHIPPED and not in_checkout() and SHIPPED[key].exists():
        return str(SHIPPED[key])
    return src


def swap_in(tmp, out) -> None:
    """Put the complete folder ``tmp`` at ``out``, replacing what is there with renames
    only: an interruption leaves the old folder or the new one (or out.old, never half)."""
    tmp, out = Path(tmp), Path(out)
    if out.exists():
        old = out.with_name(out.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(out, old)
        os.replace(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, out)
