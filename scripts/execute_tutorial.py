"""Execute tutorial.ipynb and write it back with its outputs: the tutorial as a reader sees it.

    python scripts/execute_tutorial.py                  # 2 torch threads, tutorial.ipynb in place
    python scripts/execute_tutorial.py --threads 1 --out /tmp/tutorial-run.ipynb

Every cell runs once, in order, in a fresh python3 kernel of this interpreter (nbclient), with
the repository root as working directory, LOPTI_THREADS and OMP_NUM_THREADS set to --threads,
and section 6's training run written to a temporary folder (LOPTI_TUTORIAL_RUNS), removed
afterwards. A failing cell stops the script, and nothing is written. Before writing, the
notebook is made free of what belongs to one machine:

- the first cell's text between ``<!-- machine -->`` and ``<!-- /machine -->`` becomes one
  line saying on which CPU (its model name and core count), with how many threads, and with
  which Python, torch and transformers the outputs were made (the last cell prints the time);
- in every output, the temporary run folder becomes ``runs/tutorial``, the repository root
  ``.``, the interpreter's prefix ``<python>`` and the home folder ``~``; a path of one
  machine left after that (tests/test_docs.py's pattern: /tmp, /work, /home, /root, ...)
  stops the script with the offending lines;
- no execution timestamps in the cells' metadata, and the kernel's language info reduced
  to its name.

tests/test_tutorial.py checks the result: every code cell executed in order with outputs,
the figures, no errors, no machine path, and the mechanism cells' numbers (its
TUTORIAL_SUMMARY line) equal to a fresh execution's.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "tutorial.ipynb"
MACHINE_LINE = re.compile(r"(<!-- machine -->)(.*?)(<!-- /machine -->)", re.S)
# tests/test_docs.py's MACHINE_PATH: a home or scratch folder, a mount, a Windows drive
MACHINE_PATH = re.compile(r"(?<![\w.~-])/(?:work|home|root|Users|tmp|mnt|private|var/folders)/"
                          r"|(?<![\w])[A-Za-z]:\\")


def cpu_name() -> str:
    """The CPU's model name as lscpu shows it (/proc/cpuinfo), else what platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "an unknown CPU"


def machine_line(threads: int) -> str:
    v = importlib.metadata.version
    return (f"on {cpu_name()} ({os.cpu_count()} cores, {threads} torch thread{'s' * (threads != 1)}) with "
            f"Python {platform.python_version()}, torch {v('torch')} and transformers {v('transformers')}")


def replacements(run_root: Path) -> list[tuple[str, str]]:
    """(machine path, its stand-in), longest first, so a path inside another is replaced whole."""
    pairs = {str(run_root): "runs/tutorial", str(run_root.resolve()): "runs/tutorial",
             str(ROOT) + os.sep: "", str(ROOT): ".",
             sys.prefix: "<python>", sys.base_prefix: "<python>", os.path.expanduser("~"): "~"}
    return sorted(((k, v) for k, v in pairs.items() if k and k != os.sep), key=lambda kv: -len(kv[0]))


def _clean_text(text, subs):
    if isinstance(text, list):
        return [_clean_text(t, subs) for t in text]
    for old, new in subs:
        text = text.replace(old, new)
    return text


def strip_machine(nb, subs) -> list[str]:
    """Replace the machine paths in every output (in place); returns the lines where one remains."""
    left = []
    for i, cell in enumerate(nb.cells):
        cell.metadata.pop("execution", None)
        for out in cell.get("outputs", []):
            if "text" in out:
                out["text"] = _clean_text(out["text"], subs)
            if "traceback" in out:
                out["traceback"] = _clean_text(out["traceback"], subs)
            for mime, data in out.get("data", {}).items():
                if mime.startswith("text/") or mime == "application/json":
                    out["data"][mime] = _clean_text(data, subs)
            text = "".join(out.get("text", "")) + "".join("".join(d) for m, d in out.get("data", {}).items()
                                                          if m.startswith("text/"))
            left += [f"cell {i}: {line.strip()}" for line in text.splitlines() if MACHINE_PATH.search(line)]
    nb.metadata["language_info"] = {"name": "python"}
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    return left


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2, help="torch threads in the kernel (default 2)")
    ap.add_argument("--notebook", default=str(NOTEBOOK), help="the notebook to execute (default tutorial.ipynb)")
    ap.add_argument("--out", default=None, help="where to write it (default: back to --notebook)")
    ap.add_argument("--timeout", type=int, default=2400, help="seconds one cell may take (default 2400)")
    args = ap.parse_args(argv)

    nb = nbformat.read(args.notebook, as_version=4)
    if not MACHINE_LINE.search(nb.cells[0].source):
        print("the first cell has no <!-- machine --> ... <!-- /machine --> line to fill", file=sys.stderr)
        return 2
    run_root = Path(tempfile.mkdtemp(prefix="tutorial-runs-"))
    os.environ.update(LOPTI_THREADS=str(args.threads), OMP_NUM_THREADS=str(args.threads),
                      LOPTI_TUTORIAL_RUNS=str(run_root))
    client = NotebookClient(nb, timeout=args.timeout, startup_timeout=300, kernel_name="python3",
                            record_timing=False, resources={"metadata": {"path": str(ROOT)}})
    if client.has_trait("coalesce_streams"):      # one output per stream, not a piece per flush (nbclient >= 0.10.1)
        client.coalesce_streams = True
    t0 = time.perf_counter()
    try:
        client.execute()                  # raises CellExecutionError at the first failing cell
    finally:
        shutil.rmtree(run_root, ignore_errors=True)
    seconds = time.perf_counter() - t0

    left = strip_machine(nb, replacements(run_root))
    if left:
        print("outputs still name a path of this machine; nothing written:\n  " + "\n  ".join(left), file=sys.stderr)
        return 1
    line = machine_line(args.threads)
    nb.cells[0].source = MACHINE_LINE.sub(lambda m: m.group(1) + line + m.group(3), nb.cells[0].source)
    nbformat.validate(nb)
    out = args.out or args.notebook
    nbformat.write(nb, out)
    print(f"executed in {seconds / 60:.1f} min with {args.threads} thread(s); wrote {out}\n{line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
