"""The generator CLI: python -m lopti_minimal.task.dataset ... (exit code 2 + one-line errors)."""
import os
import subprocess
import sys

from conftest import ROOT
from lopti_minimal.task import dataset, kk



def run(args, capsys):
    code = dataset.main(args + ["--no-progress"])
    return code, capsys.readouterr().err


def test_generates_file_and_refuses_overwrite(tmp_path, capsys):
    out = tmp_path / "train.jsonl"
    code, _ = run(["--n-people", "3", "--count", "25", "--seed", "0", "--out", str(out)], capsys)
    assert code == 0
    recs = kk.load_jsonl(out)
    assert len(recs) == 25 and all(tuple(r) == kk.RECORD_FIELDS for r in recs)
    assert kk.disjoint(recs, kk.load_official())
    assert recs == dataset.generate_records(3, 25, seed=0, exclude=kk.official_keys())
    code, err = run(["--n-people", "3", "--count", "5", "--out", str(out)], capsys)
    assert code == 2 and "exists" in err and len(err.strip().splitlines()) == 1
    assert len(kk.load_jsonl(out)) == 25  # untouched
    code, _ = run(["--n-people", "3", "--count", "5", "--out", str(out), "--force"], capsys)
    assert code == 0 and len(kk.load_jsonl(out)) == 5


def test_exclude_file(tmp_path, capsys):
    first = tmp_path / "a.jsonl"
    second = tmp_path / "b.jsonl"
    assert run(["--n-people", "3", "--count", "30", "--seed", "1", "--out", str(first)],
               capsys)[0] == 0
    code, _ = run(["--n-people", "3", "--count", "30", "--seed", "1", "--out", str(second),
                   "--exclude", str(first)], capsys)
    assert code == 0
    assert kk.disjoint(kk.load_jsonl(first), kk.load_jsonl(second))


def test_errors_exit_2_with_one_line(tmp_path, capsys):
    out = str(tmp_path / "x.jsonl")
    junk = tmp_path / "junk.jsonl"
    junk.write_text("not json\n")
    cases = [
        (["--n-people", "1", "--count", "5", "--out", out], "at least 2"),
        (["--n-people", "2", "--count", "1000000", "--out", out], "at most"),
        (["--n-people", "2", "--count", "800", "--out", out], "consecutive"),
        (["--n-people", "3", "--count", "5", "--out", out, "--exclude",
          str(tmp_path / "missing.jsonl")], "cannot read"),
        (["--n-people", "3", "--count", "5", "--out", out, "--exclude", str(junk)],
         "cannot read"),
        (["--n-people", "3", "--count", "0", "--out", out], "at least 1"),
    ]
    for args, needle in cases:
        code, err = run(args, capsys)
        assert code == 2, args
        assert needle in err and len(err.strip().splitlines()) == 1, err
        assert not os.path.exists(out)


def test_module_entry_point(tmp_path):
    out = tmp_path / "t.jsonl"
    p = subprocess.run([sys.executable, "-m", "lopti_minimal.task.dataset", "--n-people", "4",
                        "--count", "3", "--out", str(out)], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert len(kk.load_jsonl(out)) == 3
    p = subprocess.run([sys.executable, "-m", "lopti_minimal.task.dataset", "--n-people", "0",
                        "--count", "3", "--out", str(out)], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2 and p.stderr.startswith("error: ")
