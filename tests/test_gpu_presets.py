"""The GPU presets' code path, end to end on a CPU (and on CUDA where a GPU is visible:
conftest.DEVICES): for each Qwen2.5 preset, one RL step and the evaluation with a randomly
initialised, scaled-down Qwen2 (transformers' Qwen2 classes, grouped-query attention) and
a tokenizer with a ChatML chat template, under the preset's own settings: its precision
policy (float32 master weights or bf16 with stochastic rounding, bf16 autocast, a bf16
pi_ref), gradient checkpointing, rollout_chunk, micro-batches of 1 and Lopti. What differs
on CUDA (device placement, the autocast device type, freeing memory between rollout and
update) is written as one code path (precision.py), so these lines are the ones a GPU
runs. Only the sizes are scaled down."""
import json
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer

from conftest import DEVICES, ROOT, load_script
from lopti_minimal import models, precision, trainer
from lopti_minimal.task import kk
from lopti_minimal.config import make_config

GPU_PRESETS = ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b")


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory):
    tok = models.chatml_tokenizer(AutoTokenizer.from_pretrained(ROOT / "checkpoints" / "tiny-warm"))
    d = tmp_path_factory.mktemp("qwen2-scaled-down")
    models.random_qwen2(tok, "scaled-down", seed=0).save_pretrained(d)
    tok.save_pretrained(d)
    return d


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("preset", GPU_PRESETS)
def test_gpu_preset_code_path_runs_one_step(preset, device, qwen_dir, tmp_path, eager_compile, monkeypatch):
    t0 = time.perf_counter()
    cfg = make_config(preset, model=str(qwen_dir), device=device, steps=1, prompts_per_step=2, group_size=2,
                      max_new_tokens=12, max_prompt_len=512, rl_sizes=(3,), rl_per_size=8,
                      eval_sizes=(3,), eval_per_size=2, eval_max_new_tokens={3: 12}, eval_batch_size=2,
                      eval_every=0, save_every=0, run_dir=str(tmp_path / "run"), progress=False,
                      plots=False, threads=2, method="ar_lopti",
                      rollout_chunk=1)                         # 2 prompts: sampled in 2 chunks
    # The preset's own settings, untouched by the overrides above.
    ref = make_config(preset)
    for k in ("dtype", "optimizer", "autocast_bf16", "ref_dtype", "gradient_checkpointing",
              "micro_batch_size", "lr", "device"):
        assert getattr(cfg, k) == getattr(ref, k) or k == "device", k
    assert ref.device == "cuda" and cfg.micro_batch_size == 1 and cfg.gradient_checkpointing

    freed = []
    real_free = precision.free_memory
    monkeypatch.setattr(precision, "free_memory", lambda d: (freed.append(str(d)), real_free(d)))
    out = trainer.train(cfg)
    # after each of the 2 rollout chunks, after the update, on the run's device ("cuda:0")
    assert [torch.device(d).type for d in freed] == [device] * 3
    m = out["metrics"][0]
    # Fresh samples: the first ratio is exactly 1 (pi_old recomputed by the update's forward:
    # the same kernels on the same rows, on CUDA as on a CPU).
    assert m["ratio_min"] == m["ratio_max"] == 1.0
    assert out["final_eval"]["per_size"][3]["n"] == 2
    # The chat template made the prompts (kk_prompt's instruct path).
    tok = AutoTokenizer.from_pretrained(qwen_dir)
    assert models.is_instruct(tok) and models.kk_prompt(kk.load_official([3])[0], tok).startswith("<|im_start|>system")
    # The weights moved, in the preset's weight dtype.
    before = load_file(qwen_dir / "model.safetensors")
    after = load_file(Path(out["paths"]["final_model"]) / "model.safetensors")
    w = "model.layers.0.mlp.up_proj.weight"
    assert after[w].dtype == precision.master_dtype(cfg)
    assert not torch.equal(after[w].float(), before[w].to(after[w].dtype).float())
    assert time.perf_counter() - t0 < 60


def test_gpu_check_script_on_cpu(tmp_path, capsys):
    """scripts/gpu_check.py: the same code on a CPU with a scaled-down shape; its figures,
    the first ratio and the update check. Without CUDA its default device is refused."""
    gc = load_script("scripts/gpu_check.py")
    out = tmp_path / "gc.json"
    assert gc.main(["--device", "cpu", "--shape", "scaled-down", "--steps", "2", "--prompts-per-step", "2",
                    "--max-new-tokens", "12", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "first ratio: min 1.0 max 1.0 (OK)" in text and "weights moved:" in text
    r = json.loads(out.read_text())
    assert len(r["steps"]) == 2 and r["weights_moved_share"] > 0.5 and r["estimate_gb"]["peak"] > 0
    if not torch.cuda.is_available():
        assert gc.main([]) == 2 and "none is visible" in capsys.readouterr().err


def test_gpu_check_with_lora_on_cpu(tmp_path, capsys, eager_compile):
    """scripts/gpu_check.py --lora-rank: the 3B preset's settings with adapters on a
    scaled-down shape. Only the adapters train (the watched parameter is a B matrix, zero
    at the start, which the lr-1e-6 step moves), the estimate counts their gradients and
    optimizer state alone, and the JSON says what a bf16 merge (a saved checkpoint) keeps."""
    gc = load_script("scripts/gpu_check.py")
    out = tmp_path / "gc.json"
    rc = gc.main(["--device", "cpu", "--preset", "qwen2.5-3b", "--shape", "scaled-down", "--steps", "1",
                  "--prompts-per-step", "1", "--max-new-tokens", "8", "--lora-rank", "4", "--out", str(out)])
    assert rc == 0 and "merged into the bfloat16 weights" in capsys.readouterr().out
    r = json.loads(out.read_text())
    assert r["complete"] and r["lora_rank"] == 4 and r["optimizer"] == "adamw8bit"
    assert 0 < r["trainable_params"] < r["params"] / 10 and "lora_B" in r["watched"]
    assert r["weights_moved_share"] == 1.0 and 0 <= r["merged_moved_share"] <= 1
    e = r["estimate_gb"]
    assert e["grads"] == pytest.approx(4 * r["trainable_params"] / 1e9)
    # the estimate is for the rows and sequence this check ran: one chunk, prompt + 8 tokens
    assert e["kv_cache"] < r["estimate_preset_gb"]["kv_cache"] and r["prompt_len"] > 300


def test_gpu_check_projects_the_peak_of_a_step_holding_the_optimizer_state():
    """In step 1 the optimizer state is created by the optimizer step itself, so sampling
    and backward ran without it: the peak of a later step is projected from step 1 as
    max(sample + state, update + state, optimizer). A second step measures it."""
    gc = load_script("scripts/gpu_check.py")
    step1 = {"peak_gb": {"sample": 10.0, "update": 12.0, "optimizer": 13.0}, "reserved_gb":
             {"sample": 11.0, "update": 13.0, "optimizer": 14.0}, "allocated_before_gb": 3.0,
             "allocated_after_gb": 7.0}
    one = gc.memory_summary([step1])
    assert one["optimizer_state_gb"] == 4.0 and one["projected_steady_peak_gb"] == 16.0
    assert one["steady_peak_gb"] == 16.0 and one["peak_gb"] == 13.0 and one["steady_peak_from"].startswith("projected")
    step2 = dict(step1, peak_gb={"sample": 14.0, "update": 15.5, "optimizer": 13.0})
    two = gc.memory_summary([step1, step2])
    assert two["steady_peak_gb"] == 15.5 and two["projected_steady_peak_gb"] == 16.0
    assert two["steady_peak_from"].startswith("measured") and two["reserved_peak_gb"] == 14.0


@pytest.mark.parametrize("smoke", [False, True])
def test_gpu_suite_commands_parse(smoke, tmp_path, request):
    """scripts/gpu_suite.py runs once on a GPU machine lent for minutes: every command it
    would run is checked here first. Each train.py command builds its config with train.py's
    own parser, each gpu_check command parses with gpu_check's, the test files exist and the
    `cuda` marker is registered (conftest)."""
    suite = load_script("scripts/gpu_suite.py")
    train, gc = load_script("train.py"), load_script("scripts/gpu_check.py")
    phase1, phase2 = suite.parts(smoke, tmp_path / "work", tmp_path / "out")
    assert [p["name"] for p in phase1] == ["env", "tests", "ci", "tiny"]
    for p in phase1 + phase2:
        cmd = p["cmd"]
        assert 0 < p["minimum"] < p["cap"]
        if "train.py" in cmd:
            cfg = train.build_config(train.parse_args(cmd[cmd.index("train.py") + 1:]))
            assert cfg.device == ("cpu" if smoke else "cuda") and not cfg.progress
        elif "scripts/gpu_check.py" in cmd:
            a = gc.parse_args(cmd[cmd.index("scripts/gpu_check.py") + 1:])
            assert a.device == ("cpu" if smoke else "cuda") and a.out.endswith(f"check-{p['name']}.json")
            assert a.lora_rank == (16 if p["name"] == "3b-lora" else 0)
            assert a.max_new_tokens == (8 if smoke else 256 if a.preset == "qwen2.5-0.5b" else 128)
        elif "pytest" in cmd:
            assert all((ROOT / f).exists() for f in suite.TEST_FILES)
            marked = any(cmd[i:i + 2] == ["-m", "cuda"] for i in range(len(cmd)))
            assert marked != smoke            # on a CPU there are no cuda variants to select
            assert any(line.startswith("cuda:") for line in request.config.getini("markers"))
    if not smoke:    # the checks come most valuable first
        assert [p["name"] for p in phase2] == ["3b-lora", "0.5b", "1.5b", "3b"]


def test_gpu_suite_reads_junit_and_metrics(tmp_path):
    suite = load_script("scripts/gpu_suite.py")
    xml = tmp_path / "r.xml"
    xml.write_text('<testsuites><testsuite><testcase classname="tests.test_grpo" name="t_ok[cuda]"/>'
                   '<testcase classname="tests.test_lopti" name="t_bad[cuda]"><failure message="boom"/>'
                   '</testcase></testsuite></testsuites>')
    s = suite.junit_summary(xml)
    assert (s["n_passed"], s["n_failed"]) == (1, 1) and s["failed"][0] == {"test": "test_lopti::t_bad[cuda]",
                                                                          "message": "boom"}
    m = tmp_path / "metrics.jsonl"
    m.write_text("".join(json.dumps({"step": i, "step_s": 2.0 + i, "sample_s": 1.0, "update_s": 0.5,
                                     "reward": i / 10, "derive_share": i / 20}) + "\n" for i in range(1, 8))
                 + '{"step": 8, "ste')                       # a line cut by a timeout
    rows = suite.read_metrics(m)
    r = suite.run_summary(rows)
    assert r["steps"] == 7 and r["step_s_median"] == 6.0 and r["first"]["reward"] == 0.1
    assert r["reward_last5_mean"] > r["reward_first5_mean"]
