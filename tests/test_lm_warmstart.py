"""The supervised LoRA warm start of a pretrained LM (experiments/lm_warmstart.py) and the
adapter folders it ships (lora.save_adapter, models.load_model_and_tokenizer).

A nano Llama with a ChatML tokenizer stands in for SmolLM2-135M-Instruct: the same
instruct code path (the paper's prompt through a chat template, <|im_end|> as eos)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from lopti_minimal import models  # noqa: E402
from lopti_minimal.experiments import lm_warmstart as lw  # noqa: E402
from lopti_minimal.lora import add_lora, adapter_state, save_adapter  # noqa: E402
from lopti_minimal.task import kk, reward  # noqa: E402
from lopti_minimal.task.dataset import generate_records  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def chat_nano_dir(tmp_path_factory, nano_dir):
    """A random nano Llama whose tokenizer has the ChatML markers, eos <|im_end|> and a chat
    template, saved as a Hugging Face folder."""
    from transformers import AutoTokenizer
    tok = models.chatml_tokenizer(AutoTokenizer.from_pretrained(nano_dir))
    out = tmp_path_factory.mktemp("chat_nano")
    models.make_tiny_model("nano", len(tok), tokenizer=tok, seed=0).save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


def load(folder):
    return models.load_model_and_tokenizer(folder, dtype=torch.float32, device="cpu")


def small_cfg(base, out, **kw):
    kw = dict(model=base, out=str(out), steps=4, batch_size=2, sizes=(3,), max_response_tokens=10_000,
              lr=1e-2, warmup_steps=1, lora_rank=4, threads=1, progress=False, state_every_steps=0) | kw
    return lw.LMWarmStartConfig(**kw)


@pytest.mark.parametrize("style, marker", [("backtracking", "Assume"), ("compact", "\ntry ")])
def test_target_continues_the_sampled_prompt_and_scores_3(chat_nano_dir, style, marker):
    """The trained sequence is the prompt train.py samples from (models.encode_prompts),
    then a response in the chosen style that the paper's reward scores 3 (format and
    answer), then eos."""
    _, tok = load(chat_nano_dir)
    for r in generate_records(3, 3, seed=5):
        ids, n_prompt = lw.encode(tok, r, style)
        assert ids[:n_prompt] == models.encode_prompts([r], tok, "auto", 10_000)[1][0]
        assert ids[-1] == tok.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")
        response = tok.decode(ids[n_prompt:-1])
        assert reward.score_response(response, r).total == 3
        assert marker in response


def test_adapter_folder_loads_as_base_with_the_adapter_merged(chat_nano_dir, tmp_path):
    """save_adapter writes a few files, no base weights; loading the folder gives the
    adapted model's logits (and not the base's)."""
    base, tok = load(chat_nano_dir)
    x = torch.tensor([tok("Alice says Bob is a knave.")["input_ids"]])
    with torch.no_grad():
        base_logits = base(x).logits
    adapted = add_lora(base, rank=4, seed=1)
    with torch.no_grad():
        for name, p in adapted.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)      # B = 0 at init: the adapter would be a no-op
        want = adapted(x).logits
    out = tmp_path / "adapter"
    save_adapter(adapted, str(out), base=chat_nano_dir, dtype=torch.float32)
    assert sorted(os.listdir(out)) == ["adapter_config.json", "adapter_model.safetensors"]
    loaded, loaded_tok = load(str(out))
    assert len(loaded_tok) == len(tok) and not any("lora_" in k for k in loaded.state_dict())
    with torch.no_grad():
        got = loaded(x).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert (got - base_logits).abs().max() > 1e-3


def run_steps(cfg, stop_after=None):
    """A run's adapter after cfg.steps steps; with ``stop_after``, interrupted there (its
    state saved as the loop saves it) and resumed from the file by a fresh process's path."""
    model, tok = load(cfg.model)
    run = lw.LMWarmStart(cfg, model, tok, log=lambda s: None)
    if stop_after is None:
        run.run()
        return run, adapter_state(run.model)
    for _ in range(stop_after):
        run.train_step()
    lw.save_state(run.state(), cfg.out)
    state = lw.load_state(cfg.out)
    model, tok = load(cfg.model)
    run = lw.LMWarmStart(state["config"], model, tok, resume=state, log=lambda s: None)
    run.run()
    return run, adapter_state(run.model)


def test_resume_goes_on_exactly(chat_nano_dir, tmp_path):
    """4 steps straight and 2 + (save, load, resume) 2 give the same adapter bit for bit;
    the finished run leaves its adapter folder and no resume state."""
    straight, a = run_steps(small_cfg(chat_nano_dir, tmp_path / "a"))
    resumed, b = run_steps(small_cfg(chat_nano_dir, tmp_path / "b"), stop_after=2)
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert [h["loss"] for h in straight.history] == [h["loss"] for h in resumed.history]
    assert any(not torch.equal(v, torch.zeros_like(v)) for k, v in a.items() if "lora_B" in k)   # it trained
    assert (tmp_path / "b" / "adapter_model.safetensors").exists() and not (tmp_path / "b.resume").exists()


def test_training_never_sees_an_evaluation_puzzle():
    """The stream excludes the official test sets and data/heldout3.jsonl by puzzle key."""
    from lopti_minimal.experiments.warmstart_data import PuzzleStream
    heldout = kk.keys_of(kk.load_jsonl(ROOT / "data" / "heldout3.jsonl"))
    keys = lw.excluded_keys("data/heldout3.jsonl")
    assert heldout <= keys and kk.keys_of(kk.load_official()) <= keys
    stream = PuzzleStream(0, exclude=keys)
    drawn = kk.keys_of([stream.next(3) for _ in range(600)])
    assert not drawn & keys


def test_budget_skips_long_targets(chat_nano_dir, tmp_path):
    """Targets longer than max_response_tokens are never in a batch (their puzzles skipped)."""
    model, tok = load(chat_nano_dir)
    run = lw.LMWarmStart(small_cfg(chat_nano_dir, tmp_path / "c", max_response_tokens=200), model, tok,
                         log=lambda s: None)
    for _ in range(3):
        ids, _, mask = run.batch()
        assert mask.sum(1).max() <= 200
    assert run.skipped > 0


def test_style_chooses_the_chain_of_thought_trained_on(chat_nano_dir, tmp_path):
    """--style reaches the batches: the response tokens of a batch are the official
    backtracking text or the compact trace."""
    for style, marker, other in (("backtracking", "Assume", "\ntry "), ("compact", "\ntry ", "Assume")):
        model, tok = load(chat_nano_dir)
        run = lw.LMWarmStart(small_cfg(chat_nano_dir, tmp_path / style, style=style), model, tok,
                             log=lambda s: None)
        ids, _, mask = run.batch()
        response = tok.decode(ids[0, 1:][mask[0].bool()])      # mask[t]: the target ids[t + 1]
        assert marker in response and other not in response


def test_more_training_continues_the_init_folders_style(tmp_path):
    """--init without --style continues the style its folder was trained on: the shipped
    compact adapter's, and the first adapter's (whose warmstart.json predates --style:
    backtracking); a folder without warmstart.json leaves the default."""
    assert lw.trained_style(str(ROOT / "checkpoints" / "smollm2-kk-sft-compact")) == "compact"
    assert lw.trained_style(str(ROOT / "checkpoints" / "smollm2-kk-sft")) == "backtracking"
    assert lw.trained_style(str(tmp_path)) is None


def test_bad_input_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        lw.main(["--steps", "3"])
    assert e.value.code == 2 and "--out is required" in capsys.readouterr().err
    folder = tmp_path / "x.resume"
    folder.mkdir()
    import pickle
    (folder / lw.STATE_FILE).write_bytes(pickle.dumps({"format": 2, "f": os.system}))
    with pytest.raises(SystemExit) as e:
        lw.main(["--resume", str(tmp_path / "x")])
    assert e.value.code == 2 and "nothing in it ran" in capsys.readouterr().err


def test_init_continues_from_a_saved_adapter(chat_nano_dir, tmp_path):
    """--init: the run starts from the saved adapter's weights (bf16 as saved, not the
    fresh init), and refuses an adapter of another rank."""
    from safetensors.torch import load_file
    run_steps(small_cfg(chat_nano_dir, tmp_path / "a", steps=2))
    saved = load_file(tmp_path / "a" / "adapter_model.safetensors")
    model, tok = load(chat_nano_dir)
    cont = lw.LMWarmStart(small_cfg(chat_nano_dir, tmp_path / "b", init=str(tmp_path / "a"), seed=1),
                          model, tok, log=lambda s: None)
    now = adapter_state(cont.model)
    assert set(now) == set(saved) and all(torch.equal(now[k], saved[k].float()) for k in saved)
    assert any(not torch.equal(v, torch.zeros_like(v)) for k, v in saved.items() if "lora_B" in k)
    with pytest.raises(SystemExit, match="at rank 4, not"):
        lw.init_adapter(small_cfg(chat_nano_dir, tmp_path / "d", init=str(tmp_path / "a"), lora_rank=8))


def test_two_behaviour_targets_guess_or_derive_in_phrased_words(chat_nano_dir, tmp_path):
    """--style two-behaviour (design choice 7): a guess at --guess-share, else a derivation
    phrased with tail words; every derivation scores 3; the loss is divided by the batch's
    expected response tokens (a constant), not by its own count."""
    from lopti_minimal.task import behaviours, phrasing
    model, tok = load(chat_nano_dir)
    run = lw.LMWarmStart(small_cfg(chat_nano_dir, tmp_path / "t", style="two-behaviour", guess_share=0.5,
                                   batch_size=8), model, tok, log=lambda s: None)
    kinds, phrased = [], 0
    for _ in range(3):
        ids, _, mask = run.batch()
        for row in range(ids.shape[0]):
            response = tok.decode(ids[row, 1:][mask[row].bool()]).removesuffix("<|im_end|>")
            kinds.append(behaviours.behaviour_of(response))
            if kinds[-1] == behaviours.DERIVE:
                phrased += phrasing.canonical(response) != response
    assert 0.25 < kinds.count(behaviours.GUESS) / len(kinds) < 0.75 and phrased > 0
    recs = generate_records(3, 20, seed=11)
    derived = [r for r in recs if behaviours.behaviour_of(run.target(r)) == behaviours.DERIVE]
    assert derived and all(reward.score_response(run.target(r), r).total == 3 for r in derived)
    assert run.target(recs[0]) == lw.targets(run.cfg)(recs[0])                  # deterministic per puzzle
    assert 8 * 5 < run.normalizer < 8 * 700                                      # batch x mean tokens
    loss = run.train_step()
    assert run.history[-1]["loss"] == pytest.approx(loss) and loss > 0


def test_guess_share_needs_two_behaviours(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        lw.main(["--out", str(tmp_path / "x"), "--guess-share", "0.7"])
    assert e.value.code == 2 and "--guess-share is for --style two-behaviour" in capsys.readouterr().err


def test_a_two_behaviour_run_resumes_exactly(chat_nano_dir, tmp_path):
    kw = dict(style="two-behaviour", guess_share=0.5, unsolvable_share=0.3)
    straight, a = run_steps(small_cfg(chat_nano_dir, tmp_path / "a", **kw))
    resumed, b = run_steps(small_cfg(chat_nano_dir, tmp_path / "b", **kw), stop_after=2)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [h["loss"] for h in straight.history] == [h["loss"] for h in resumed.history]
