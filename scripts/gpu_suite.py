"""The GPU measurements in one command, within one time budget, for a machine with one
NVIDIA GPU lent for a few minutes. From the repository root:

    python3 scripts/gpu_suite.py               # on the GPU machine: the figures under $OUT
    python3 scripts/gpu_suite.py --cpu-smoke   # the same parts on a CPU at toy sizes (a dry run)

torchao (the 8-bit AdamW of the 1.5B/3B presets) can travel as a wheel in .whl/: the suite
installs what is there into /tmp/site with --no-deps (torchao alone: the machine's torch
stays) and puts it first on the parts' PYTHONPATH.

It writes under $OUT (default runs/gpu-suite), each file rewritten as each part ends, so a
suite stopped from outside keeps what finished:

    gpu_suite.json            the machine, each part's status and seconds, its figures
    gpu_suite.log             every part's output, each line tagged with its part and time
    pytest-cuda.xml           the CUDA tests' JUnit report
    tiny-cuda-metrics.jsonl   the default tiny run's per-step metrics

The parts, in the order they run, each under its own `timeout` and all within one budget
(SUITE_BUDGET_S, default 360 s; a part is skipped when less than its minimum is left).
Times on an H200, where a process starts in ~8 s, decoding through transformers' forward
is launch-bound, and the first step of torchao's 8-bit AdamW compiles its kernels (~30 s):

  phase 1, side by side (pass/fail checks, and the tiny run, the one figure taken beside
  other work: its JSON says which of its steps ran alone):
    env       the GPU, driver, versions, whether torchao imports                ~10 s
    tests     pytest -m cuda: the CUDA variants of the device tests (27)        ~40 s  (cap 120)
    ci        train.py --preset ci --device cuda                                ~30 s  (cap 90)
    tiny      train.py --device cuda --no-eval: the default run's 20 steps      ~85 s  (cap 150)
  phase 2, side by side as well, random weights of the real shapes
  (scripts/gpu_check.py, one step each, one rollout chunk). Measured on an H200
  (results/gpu/): decoding through transformers' forward took 106-139 ms per token
  for 24-36 layers with the four checks side by side, so one at a time, at 512 or
  4,096 new tokens, they did not fit a lease; each process's peak memory is its own,
  so side by side they are measured as alone (their seconds are not):
    3b-lora   qwen2.5-3b --lora-rank 16, 128 new tokens                       ~70 s
    0.5b      qwen2.5-0.5b, 256 new tokens (16 prompts x 8)                    ~70 s
    1.5b      qwen2.5-1.5b, 128 new tokens                                     ~70 s
    3b        qwen2.5-3b, 128 new tokens                                       ~70 s
                                                                               (caps 240)
  then the combined gpu_suite.json                                              ~1 s
  In all about 4 minutes (measured: 87 s for phase 2 and ~85 s for phase 1 side by side
  once cuDNN attention was off).

Short sequences: a random model never samples EOS, so every response runs to the budget,
and 4,096 new tokens would take 7-9 minutes to decode. Each check's estimate is computed
for the sequence it ran, so the measured peaks check gpu_memory.memory_estimate_gb, which
gives the 4,096-token figures.
"""
from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path
from xml.etree import ElementTree

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable or "python3"
TEST_FILES = ["tests/test_precision.py", "tests/test_sampling.py", "tests/test_grpo.py",
              "tests/test_lopti.py", "tests/test_gpu_presets.py"]
# The CPU figure beside which the tiny run's is read: the README's default run, seed 0 (2 cores).
CPU_REFERENCE = ROOT / "results" / "rl-default-fixed" / "tiny-warm-s0" / "metrics.jsonl"
LOG_LIMIT = 12 << 20           # bytes of gpu_suite.log (files come back up to 16 MiB)
RESERVE_S = 8                  # kept for the final JSON


# ---------------------------------------------------------------------------------------
# The parts
# ---------------------------------------------------------------------------------------

def parts(smoke: bool, work: Path, out: Path) -> tuple[list[dict], list[dict]]:
    """(phase 1, phase 2): each part a dict of its name, command, cap and minimum seconds;
    run folders and the checks' JSON go to ``work``, the JUnit report to ``out``.
    --cpu-smoke: device cpu and toy sizes, the same commands otherwise."""
    dev = "cpu" if smoke else "cuda"
    tests = [PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", *TEST_FILES, f"--junitxml={out / 'pytest-cuda.xml'}"]
    # On a CPU there are no cuda variants: the smoke run takes two cpu ones instead.
    tests += ["-k", "test_split_partitions_valid_tokens or test_group_major_layout_and_determinism"] if smoke \
        else ["-m", "cuda"]
    train = [PY, "train.py", "--device", dev, "--no-progress"]
    tiny = train + ["--no-eval", "--no-plots", "--run-dir", str(work / "tiny")]
    tiny += ["--steps", "2", "--prompts-per-step", "2", "--max-new-tokens", "48"] if smoke else ["--steps", "20"]
    phase1 = [
        dict(name="env", cmd=[PY, "scripts/gpu_suite.py", "--probe", str(work / "env.json")], cap=60, minimum=10),
        dict(name="tests", cmd=tests, cap=120, minimum=30),
        dict(name="ci", cmd=train + ["--preset", "ci", "--run-dir", str(work / "ci")], cap=90, minimum=20),
        dict(name="tiny", cmd=tiny, cap=150, minimum=30),
    ]
    checks = [  # name, preset, new tokens, steps, extra arguments, cap (the module docstring says why)
        ("3b-lora", "qwen2.5-3b", 128, 1, ["--lora-rank", "16"], 240),
        ("0.5b", "qwen2.5-0.5b", 256, 1, [], 240),
        ("1.5b", "qwen2.5-1.5b", 128, 1, [], 240),
        ("3b", "qwen2.5-3b", 128, 1, [], 240),
    ]
    phase2 = []
    for name, preset, new, steps, extra, cap in checks:
        # toy sizes for the smoke run: the smallest shape, one prompt, a few tokens
        size = ["--shape", "scaled-down", "--prompts-per-step", "1", "--max-new-tokens", "8"] if smoke \
            else ["--max-new-tokens", str(new)]
        cmd = [PY, "scripts/gpu_check.py", "--preset", preset, "--device", dev, "--steps", str(steps), *size,
               *extra, "--out", str(work / f"check-{name}.json")]
        phase2.append(dict(name=name, cmd=cmd, cap=cap, minimum=45))
    if smoke:        # a 2-core CPU is slower than the caps are sized for
        for p in phase1 + phase2:
            p["cap"] *= 3
    return phase1, phase2


def probe() -> dict:
    """The machine: GPU, driver, versions, a C compiler (torch.compile's kernels need
    one), whether torchao's 8-bit AdamW imports. Run as its own process (--probe), so the
    suite itself never holds a CUDA context."""
    import importlib.metadata as md
    import platform
    out = {"python": platform.python_version(), "cores": os.cpu_count(),
           "c_compiler": shutil.which("cc") or shutil.which("gcc"), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    try:
        out["cpu"] = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                          if line.startswith("model name"))
    except (OSError, StopIteration):
        out["cpu"] = platform.processor()
    for name in ("torch", "transformers", "peft", "torchao", "triton", "accelerate", "safetensors", "tokenizers",
                 "numpy", "pytest"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    import torch
    out.update(torch=torch.__version__, cuda=torch.version.cuda, cuda_available=torch.cuda.is_available())
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        out.update(gpu=p.name, gpu_memory_gb=round(p.total_memory / 1e9, 1), compute_capability=f"{p.major}.{p.minor}",
                   bf16=torch.cuda.is_bf16_supported())
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        out["nvidia_smi"] = smi.stdout.strip() or smi.stderr.strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        out["nvidia_smi"] = f"unavailable: {e}"
    try:
        from torchao.optim import AdamW8bit  # noqa: F401
        out["torchao_adamw8bit"] = "imports"
    except Exception as e:                     # what a user of the 1.5B/3B presets would hit
        out["torchao_adamw8bit"] = f"fails: {e!r}"[:400]
    return out


# ---------------------------------------------------------------------------------------
# Running a part: under `timeout`, its output tagged into the shared log
# ---------------------------------------------------------------------------------------

class Log:
    """gpu_suite.log: lines of every part, tagged "[part  seconds]", up to LOG_LIMIT bytes."""

    def __init__(self, path: Path, t0: float):
        self.f, self.t0, self.size, self.dropped = open(path, "w"), t0, 0, 0
        self.lock = threading.Lock()

    def write(self, part: str, line: str, echo: bool = False) -> float:
        """Log a line; ``echo``: on stdout too (the suite's own lines: what a caller that
        sees only the suite's output learns of its course)."""
        t = time.monotonic() - self.t0
        text = f"[{part:>7} {t:6.1f}s] {line.rstrip()}\n"
        if echo:
            print(text, end="", flush=True)
        with self.lock:
            if self.size + len(text) > LOG_LIMIT:
                self.dropped += 1
            else:
                self.f.write(text)
                self.f.flush()
                self.size += len(text)
        return t


class Runner:
    """Starts parts with a timeout each, within the suite's budget."""

    def __init__(self, budget: float, log: Log, env: dict):
        self.t0, self.budget, self.log, self.env = log.t0, budget, log, env

    def left(self) -> float:
        return self.budget - (time.monotonic() - self.t0)

    def start(self, part: dict) -> dict:
        limit = min(part["cap"], self.left() - RESERVE_S)
        part["result"] = {"status": "skipped", "reason": f"{self.left():.0f} s of the budget left"}
        if limit < part["minimum"]:
            self.log.write(part["name"], f"skipped: {self.left():.0f} s left, it needs {part['minimum']}", echo=True)
            return part
        cmd = ["timeout", "-k", "10", str(int(limit)), *part["cmd"]] if shutil.which("timeout") else part["cmd"]
        self.log.write(part["name"], f"start (timeout {int(limit)} s): {' '.join(part['cmd'])}", echo=True)
        part.update(limit=int(limit), t_start=time.monotonic() - self.t0, lines=collections.deque(maxlen=60),
                    step_times={}, compile_fell_back=False)
        part["result"] = {"status": "running", "timeout_s": int(limit)}
        part["proc"] = subprocess.Popen(cmd, cwd=ROOT, env={**self.env, **part.get("env", {})}, text=True,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, bufsize=1)
        part["reader"] = threading.Thread(target=self._read, args=(part,), daemon=True)
        part["reader"].start()
        return part

    def _read(self, part: dict) -> None:
        for line in part["proc"].stdout:
            t = self.log.write(part["name"], line)
            part["lines"].append(line.rstrip())
            m = re.match(r"step\s+(\d+)/\d+ \|", line)     # train.py's line per RL step
            if m:
                part["step_times"][int(m.group(1))] = round(t, 1)
            if "WON'T CONVERT" in line:       # dynamo gave up on a function and ran it eagerly
                part["compile_fell_back"] = True

    def wait(self, part: dict) -> dict:
        if "proc" not in part:
            return part
        proc = part["proc"]
        try:
            rc = proc.wait(timeout=part["limit"] + 30)    # `timeout` ends it first; this is a safety net
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
        part["reader"].join(timeout=10)
        end = time.monotonic() - self.t0
        status = "ok" if rc == 0 else "timeout" if rc in (124, 137, -9) else "failed"
        part["result"] = {"status": status, "returncode": rc, "seconds": round(end - part["t_start"], 1),
                          "started_at_s": round(part["t_start"], 1), "ended_at_s": round(end, 1),
                          "timeout_s": part["limit"]}
        if status != "ok":
            part["result"]["output_tail"] = list(part["lines"])[-25:]
        self.log.write(part["name"], f"end: {status} (rc {rc}) after {part['result']['seconds']} s", echo=True)
        if status != "ok":
            print("\n".join(f"    {line}" for line in list(part["lines"])[-8:]), flush=True)
        return part


# ---------------------------------------------------------------------------------------
# Reading the parts' figures
# ---------------------------------------------------------------------------------------

def junit_summary(path: Path) -> dict:
    """Counts and the failures' names and first lines, from pytest's JUnit XML."""
    if not path.exists():
        return {"report": "missing"}
    root = ElementTree.parse(path).getroot()
    cases = root.iter("testcase")
    out = {"passed": [], "failed": [], "skipped": []}
    for c in cases:
        name = f"{c.get('classname', '').split('.')[-1]}::{c.get('name')}"
        bad = c.find("failure") if c.find("failure") is not None else c.find("error")
        if bad is not None:
            out["failed"].append({"test": name, "message": (bad.get("message") or "")[:500]})
        elif c.find("skipped") is not None:
            out["skipped"].append(name)
        else:
            out["passed"].append(name)
    return {"n_passed": len(out["passed"]), "n_failed": len(out["failed"]), "n_skipped": len(out["skipped"]),
            **out}


def read_metrics(path: Path) -> list[dict]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:                # a last line cut by a timeout
            pass
    return rows


def run_summary(rows: list[dict]) -> dict:
    """Seconds per step and the learning signals at the first and last steps."""
    if not rows:
        return {"steps": 0}
    step_s = sorted(r["step_s"] for r in rows)
    keys = ("reward", "accuracy", "derive_share", "response_len", "kl", "sample_s", "update_s", "step_s")
    return {"steps": len(rows), "step_s_median": step_s[len(step_s) // 2],
            "sample_s_median": sorted(r["sample_s"] for r in rows)[len(rows) // 2],
            "update_s_median": sorted(r["update_s"] for r in rows)[len(rows) // 2],
            "first": {k: rows[0].get(k) for k in keys}, "last": {k: rows[-1].get(k) for k in keys},
            "reward_first5_mean": sum(r["reward"] for r in rows[:5]) / len(rows[:5]),
            "reward_last5_mean": sum(r["reward"] for r in rows[-5:]) / len(rows[-5:])}


def tiny_summary(part: dict, phase1: list[dict], work: Path, out: Path) -> dict:
    rows = read_metrics(work / "tiny" / "metrics.jsonl")
    if rows:
        shutil.copyfile(work / "tiny" / "metrics.jsonl", out / "tiny-cuda-metrics.jsonl")
    s = run_summary(rows)
    # The steps that ran alone on the GPU: ended after every other phase-1 part had ended.
    others = [p["result"].get("ended_at_s", 0) for p in phase1 if p is not part]
    alone_from = max(others, default=0)
    ends = part.get("step_times", {})
    alone = [r for r in rows if ends.get(r["step"], 0) - r["step_s"] >= alone_from]
    s.update(steps_alone=len(alone), others_ended_at_s=alone_from, step_end_at_s=ends,
             step_s_median_alone=sorted(r["step_s"] for r in alone)[len(alone) // 2] if alone else None,
             per_step=[{k: r.get(k) for k in ("step", "step_s", "sample_s", "update_s", "reward", "accuracy",
                                              "derive_share", "response_len", "max_len")} for r in rows])
    cpu = read_metrics(CPU_REFERENCE)
    s["cpu_reference"] = {"metrics": str(CPU_REFERENCE.relative_to(ROOT)), **run_summary(cpu)} if cpu else None
    return s


def ci_summary(work: Path) -> dict:
    rows = read_metrics(work / "ci" / "metrics.jsonl")
    ev = work / "ci" / "eval_final.json"
    s = {"steps": len(rows), "first_ratio": [rows[0].get("ratio_min"), rows[0].get("ratio_max")] if rows else None,
         "step_s": [r["step_s"] for r in rows]}
    if ev.exists():
        s["final_eval"] = json.loads(ev.read_text()).get("overall")
    return s


def combine(env: dict, phase1: list[dict], phase2: list[dict], work: Path, out: Path, budget: float,
            t0: float, smoke: bool) -> dict:
    """gpu_suite.json: everything measured so far (called after each part)."""
    res = {"what": "scripts/gpu_suite.py" + (" --cpu-smoke" if smoke else ""), "machine": env,
           "budget_s": budget, "elapsed_s": round(time.monotonic() - t0, 1), "parts": {}}
    for p in phase1 + phase2:
        res["parts"][p["name"]] = p.get("result", {"status": "not started"})
    if "result" in phase1[1]:
        res["tests"] = junit_summary(out / "pytest-cuda.xml")
    res["ci"] = ci_summary(work)
    res["tiny"] = tiny_summary(phase1[3], phase1, work, out)
    res["checks"] = {}
    for p in phase2:
        f = work / f"check-{p['name']}.json"
        if f.exists():
            try:
                res["checks"][p["name"]] = json.loads(f.read_text())
            except ValueError:
                res["checks"][p["name"]] = {"error": "unreadable JSON"}
            # torch.compile failures fall back to eager (TORCHDYNAMO_SUPPRESS_ERRORS): say so
            res["checks"][p["name"]]["compile_fell_back"] = p.get("compile_fell_back", False)
    return res


def headline(res: dict) -> str:
    """A few lines of the figures, for a caller that reads only the suite's output."""
    m = res["machine"]
    lines = [f"machine: {m.get('gpu')} ({m.get('gpu_memory_gb')} GB), torch {m.get('torch')}, transformers "
             f"{m.get('transformers')}, torchao {m.get('torchao')}: {m.get('torchao_adamw8bit')}"]
    t = res.get("tests", {})
    if "n_passed" in t:
        lines.append(f"tests: {t['n_passed']} passed, {t['n_failed']} failed "
                     f"{[f['test'] for f in t['failed']][:6]}")
    tiny, ci = res.get("tiny", {}), res.get("ci", {})
    lines.append(f"ci: {ci.get('steps')} steps, first ratio {ci.get('first_ratio')}; tiny: {tiny.get('steps')} steps, "
                 f"median {tiny.get('step_s_median')} s/step ({tiny.get('steps_alone')} alone: "
                 f"{tiny.get('step_s_median_alone')}), reward {tiny.get('reward_first5_mean')} -> "
                 f"{tiny.get('reward_last5_mean')} (first/last 5), derive {tiny.get('first', {}).get('derive_share')} "
                 f"-> {tiny.get('last', {}).get('derive_share')}")
    for name, c in res.get("checks", {}).items():
        steps, e = c.get("steps") or [{}], c.get("estimate_gb") or {}
        lines.append(f"{name}: {len(c.get('steps') or [])} step(s), sample {steps[0].get('sample_s')} s "
                     f"({steps[0].get('sample_ms_per_token')} ms/token), update {steps[0].get('update_s')} s "
                     f"(optimizer {steps[0].get('optimizer_s')}); peak {c.get('peak_gb')} GB, steady "
                     f"{c.get('steady_peak_gb')} GB vs estimate sample {e.get('sample', 0):.2f} / update "
                     f"{e.get('update', 0):.2f}; preset estimate {(c.get('estimate_preset_gb') or {}).get('peak', 0):.1f}"
                     f" GB; ratio {c.get('first_ratio')}, moved {c.get('weights_moved_share')}, "
                     f"complete {c.get('complete')}")
    return "\n".join(lines)


def write_json(path: Path, obj) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=str))
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------
# Setup: the wheels, the environment of the parts
# ---------------------------------------------------------------------------------------

def install_wheels(site: Path, log: Log) -> str | None:
    """Install .whl/*.whl into ``site`` without their dependencies (pip; where pip cannot, a
    wheel is a zip: unpacked as it is). Returns the folder to put on PYTHONPATH, or None."""
    wheels = sorted(glob.glob(str(ROOT / ".whl" / "*.whl")))
    if not wheels:
        log.write("setup", "no wheels in .whl/", echo=True)
        return None
    site.mkdir(parents=True, exist_ok=True)
    cmd = [PY, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir",
           "--upgrade", "--target", str(site), *wheels]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        log.write("setup", f"pip failed ({r.stderr.strip()[-300:]}); unpacking the wheels instead", echo=True)
        for w in wheels:
            with zipfile.ZipFile(w) as z:
                z.extractall(site)
    log.write("setup", f"installed into {site}: {', '.join(Path(w).name for w in wheels)}", echo=True)
    return str(site)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu-smoke", action="store_true", help="device cpu and toy sizes: a dry run of the suite")
    ap.add_argument("--site", default="/tmp/site", help="where the wheels of .whl/ are installed")
    ap.add_argument("--probe", metavar="JSON", help=argparse.SUPPRESS)    # the env part writes here
    a = ap.parse_args(argv)
    if a.probe:
        info = probe()
        write_json(Path(a.probe), info)
        print(json.dumps(info, indent=1))
        return 0
    t0 = time.monotonic()
    smoke = a.cpu_smoke or os.environ.get("GPU_SUITE_CPU_SMOKE") == "1"
    budget = float(os.environ.get("SUITE_BUDGET_S", 900 if smoke else 360))
    out = Path(os.environ.get("OUT") or ROOT / "runs" / "gpu-suite")
    work = ROOT / "runs" / "gpu-suite-work"           # run folders; only the summaries go to $OUT
    out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    log = Log(out / "gpu_suite.log", t0)
    log.write("setup", f"budget {budget:.0f} s, OUT {out}, {'CPU smoke run' if smoke else 'CUDA'}", echo=True)

    env = dict(os.environ, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false",
               # a failing torch.compile (torchao's optimizer step) falls back to eager rather
               # than losing the check; the check's JSON then says compile_fell_back
               TORCHDYNAMO_SUPPRESS_ERRORS="1")
    site = install_wheels(Path(a.site), log)
    if site:
        env["PYTHONPATH"] = os.pathsep.join([site] + [p for p in [env.get("PYTHONPATH")] if p])
    runner = Runner(budget, log, env)
    phase1, phase2 = parts(smoke, work, out)
    machine = {}

    def save():
        write_json(out / "gpu_suite.json", combine(machine, phase1, phase2, work, out, budget, t0, smoke))

    # Phase 1: side by side; the env probe's JSON is the machine's description.
    for p in phase1:
        runner.start(p)
    for p in phase1:
        runner.wait(p)
        if p["name"] == "env" and (work / "env.json").exists():
            machine.update(json.loads((work / "env.json").read_text()))
        save()
    # Phase 2: side by side too (peak memory is per process; the docstring says why).
    for p in phase2:
        runner.start(p)
    for p in phase2:
        runner.wait(p)
        save()
    res = combine(machine, phase1, phase2, work, out, budget, t0, smoke)
    write_json(out / "gpu_suite.json", res)
    log.write("setup", f"done in {time.monotonic() - t0:.0f} s ({log.dropped} log lines dropped)")
    print(headline(res), flush=True)
    failed = [p["name"] for p in phase1 + phase2 if p["result"]["status"] != "ok"]
    print(f"gpu suite: {time.monotonic() - t0:.0f} s; " + (f"not ok: {', '.join(failed)}" if failed else "all ok")
          + f"; {out / 'gpu_suite.json'}")
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
