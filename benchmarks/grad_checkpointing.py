"""Gradient checkpointing on SmolLM2-135M-Instruct: peak memory and step time, without
and with (issue 3, item 5; goal: at least 40% less peak memory at most 1.4x the time).

    python scripts/fetch_smollm2.py                      # once
    python benchmarks/grad_checkpointing.py [--batch 4 --length 384 --threads 1]

What is measured: one training step (forward, loss, backward) of the float32 model on a
batch of random token ids, B x T, the setting of an RL update (long responses).

How peak memory is measured on a CPU: each configuration runs in a *fresh* Python
subprocess, because a process's peak resident set size (getrusage ru_maxrss) only ever
grows.  In that process the model is loaded and one tiny warm-up step (1 x 16 tokens)
allocates the gradient buffers and the allocator's arenas; the resident size at that
point (from /proc/self/statm) is the baseline.  After the measured steps, peak minus
baseline is the memory the step itself needed: activations saved for backward, the
logits and their gradient, temporaries.  Weights and gradients (the same in both modes)
are in the baseline.  No tracemalloc (it does not see torch's allocations) and no
profiler (its overhead would distort the times).  On a GPU the same script reports
torch.cuda.max_memory_allocated instead.

Time: median of the measured steps after the warm-up, in the same subprocess.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOL = os.path.join(ROOT, "models", "smollm2-135m-instruct")


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024   # Linux: KiB


def one_config(checkpointing: bool, batch: int, length: int, steps: int, threads: int) -> dict:
    """Runs inside the subprocess: returns the measurements as a dict."""
    import torch
    sys.path.insert(0, ROOT)
    from lopti_minimal.models import load_model_and_tokenizer, set_gradient_checkpointing

    torch.set_num_threads(threads)
    model, _ = load_model_and_tokenizer(SMOL)
    device = next(model.parameters()).device
    set_gradient_checkpointing(model, checkpointing)
    model.train()
    gen = torch.Generator().manual_seed(0)
    V = model.config.vocab_size

    def step(B, T):
        ids = torch.randint(0, V, (B, T), generator=gen).to(device)
        logits = model(input_ids=ids, use_cache=False).logits
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, V).float(),
                                                 ids[:, 1:].reshape(-1))
        loss.backward()
        if device.type == "cuda":
            torch.cuda.synchronize()

    step(1, 16)                                  # warm-up: gradient buffers, arenas
    base = rss_bytes()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        step(batch, length)
        times.append(time.perf_counter() - t)
    peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else peak_rss_bytes()
    return {"checkpointing": checkpointing, "peak_step_mib": (peak - base) / 2**20,
            "step_s": statistics.median(times), "device": device.type}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--length", type=int, default=384)
    ap.add_argument("--steps", type=int, default=2, help="measured steps (median time)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--child", choices=["on", "off"], help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:   # inside the fresh subprocess
        print(json.dumps(one_config(a.child == "on", a.batch, a.length, a.steps, a.threads)))
        return 0
    if not os.path.isdir(SMOL):
        raise SystemExit("SmolLM2 not found: run `python scripts/fetch_smollm2.py` first")
    results = {}
    for mode in ("off", "on"):
        out = subprocess.run([sys.executable, __file__, "--child", mode, "--batch", str(a.batch),
                              "--length", str(a.length), "--steps", str(a.steps),
                              "--threads", str(a.threads)],
                             check=True, capture_output=True, text=True).stdout
        results[mode] = json.loads(out.strip().splitlines()[-1])
    off, on = results["off"], results["on"]
    print(f"SmolLM2-135M, float32, {off['device']}, batch {a.batch} x {a.length} tokens, "
          f"{a.threads} thread(s), one forward+backward step")
    print(f"{'':24}{'peak step memory':>18}{'step time':>12}")
    for name, r in (("without checkpointing", off), ("with checkpointing", on)):
        print(f"{name:24}{r['peak_step_mib']:>14.0f} MiB{r['step_s']:>11.2f}s")
    saved = 1 - on["peak_step_mib"] / off["peak_step_mib"]
    slower = on["step_s"] / off["step_s"]
    print(f"memory saved {saved:.0%} (goal >= 40%), time x{slower:.2f} (goal <= 1.4)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
