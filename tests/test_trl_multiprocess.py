"""Two processes for real: `accelerate launch --multi_gpu --num_processes 2` on CPUs (gloo) runs
scripts/train_trl.py, and one AR+Lopti update (Eq. 4, Algorithm 1) split over two ranks
equals the single-process update of the same global batch.

What must hold across ranks (lopti_minimal/trl_grpo.py): group advantages from the rewards
gathered over all processes, each rank's slice of them; pi_old (and so AR's weights and the
Lopti split) from each rank's own rows, buffered for both stages; each stage's token-mean
divided by the token count of the whole global batch (TRL's "dapo" normalizer: the gathered
count / processes, then DDP's gradient average). A per-rank token-mean would weight the
ranks' tokens unequally; the sensitivity check shows the tolerance catches it.

Why `--multi_gpu` and not `--cpu`: accelerate 1.16's `--cpu` (like a MULTI_CPU config file)
goes to its simple launcher, which starts several processes only through mpirun
(`--mpirun_hostfile`); without it `--cpu --num_processes 2` silently runs ONE process.
`--multi_gpu` starts them with torchrun, and on CPUs (TRL's use_cpu) the processes join a
gloo group. The tests check that two ranks really ran.
"""
import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, load_script
from test_trl_grpo import setting  # noqa: F401  (the module-scoped fixture)

# `accelerate launch` through the running interpreter: the same as the `accelerate` command,
# and found in a venv that was not activated (the command is then not on PATH).
LAUNCH = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
          "--num_machines", "1",
          "--mixed_precision", "no", "--dynamo_backend", "no"]


def launch(args, cwd, timeout=300):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    out = subprocess.run(LAUNCH + args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


def test_train_trl_runs_on_two_processes(tmp_path):
    """scripts/train_trl.py --preset ci under accelerate launch: both ranks train one step
    of AR+Lopti (two optimizer steps) and rank 0 saves the policy; each process got half
    of the global batch (P x G = 8 rows: 4 per process)."""
    out = tmp_path / "run"
    launch([str(ROOT / "scripts/train_trl.py"), "--preset", "ci", "--steps", "1", "--max-new-tokens", "16",
            "--threads", "1", "--device", "cpu", "--out", str(out)], cwd=tmp_path)
    trl_args = json.loads((out / "config.json").read_text())["trl"]
    assert trl_args["per_device_train_batch_size"] * trl_args["gradient_accumulation_steps"] == 4
    assert (out / "final" / "model.safetensors").is_file()
    rows = [json.loads(line) for line in (out / "log_history.jsonl").read_text().splitlines()]
    assert rows[-1]["train_runtime"] > 0 and any("loss" in r for r in rows)


def rows_of(scored: dict, key: str) -> list:
    """Per row, the valid-token values of `key` (each rank pads to its own width)."""
    m = scored["completion_mask"].bool()
    v = scored[key]
    return [v[i][m[i]] if v.dim() == 2 else v[i].expand(int(m[i].sum())) for i in range(len(m))]


def test_two_rank_update_equals_single_process(setting, tmp_path):  # noqa: F811
    spec = {k: setting[k] for k in ("dir", "prompts", "prompt_ids", "completions")}
    (tmp_path / "setting.json").write_text(json.dumps(spec))
    launch([str(ROOT / "tests/trl_ddp_update.py"), str(tmp_path / "setting.json"), str(tmp_path)],
           cwd=tmp_path)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    single = load_script("tests/trl_ddp_update.py").run(str(tmp_path / "setting.json"),
                                                        str(tmp_path / "single"))["global"]
    two = r0["global"]
    assert torch.equal(two["p0"], single["p0"])

    # Each rank scored its own 6 of the 12 rows: the same pi_old and AR advantages per row,
    # and both know the global token count.
    s1, a, b = single["scored"], r0["global"]["scored"], r1["global"]["scored"]
    assert len(a["completion_mask"]) == len(b["completion_mask"]) == len(s1["completion_mask"]) // 2
    for key in ("completion_ids", "old_per_token_logps", "advantages"):
        for x, y in zip(rows_of(a, key) + rows_of(b, key), rows_of(s1, key)):
            assert torch.allclose(x.float(), y.float(), atol=1e-6), key
    n0, n1 = int(a["completion_mask"].sum()), int(b["completion_mask"].sum())
    assert int(a["num_items_in_batch"]) == int(b["num_items_in_batch"]) == n0 + n1 != 2 * n0

    # The update: every optimizer step's gradient (after the all-reduce) and the weights.
    def rel(gs, ref):
        return max(float((g - r).abs().max()) / float(r.abs().max()) for g, r in zip(gs, ref))

    assert len(two["grads"]) == len(single["grads"]) == 2               # Lopti's two stages
    scale = float((single["p1"] - single["p0"]).abs().max())
    diff = float((two["p1"] - single["p1"]).abs().max())
    wrong = r0["per_rank"]
    print(f"two ranks vs one: gradients {rel(two['grads'], single['grads']):.1e} of their scale, "
          f"weights {diff / scale:.1e} of the update; with a per-rank token-mean: gradients "
          f"{rel(wrong['grads'], single['grads']):.1e}, weights "
          f"{float((wrong['p1'] - single['p1']).abs().max()) / scale:.1e}")
    assert rel(two["grads"], single["grads"]) <= 1e-5
    # The weights may differ by a float32 rounding of the weights themselves (~1e-8 here).
    assert scale > 1e-6 and diff <= 1e-4 * scale
    assert torch.equal(r0["global"]["p1"], r1["global"]["p1"])          # DDP kept the ranks equal
    # Sensitivity: a per-rank token-mean misses both tolerances by far.
    assert rel(wrong["grads"], single["grads"]) > 100 * 1e-5
    assert float((wrong["p1"] - single["p1"]).abs().max()) > 100 * 1e-4 * scale


@pytest.mark.parametrize("name", ["accelerate_1gpu", "deepspeed_zero2", "deepspeed_zero3"])
def test_launch_configs_parse(name):
    """The config files parse with accelerate's loader; the DeepSpeed ones, never run, say so
    on their first line."""
    from accelerate.commands.config.config_args import load_config_from_file
    path = ROOT / "configs" / f"{name}.yaml"
    cfg = load_config_from_file(str(path))
    assert cfg.num_processes >= 1
    if name.startswith("deepspeed"):
        assert path.read_text().startswith("# UNTESTED"), "say plainly that it was never run"
        assert cfg.distributed_type == "DEEPSPEED"
