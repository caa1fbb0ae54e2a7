"""host_memory.py: glibc's fixed mmap threshold and malloc_trim return freed blocks to the
kernel, and the peak resident set can be read and reset per phase (Linux)."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from conftest import ROOT
from lopti_minimal import host_memory

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc and /proc are Linux's")

# The pattern of an RL step in small: a large block freed (glibc's dynamic threshold rises to
# its size), then blocks just below that size, each followed by a small long-lived allocation
# that pins the heap above it (256 KB: a 4 KB one may land in an older hole, and then the
# outcome depends on the interpreter's heap layout). Freed, they cannot be trimmed from the
# heap's top; mmapped, they are unmapped on free.
FRAGMENT = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, {root!r})
    from lopti_minimal import host_memory
    if sys.argv[1] == "limit":
        assert host_memory.limit_heap_growth()
    base = host_memory.rss_gb()
    x = torch.ones(16 << 18); del x
    blocks, keep = [], []
    for _ in range(20):
        blocks.append(torch.ones(8 << 18))
        keep.append(torch.ones(1 << 16))     # 256 KB: too large for an old hole, so above the block
    del blocks
    if sys.argv[1] == "trim":
        assert host_memory.trim_heap()
    print(round((host_memory.rss_gb() - base) * 1024))
""")


def kept_mb(mode: str) -> int:
    code = FRAGMENT.format(root=str(ROOT))
    out = subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True, check=True)
    return int(out.stdout.strip().splitlines()[-1])


@linux
def test_a_fixed_mmap_threshold_returns_freed_blocks_to_the_kernel():
    # glibc's default keeps the 20 freed 8 MB blocks resident (the test shows the problem) ...
    assert kept_mb("default") >= 100
    # ... with the threshold fixed below their size they go back at once
    assert kept_mb("limit") <= 20


@linux
def test_trim_heap_returns_the_heap_holes():
    # the same freed blocks, kept in the heap by glibc's default, go back on malloc_trim
    # (what precision.free_memory does between the phases of a step)
    assert kept_mb("trim") <= 20


@linux
def test_peak_rss_is_read_and_reset():
    x = torch.ones(64 << 20)                  # 256 MB, touched
    peak = host_memory.peak_rss_gb()
    assert peak >= host_memory.rss_gb() >= 0.25
    del x
    assert host_memory.take_peak_rss_gb() >= peak - 1e-3   # the peak with x, then reset ...
    assert host_memory.peak_rss_gb() < peak - 0.2          # ... to the resident set without it


@pytest.mark.parametrize("mb, calls", [(1, [1 << 20]), (4, [4 << 20]), (0, [])])
def test_a_run_sets_the_configured_threshold(monkeypatch, tmp_path, mb, calls):
    from lopti_minimal import plumbing
    from lopti_minimal.config import make_config
    seen = []
    monkeypatch.setattr(host_memory, "limit_heap_growth", lambda t: seen.append(t) or True)
    plumbing.Run(make_config("ci", run_dir=str(tmp_path / "run"), mmap_threshold_mb=mb))
    assert seen == calls


# bf16 matmuls of many shapes, as an RL step makes them (every micro-batch width): oneDNN
# keeps a kernel per shape, up to 1,024 per cache by default
SHAPES = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, {root!r})
    from lopti_minimal import host_memory
    if sys.argv[1] == "bound":
        host_memory.bound_kernel_caches(16)
    w = torch.randn(256, 688)
    for n in range(1, 9):            # warm up the allocator and the first kernels
        with torch.autocast("cpu", dtype=torch.bfloat16):
            (torch.randn(n, 256) @ w).float().sum()
    host_memory.trim_heap()
    base = host_memory.rss_gb()
    for n in range(9, 409):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            (torch.randn(n, 256) @ w).float().sum()
    host_memory.trim_heap()
    print(round((host_memory.rss_gb() - base) * 1024))
""")


def kernel_cache_mb(mode: str) -> int:
    code = SHAPES.format(root=str(ROOT))
    env = {k: v for k, v in os.environ.items()
           if k not in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")}
    out = subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True,
                         check=True, env=env)
    return int(out.stdout.strip().splitlines()[-1])


@linux
def test_bounded_kernel_caches_keep_memory_flat_over_many_shapes():
    unbounded, bounded = kernel_cache_mb("default"), kernel_cache_mb("bound")
    assert bounded < unbounded / 4, (bounded, unbounded)


def test_peak_memory_by_step_separates_creep_from_work(tmp_path):
    """scripts/peak_memory_by_step.py: a peak that follows the tokens alone fits no creep per
    step; one that also grows by 0.05 GB a step at equal work fits 0.5 GB per 10 steps."""
    import json
    from conftest import load_script
    script = load_script("scripts/peak_memory_by_step.py")
    rng = torch.Generator().manual_seed(0)
    for creep, want in ((0.0, 0.0), (0.05, 0.5)):
        points = []
        for run in range(3):
            for step in range(1, 21):
                tokens = int(torch.randint(4000, 20000, (1,), generator=rng))
                points.append({"step": step, "tokens": tokens, "max_len": None,
                               "peak": 0.7 + 0.3 * tokens / 1e4 + creep * step})
        names, coef, se = script.fit(points)
        assert names[-1] == "GB per 10 steps at equal work" and len(coef) == 3
        assert abs(coef[-1] - want) < 1e-6 and abs(coef[1] - 0.3) < 1e-6
    run = tmp_path / "r"
    run.mkdir()
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(
        {"step": s, "tokens": 1000 * (s * 7 % 5 + 1), "max_len": 10 * (s % 4) + s % 3, "peak_rss_gb": 1.0 + 0.01 * s})
        for s in range(1, 9)))
    assert script.main([str(tmp_path)]) == 0            # a folder holding runs; max_len used
    assert script.fit(script.steps_of(run))[0][2] == "GB per 100 tokens of the longest response"
