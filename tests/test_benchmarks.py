"""The benchmarks run end to end, in miniature.

benchmarks/ prints figures (docs/PERFORMANCE.md); no test times anything. But a benchmark
that no test runs breaks silently when the code it calls changes (rl_step.py's update part
once indexed the rollout as a dict after it had become a dataclass). So each script runs here as a user runs it, in its own process, on the shipped tiny model
with 2 prompts x G = 2 and a handful of new tokens, and the test checks the JSON it writes
holds the figures docs/PERFORMANCE.md quotes.
"""
import json
import subprocess
import sys

import pytest

from conftest import ROOT


def run_benchmark(script: str, *args: str, json_out) -> dict:
    cmd = [sys.executable, str(ROOT / "benchmarks" / script), "--threads", "1", *args, "--json", str(json_out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(json_out.read_text())


SMALL = ("--prompts", "2", "--group-size", "2", "--max-new-tokens", "8")


def test_rl_step_every_part(tmp_path):
    res = run_benchmark("rl_step.py", *SMALL, "--steps", "1", "--repeats", "1", "--top", "3",
                        "--parts", "sampler", "update", "step", "memory", "profile",
                        json_out=tmp_path / "rl.json")
    assert res["sampler"]["fixed_speedup"] > 0 and res["sampler"]["eos_speedup"] > 0
    assert res["update"]["response_tokens"] > 0 and res["update"]["update_over_bare"] > 0
    assert res["step"]["grpo"]["tokens"] == res["step"]["ar_lopti"]["tokens"] > 0   # same rollouts
    # each phase's achieved FLOP/s against the limit at its shapes (benchmarks/flops.py)
    for method in ("grpo", "ar_lopti"):
        r = res["step"][method]
        assert set(r["of_limit"]) == {"sampling", "old_logp", "ref_logp", "update"}
        assert all(0 < v for v in r["of_limit"].values()) and r["peak_rss_gb"] > 0
    # AR+Lopti's update counts two passes over the batch, GRPO's one
    flops = [res["step"][m]["per_step"][0]["flops"]["update"] for m in ("grpo", "ar_lopti")]
    assert flops[1] == 2 * flops[0]
    assert res["memory"]["on"]["checkpointing"] and res["memory"]["off"]["peak_step_mib"] > 0
    assert res["profile"]["table"]


def test_sampler_speed(tmp_path):
    res = run_benchmark("sampler_speed.py", *SMALL, "--repeats", "1", json_out=tmp_path / "s.json")
    for mode in ("eos", "fixed"):
        assert res[f"{mode}_hf"]["tokens"] > 0 and res[f"{mode}_lean"]["tok_s"] > 0


def test_trl_side_by_side(tmp_path):
    res = run_benchmark("trl_side_by_side.py", *SMALL, "--steps", "1", "--warmup", "0",
                        json_out=tmp_path / "t.json")
    assert res["trl"]["tokens"] > 0 and res["ours"]["tokens"] > 0
    assert res["trl"]["same_prompts_as_ours"]


def test_memory(tmp_path):
    res = run_benchmark("memory.py", "--steps", "1", "--eval-per-size", "2", "--variants", "shipped",
                        "--set", "prompts_per_step=2", "--set", "group_size=2", "--set", "max_new_tokens=8",
                        json_out=tmp_path / "m.json")
    shipped = res["variants"]["shipped"]
    assert shipped["process_peak_gb"] > 0 and len(shipped["steps"]) == 1
    assert set(shipped["phases"]) == {"sampling", "old log-probs", "ref log-probs", "update", "evaluation"}


def test_model_flops_count_every_projection_once_per_real_position():
    """benchmarks/flops.py: a forward's linear FLOPs are 2 x (the decoder layers' projection
    weights) x real positions, attention counts the causal pairs of each row's real
    positions, the LM head only response positions; x3 with the backward."""
    import torch
    from conftest import load_script, tiny_llama
    F = load_script("benchmarks/flops.py")
    model = tiny_llama()
    s = F.Shapes.of(model.config)
    projections = sum(p.numel() for n, p in model.model.layers.named_parameters()
                      if n.endswith("_proj.weight"))
    assert s.layers * sum(i * o for _, i, o in s.projections()) == projections
    mask = torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]])       # 4 and 5 real positions
    resp = torch.tensor([[1.0, 1.0], [1.0, 0.0]])                # 3 response tokens
    assert F.causal_pairs([4, 5]) == 10 + 15
    f = F.batch_flops(s, mask, resp, backward=False)
    assert f["linear"] == 2 * 9 * projections
    assert f["attention"] == 2 * 2 * 25 * s.layers * s.heads * s.head_dim
    assert f["head"] == 2 * 3 * s.hidden * s.vocab
    assert F.batch_flops(s, mask, resp, backward=True)["total"] == 3 * f["total"]
