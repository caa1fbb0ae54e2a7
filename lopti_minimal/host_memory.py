"""The process's resident memory on the host (RAM, not GPU memory): keep it bounded, and
measure its peaks.

Why this module exists. A CPU run of the tiny model (3.4M parameters, 14 MB of weights)
used to peak at several GB of resident memory and to grow over the run. The live tensors
never add up to that: an RL step allocates and frees many tensors of 1-32 MB (KV caches,
logits, activations of a micro-batch), and glibc's malloc serves such sizes from mmap only
below its *dynamic* mmap threshold. After the first large free the threshold rises (up to
32 MB on 64-bit), so later blocks of that size come from the heap, where freed memory is
kept for reuse instead of being returned; pieces of different sizes then fragment the heap
and the resident set only grows. Fixing the threshold (`mallopt(M_MMAP_THRESHOLD)`, which
also turns the dynamic adjustment off; 4 MiB by default, TrainConfig.mmap_threshold_mb) sends
every block of that size or more straight to mmap and back to the kernel on free. No number
changes: only where the allocator puts the bytes (benchmarks/memory.py; docs/PERFORMANCE.md).

Two more holders of memory, found on whole runs: the free pages glibc keeps inside its heap
(below the threshold), which `trim_heap` hands back between the phases of a step; and the
two caches of compiled oneDNN kernels behind PyTorch's bf16 CPU matmuls, one kernel per
shape, which `bound_kernel_caches` caps (docs/PERFORMANCE.md measures all three).

`bound_process_memory` (the threshold and the cap) is called once at the start of a run
(plumbing.Run) and of an evaluation (eval.py). The glibc parts (`limit_heap_growth`,
`trim_heap`) do nothing elsewhere (macOS, Windows, musl) and say so by returning False.
`peak_rss_gb` / `reset_peak_rss` read and reset the kernel's high-water
mark of the resident set (Linux: VmHWM in /proc/self/status, reset by writing 5 to
/proc/self/clear_refs), so a run can log the peak of each step and of each evaluation.
The reset also resets what getrusage and `/usr/bin/time -v` report as the maximum resident
set of the process (the kernel keeps one mark), so for a run they show only the peak since
the last reset: read the run's own figures (metrics.jsonl, evals.jsonl, summary.json).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import resource
import sys

M_MMAP_THRESHOLD = -3      # glibc's <malloc.h>: the mallopt parameter number
MMAP_THRESHOLD = 4 << 20   # 4 MiB (TrainConfig.mmap_threshold_mb): mmapped, returned on free
KERNEL_CACHE_CAPACITY = 256  # oneDNN kernels kept per cache (bound_kernel_caches)
_GB = 1024 ** 3


def limit_heap_growth(threshold: int = MMAP_THRESHOLD) -> bool:
    """Fix glibc's mmap threshold (see the module docstring). True where it was set
    (glibc), False where there is no glibc (macOS, Windows, musl): nothing else changes."""
    libc = _glibc()
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt(M_MMAP_THRESHOLD, int(threshold)) == 1     # mallopt returns 1 on success


def bound_process_memory(mmap_threshold_mb: int = MMAP_THRESHOLD >> 20) -> None:
    """What a run does at its start (plumbing.Run; eval.py, the benchmarks' "ours" sides):
    the mmap threshold (0: glibc's dynamic default) and the capped kernel caches."""
    if mmap_threshold_mb:
        limit_heap_growth(mmap_threshold_mb << 20)
    bound_kernel_caches()


def bound_kernel_caches(capacity: int = KERNEL_CACHE_CAPACITY) -> None:
    """Cap the two caches of oneDNN kernels that PyTorch keeps on a CPU (the bf16 matmuls
    under autocast): oneDNN's primitive cache and ideep's, 1,024 entries each by default,
    one per matmul shape. An RL step meets over a hundred shapes (every micro-batch width,
    every batch size the sampler compacts to), so with the defaults the resident set grows
    over the first steps (docs/PERFORMANCE.md). Each cache reads its variable when it is first
    used: call this before the first matmul; a value the user set is kept."""
    for var in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY"):
        os.environ.setdefault(var, str(capacity))


def trim_heap() -> bool:
    """Give the heap's free pages back to the kernel (glibc's malloc_trim(0)): the holes
    that blocks below the mmap threshold leave when they are freed. Called between the
    phases of a step (precision.free_memory), so that the evaluation or the next sampling
    does not sit on top of the update's fragmented heap. False where there is no glibc."""
    trim = getattr(_glibc(), "malloc_trim", None)      # glibc only (not musl)
    return bool(trim and trim(0))


def _glibc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def _status_kb(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def rss_gb() -> float | None:
    """The resident set now (Linux), in GiB; None where /proc is missing."""
    kb = _status_kb("VmRSS")
    return None if kb is None else kb * 1024 / _GB


def peak_rss_gb() -> float:
    """The peak resident set since the process started or since the last `reset_peak_rss`,
    in GiB (Linux: VmHWM; elsewhere getrusage's ru_maxrss, never reset)."""
    kb = _status_kb("VmHWM")
    if kb is None:   # ru_maxrss: KiB on Linux, bytes on macOS
        r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return r / _GB if sys.platform == "darwin" else r * 1024 / _GB
    return kb * 1024 / _GB


def reset_peak_rss() -> bool:
    """Set the peak to the resident set now (Linux >= 4.0). False where it cannot be reset
    (then peak_rss_gb is the process's peak so far)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def take_peak_rss_gb() -> float:
    """The peak since the last reset, then reset: the peak of one phase (a step, an
    evaluation), rounded to MB."""
    peak = peak_rss_gb()
    reset_peak_rss()
    return round(peak, 3)
