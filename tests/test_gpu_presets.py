"""The GPU presets' code path, end to end on a CPU: for each Qwen2.5 preset, one RL step
and the evaluation with a randomly initialised, scaled-down Qwen2 (transformers' Qwen2
classes, grouped-query attention) and a tokenizer with a ChatML chat template, under the
preset's own settings: its precision policy (float32 master weights or bf16 with
stochastic rounding, bf16 autocast, a bf16 pi_ref), gradient checkpointing, rollout_chunk,
micro-batches of 1 and Lopti. What differs on CUDA (device placement, the autocast device
type, freeing memory between rollout and update) is written as one code path
(precision.py), so these lines are the ones a GPU runs. Only the sizes are scaled down."""
import json
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer

from conftest import ROOT, load_script
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


@pytest.mark.parametrize("preset", GPU_PRESETS)
def test_gpu_preset_code_path_runs_one_step_on_cpu(preset, qwen_dir, tmp_path, eager_compile, monkeypatch):
    t0 = time.perf_counter()
    cfg = make_config(preset, model=str(qwen_dir), device="cpu", steps=1, prompts_per_step=2, group_size=2,
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
    assert freed == ["cpu", "cpu", "cpu"]       # after each of the 2 rollout chunks, after the update
    m = out["metrics"][0]
    # Fresh samples: the first ratio is exactly 1 (pi_old recomputed by the update's forward).
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
