"""LoRA (lora.py, peft): AR (Eq. 4) and Lopti (Algorithm 1) unchanged on top of adapters.
One Lopti update moves only the adapters and equals the same loss computed by hand; the
merged checkpoint is a plain Hugging Face model that eval.py loads, with the same outputs,
merged in float32 so that a bf16 base keeps a small update (lora.py, choice 4)."""
import copy

import pytest
import torch

from dataclasses import replace  # noqa: E402

from lopti_minimal.config import TrainConfig  # noqa: E402
from lopti_minimal.grpo import (batch_logprobs, group_advantages, grpo_update, kl_k3, policy_loss,  # noqa: E402
                                 token_logprobs)
from lopti_minimal.lopti import lopti_update, split_by_probability  # noqa: E402
from lopti_minimal.lora import add_lora, adapter_state, merged_copy  # noqa: E402
from lopti_minimal.reweight import reweight_advantages  # noqa: E402
from lopti_minimal.sampling import sample_groups  # noqa: E402

from conftest import BOS, EOS, PAD, tiny_llama, update_batch  # noqa: E402

PROMPTS = [[BOS, 5, 6, 7], [BOS, 9], [BOS, 10, 11, 12, 13]]
G = 4
REWARDS = torch.tensor([3.0, -0.5, -1.0, 3.0, -3.0, 3.0, -1.0, -0.5, 3.0, -1.0, -0.5, -0.5])
ETA, ALPHA, LR = 0.5, 0.3, 0.5


def setup():
    """The tiny Llama with fresh rank-4 adapters, an AR batch sampled from it, and a
    reference policy that differs from it (so the KL term has gradient)."""
    torch.manual_seed(0)
    model = add_lora(tiny_llama(), rank=4)
    r = sample_groups(model, PROMPTS, group_size=G, max_new_tokens=12, temperature=1.0,
                      eos_token_id=EOS, pad_token_id=PAD, generator=torch.Generator().manual_seed(0))
    cfg = TrainConfig(temperature=1.0, kl_coef=0.05, mini_batch_size=12, micro_batch_size=6,
                      grad_clip=1e9)
    b = update_batch(r, group_advantages(REWARDS, G), tiny_llama(seed=1), cfg)
    b = replace(b, advantages=reweight_advantages(b.advantages, b.old_logprobs, ALPHA))
    return model, b, cfg


def by_hand(model, b, cfg):
    """Algorithm 1 written out: per stage, the token-mean over ALL response tokens of
    (clipped surrogate + kl_coef * k3) on the stage's tokens, then an SGD step."""
    params = [p for p in model.parameters() if p.requires_grad]
    for stage in split_by_probability(b.old_logprobs, b.response_mask, ETA):    # low, high
        logp = token_logprobs(model, b.input_ids, b.attention_mask, b.prompt_len, cfg.temperature)
        pg, _ = policy_loss(logp, b.old_logprobs, b.advantages, cfg.eps_low, cfg.eps_high, cfg.clip_c)
        loss = ((pg + cfg.kl_coef * kl_k3(logp, b.ref_logprobs)) * stage).sum() / b.response_mask.sum()
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for p, g in zip(params, grads):
                p -= LR * g


def test_lopti_update_moves_only_the_adapters_and_equals_hand_computation(tmp_path):
    model, b, cfg = setup()
    base0 = {k: v.clone() for k, v in model.named_parameters() if "lora_" not in k}
    lora0 = {k: v.clone() for k, v in model.named_parameters() if "lora_" in k}
    assert lora0 and all(v.requires_grad for k, v in model.named_parameters() if "lora_" in k)
    hand = copy.deepcopy(model)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=LR)
    lopti_update(model, opt, b, cfg, eta=ETA)
    by_hand(hand, b, cfg)

    now = dict(model.named_parameters())
    assert all(torch.equal(now[k], v) for k, v in base0.items()), "a base weight moved"
    moved = [k for k, v in lora0.items() if not torch.equal(now[k], v)]
    assert any("lora_B" in k for k in moved) and any("lora_A" in k for k in moved)
    theirs = dict(hand.named_parameters())
    ours_d = torch.cat([(now[k] - v).detach().flatten() for k, v in lora0.items()])
    hand_d = torch.cat([(theirs[k] - v).detach().flatten() for k, v in lora0.items()])
    # up to a float32 rounding of the adapter weights themselves (~1e-8 here)
    assert float((ours_d - hand_d).abs().max()) <= 1e-4 * float(hand_d.abs().max())


def test_merged_checkpoint_is_what_eval_loads(nano_dir, tmp_path):
    """After an AR+Lopti update of a LoRA policy, the run's save path (runs.save_hf_atomic)
    writes the adapters merged into a plain checkpoint: eval.py's loader reads it with the
    adapted policy's log-probs and samples, and eval.py evaluates it; the training model
    keeps its adapters."""
    from conftest import load_script
    from lopti_minimal.models import load_model_and_tokenizer
    from lopti_minimal.runs import save_hf_atomic
    base, tok = load_model_and_tokenizer(nano_dir, dtype=torch.float32, device="cpu")
    model = add_lora(copy.deepcopy(base), rank=4)
    prompts = [tok(text=t)["input_ids"] for t in ("Alice says Bob is a knight.", "Bob lies.")]
    kw = dict(group_size=4, max_new_tokens=8, temperature=1.0, eos_token_id=tok.eos_token_id,
              pad_token_id=tok.pad_token_id)
    r = sample_groups(model, prompts, generator=torch.Generator().manual_seed(0), **kw)
    b = update_batch(r, group_advantages(REWARDS[:8], G))
    b = replace(b, advantages=reweight_advantages(b.advantages, b.old_logprobs, ALPHA))
    cfg = TrainConfig(temperature=1.0, kl_coef=0.0, mini_batch_size=8, micro_batch_size=8)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=LR)
    lopti_update(model, opt, b, cfg, eta=ETA)

    save_hf_atomic(model, tok, tmp_path / "final")
    assert not (tmp_path / "final" / "adapter_config.json").exists()
    assert len(adapter_state(model)) > 0                       # the original keeps its adapters
    loaded, _ = load_model_and_tokenizer(str(tmp_path / "final"), dtype=torch.float32, device="cpu")
    assert not any("lora_" in k for k in loaded.state_dict())
    want = batch_logprobs(model, b, cfg)
    assert float((batch_logprobs(loaded, b, cfg) - want).abs().max()) <= 1e-5
    assert float((batch_logprobs(base, b, cfg) - want).abs().max()) > 1e-4   # the update mattered
    a = sample_groups(model, prompts, generator=torch.Generator().manual_seed(5), **kw)
    c = sample_groups(loaded, prompts, generator=torch.Generator().manual_seed(5), **kw)
    assert torch.equal(a.response_ids, c.response_ids)
    assert merged_copy(loaded) is loaded
    rc = load_script("eval.py").main(["--model", str(tmp_path / "final"), "--sizes", "3", "--per-size", "2",
                                      "--max-new-tokens", "8", "--device", "cpu", "--no-progress",
                                      "--out", str(tmp_path / "eval.json")])
    assert rc == 0 and (tmp_path / "eval.json").exists()


def test_train_with_lora_resumes_exactly(nano_dir, tmp_path):
    """`train` with lora_rank: 2 AR+Lopti steps straight equal 1 step, then --resume to 2
    (the adapters come back from trainer_state.pt onto the base model), metrics and final
    merged weights alike; the final policy is a plain checkpoint and differs from the base."""
    from test_trainer import TIMING, length_reward, small_cfg
    from transformers import AutoModelForCausalLM
    from lopti_minimal import plumbing, trainer

    def cfg(name, steps):
        return small_cfg(nano_dir, tmp_path / name, method="ar_lopti", lora_rank=4, steps=steps,
                         save_every=1, lr=3e-2, threads=1, device="cpu")
    a = trainer.train(cfg("a", 2), reward_fn=length_reward, log=lambda s: None)
    trainer.train(cfg("b", 1), reward_fn=length_reward, log=lambda s: None)
    b = trainer.train(plumbing.resume_config(str(tmp_path / "b" / "run"), steps=2, progress=False),
                      resume=True, reward_fn=length_reward, log=lambda s: None)

    def strip(ms):
        return [{k: v for k, v in m.items() if k not in TIMING} for m in ms]
    assert strip(a["metrics"]) == strip(b["metrics"]) and any(m["grad_norm"] > 0 for m in a["metrics"])
    wa, wb, w0 = (AutoModelForCausalLM.from_pretrained(p).state_dict()
                  for p in (a["paths"]["final_model"], b["paths"]["final_model"], nano_dir))
    assert set(wa) == set(w0)                                   # no lora_ keys: merged
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert any(not torch.equal(wa[k], w0[k]) for k in wa)
    assert all(torch.equal(wa[k], w0[k]) for k in wa if "embed" in k or "norm" in k)   # not adapted


def test_adapter_parameters_count_what_peft_trains():
    """lora.adapter_parameters (the GPU memory estimate's count, no model built) equals the
    trainable parameters of add_lora on a Llama (multi-head) and a scaled-down Qwen2
    (grouped-query attention, biases on q/k/v that LoRA leaves frozen); the estimate then
    counts gradients and optimizer state for those alone, in float32."""
    from transformers import AutoTokenizer
    from conftest import ROOT
    from lopti_minimal import gpu_memory, models
    from lopti_minimal.lora import adapter_parameters
    tok = models.chatml_tokenizer(AutoTokenizer.from_pretrained(ROOT / "checkpoints" / "tiny-warm"))
    for base in (tiny_llama(), models.random_qwen2(tok, "scaled-down")):
        for rank in (4, 16):
            m = add_lora(copy.deepcopy(base), rank)
            trained = sum(p.numel() for p in m.parameters() if p.requires_grad)
            assert adapter_parameters(base.config, rank) == trained, (type(base).__name__, rank)
            assert all(p.dtype == torch.float32 for p in m.parameters() if p.requires_grad)
    full = gpu_memory.memory_estimate_gb(3e9, 36, 2, 128, 151936, 16, 4500, 1, optimizer="adamw8bit",
                                       weights="bfloat16", new_tokens=4096)
    lora = gpu_memory.memory_estimate_gb(3e9, 36, 2, 128, 151936, 16, 4500, 1, optimizer="adamw8bit",
                                       weights="bfloat16", new_tokens=4096, lora_params=30e6)
    assert lora["grads"] == pytest.approx(4 * 30e6 / 1e9) and lora["optimizer"] == pytest.approx(2 * 30e6 / 1e9)
    assert lora["weights"] == pytest.approx(full["weights"] + 4 * 30e6 / 1e9)
    assert (lora["reference"], lora["kv_cache"], lora["logits"]) == (full["reference"], full["kv_cache"], full["logits"])
    assert lora["peak"] < full["peak"] - 10


# ------------------------------------------------- a bf16 base keeps the update (lora.py, choice 4)

def bf16_base_and_update(nano_dir, tmp_path):
    """(base folder, base, trained, tokenizer, batch, cfg): nano's Llama saved in bf16 (the
    base, as a GPU loads one), and on it rank-4 adapters (float32, as peft keeps them) after
    one AdamW step of lr 1e-4 on an AR-free GRPO loss: a small update, most of it below the
    grid of the base's bf16 weights."""
    from lopti_minimal.models import load_model_and_tokenizer
    base, tok = load_model_and_tokenizer(nano_dir, dtype=torch.bfloat16, device="cpu")
    folder = tmp_path / "base-bf16"
    base.save_pretrained(folder)
    tok.save_pretrained(folder)
    trained = add_lora(copy.deepcopy(base), rank=4)
    prompts = [tok(text=t)["input_ids"] for t in ("Alice says Bob is a knight.", "Bob lies.")]
    r = sample_groups(trained, prompts, group_size=4, max_new_tokens=8, temperature=1.0,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                      generator=torch.Generator().manual_seed(0))
    b = update_batch(r, group_advantages(REWARDS[:8], G))
    cfg = TrainConfig(temperature=1.0, kl_coef=0.0, mini_batch_size=8, micro_batch_size=8)
    opt = torch.optim.AdamW([p for p in trained.parameters() if p.requires_grad], lr=1e-4)
    grpo_update(trained, opt, b, cfg)
    return folder, base, trained, tok, b, cfg


def gap(b, x, y) -> float:
    """The largest difference of two [B, R] log-probs over the response tokens."""
    return float((x.float() - y.float())[b.response_mask > 0].abs().max())


def test_the_saved_policy_of_a_bf16_base_keeps_its_update(nano_dir, tmp_path):
    """runs.save_hf_atomic merges in float32 and saves float32: the policy eval.py loads from
    the run (resolve_model_source, the CPU's float32 load) has the trained policy's log-probs
    to float32 rounding -- the trained one computed in float32, its bf16 base weights exact
    there -- and not the base's. The bf16 merge of before lost most of the update. eval.py
    --model RUN decodes what the trained policy decodes (both in float32, --no-bf16; under
    bf16 autocast both round their compute)."""
    import json
    from safetensors.torch import load_file
    from conftest import load_script
    from lopti_minimal import runs
    from lopti_minimal.models import load_model_and_tokenizer
    from lopti_minimal.task import kk
    from lopti_minimal.task.evaluate import evaluate_records
    folder, base, trained, tok, b, cfg = bf16_base_and_update(nano_dir, tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"kind": runs.RUN_MARKER, "config": runs.config_to_json(
        TrainConfig(model=str(folder), lora_rank=4))}))
    runs.save_hf_atomic(trained, tok, run / "final")
    assert {v.dtype for v in load_file(str(run / "final" / "model.safetensors")).values()} == {torch.float32}
    assert next(trained.parameters()).dtype == torch.bfloat16 and len(adapter_state(trained)) > 0   # untouched

    source, _ = runs.resolve_model_source(str(run))
    loaded, _ = load_model_and_tokenizer(source, device="cpu")
    trained32 = copy.deepcopy(trained).float()               # the same function, computed in float32
    want = batch_logprobs(trained32, b, cfg)
    assert gap(b, batch_logprobs(loaded, b, cfg), want) <= 1e-5
    assert gap(b, batch_logprobs(base.float(), b, cfg), want) >= 1e-3          # the update is there
    bf16_merge = copy.deepcopy(trained).merge_and_unload().float()             # what was saved before
    assert gap(b, batch_logprobs(bf16_merge, b, cfg), want) >= 1e-4            # ... lost most of it

    out = tmp_path / "eval.json"
    rc = load_script("eval.py").main(["--model", str(run), "--sizes", "3", "--per-size", "2",
                                      "--max-new-tokens", "8", "--device", "cpu", "--no-bf16", "--no-progress",
                                      "--save-responses", "--out", str(out)])
    assert rc == 0
    got = [json.loads(line)["response"] for line in out.with_suffix(".responses.jsonl").read_text().splitlines()]
    mine = evaluate_records(trained32, tok, kk.load_official([3])[:2], max_new_tokens=8, progress=False,
                            keep_responses=True)["responses"]
    assert got == [r["response"] for r in mine]


def test_an_adapter_folder_merges_in_float32(nano_dir, tmp_path):
    """lora.load_adapter_folder merges in float32, then loads in the dtype asked for: float32
    gives the trained policy to float32 rounding; bf16 rounds the float32 merge once, as a
    bf16 load rounds any checkpoint."""
    from lopti_minimal.lora import save_adapter
    from lopti_minimal.models import load_model_and_tokenizer
    folder, base, trained, tok, b, cfg = bf16_base_and_update(nano_dir, tmp_path)
    save_adapter(trained, str(tmp_path / "adapter"), base=str(folder), dtype=torch.float32)
    f32, _ = load_model_and_tokenizer(str(tmp_path / "adapter"), dtype=torch.float32, device="cpu")
    want = batch_logprobs(copy.deepcopy(trained).float(), b, cfg)
    assert gap(b, batch_logprobs(f32, b, cfg), want) <= 1e-5
    assert gap(b, batch_logprobs(base.float(), b, cfg), want) >= 1e-3
    bf16, _ = load_model_and_tokenizer(str(tmp_path / "adapter"), dtype=torch.bfloat16, device="cpu")
    merged = merged_copy(trained).to(torch.bfloat16).state_dict()
    assert all(torch.equal(v, merged[k]) for k, v in bf16.state_dict().items())


def test_the_adapter_loader_merges_in_float32_for_a_bf16_load(nano_dir, tmp_path, monkeypatch):
    """lora.load_adapter_folder hands peft a float32 model whatever the load dtype, so that
    W + s * B A is computed and summed in float32 and rounded once. On the CPU peft itself
    merges a bf16 layer through float32 (the weights alone cannot tell), on a GPU it does not
    (B A and the sum round in bf16): the dtype peft is given is what this test pins, with
    the loaded weights equal to the float32 merge rounded once."""
    import peft
    from lopti_minimal.lora import save_adapter
    from lopti_minimal.models import load_model_and_tokenizer
    folder, base, trained, tok, b, cfg = bf16_base_and_update(nano_dir, tmp_path)
    save_adapter(trained, str(tmp_path / "adapter"), base=str(folder), dtype=torch.float32)
    seen, real = [], peft.get_peft_model

    def spy(model, config, *args, **kwargs):
        seen.append(next(model.parameters()).dtype)
        return real(model, config, *args, **kwargs)
    monkeypatch.setattr(peft, "get_peft_model", spy)
    loaded, _ = load_model_and_tokenizer(str(tmp_path / "adapter"), dtype=torch.bfloat16, device="cpu")
    assert seen == [torch.float32] and next(loaded.parameters()).dtype == torch.bfloat16
    once = merged_copy(trained).to(torch.bfloat16).state_dict()
    assert all(torch.equal(v, once[k]) for k, v in loaded.state_dict().items())


def test_a_lora_run_also_saves_its_adapter_that_names_its_start(nano_dir, tmp_path):
    """A LoRA run ends with RUN_DIR/adapter (peft's adapter_config.json and weights, float32)
    beside the merged final/: loaded alone, on its start, it is the same policy as final/."""
    import json
    from pathlib import Path
    from safetensors.torch import load_file
    from test_trainer import length_reward, small_cfg
    from lopti_minimal import trainer
    from lopti_minimal.models import load_model_and_tokenizer
    cfg = small_cfg(nano_dir, tmp_path, method="grpo", lora_rank=4, steps=1, lr=3e-2, threads=1, device="cpu")
    res = trainer.train(cfg, reward_fn=length_reward, log=lambda s: None)
    adapter = Path(res["paths"]["adapter"])
    saved = json.loads((adapter / "adapter_config.json").read_text())
    assert saved["base_model_name_or_path"] == nano_dir and saved["r"] == 4
    assert {v.dtype for v in load_file(str(adapter / "adapter_model.safetensors")).values()} == {torch.float32}
    a, tok = load_model_and_tokenizer(str(adapter), dtype=torch.float32, device="cpu")
    f, _ = load_model_and_tokenizer(res["paths"]["final_model"], dtype=torch.float32, device="cpu")
    sa, sf = a.state_dict(), f.state_dict()
    assert set(sa) == set(sf) and all(torch.allclose(sa[k], sf[k], atol=1e-6, rtol=0) for k in sa)
