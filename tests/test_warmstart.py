"""Supervised warm start: response-only loss, batching, schedule, a short
run that saves a loadable Hugging Face checkpoint, the `tiny_warm` fixture's spread of
token probabilities, and the shipped checkpoint."""
import json
import os

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from conftest import ROOT, load_script
from lopti_minimal.experiments import warmstart, warmstart_data
from lopti_minimal.experiments.warmstart import WarmStartConfig, lr_at, response_loss, size_weights
from lopti_minimal.experiments.warmstart_data import bucketed_batches, collate, encode_example
from lopti_minimal.models import count_parameters, kk_prompt, load_model_and_tokenizer, make_tiny_model
from lopti_minimal.task import dataset, kk, prompts

SHIPPED = os.path.join(ROOT, "checkpoints", "tiny-warm")          # the default: two behaviours
DERIVE = os.path.join(ROOT, "checkpoints", "tiny-derive")         # canonical derivations only
SHIPPED_STAGE1 = os.path.join(ROOT, "checkpoints", "tiny-warm-stage1")   # its stage 1 (phrased)
DERIVE_STAGE1 = os.path.join(ROOT, "checkpoints", "tiny-derive-stage1")   # tiny-derive's (canonical)


def _stored_dtypes(folder):
    from safetensors import safe_open
    with safe_open(os.path.join(folder, "model.safetensors"), "pt") as f:
        return {f.get_tensor(k).dtype for k in f.keys()}


def _example(tok, n=3, i=0):
    r = kk.load_official([n])[i]
    return r, encode_example(tok, prompts.compact_prompt(r["quiz"]), prompts.target_response(r))


def test_encode_example_layout(kk_tokenizer):
    tok = kk_tokenizer
    r, (ids, n_prompt) = _example(tok)
    assert ids[0] == tok.bos_token_id and ids[-1] == tok.eos_token_id
    assert tok.decode(ids[:n_prompt], skip_special_tokens=True) == prompts.compact_prompt(r["quiz"])
    assert tok.decode(ids[n_prompt:], skip_special_tokens=True) == prompts.target_response(r)
    assert tok.convert_ids_to_tokens(ids[n_prompt - 1]) == "<think>"


def test_collate_masks_prompt_and_padding_and_keeps_eos(kk_tokenizer):
    tok = kk_tokenizer
    ex = [_example(tok, 3, 0)[1], _example(tok, 4, 1)[1]]
    ids, attn, mask = collate(ex, tok.pad_token_id)
    assert ids.shape[1] % warmstart_data.PAD_MULTIPLE == 0
    for b, (seq, n_prompt) in enumerate(ex):
        L = len(seq)
        assert attn[b].sum() == L and (ids[b, L:] == tok.pad_token_id).all()
        # mask[t] trains the prediction of token t+1: exactly the response and its eos.
        trained = mask[b].nonzero().squeeze(-1) + 1
        assert trained.tolist() == list(range(n_prompt, L))
        assert ids[b, trained[-1]] == tok.eos_token_id


def test_response_loss_is_mean_nll_of_response_tokens_only(kk_tokenizer):
    tok = kk_tokenizer
    model = make_tiny_model("nano", len(tok), tokenizer=tok, seed=0)
    ex = [_example(tok, 3, 0)[1], _example(tok, 3, 1)[1]]
    ids, attn, mask = collate(ex, tok.pad_token_id)
    assert (attn == 0).any()   # rows of different lengths: the shorter one is padded
    ours = response_loss(model, ids, mask, bf16=False)
    torch.testing.assert_close(response_loss(model, ids, mask, bf16=False, attention_mask=attn), ours)
    # Reference: transformers' own loss with -100 on the prompt and the padding, and the
    # padding mask passed (ours passes none: right padding + causal attention).
    labels = ids.clone()
    for b, (seq, n_prompt) in enumerate(ex):
        labels[b, :n_prompt] = -100
        labels[b, len(seq):] = -100
    ref = model(input_ids=ids, attention_mask=attn, labels=labels).loss
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)
    # Changing a prompt token changes the context, never which tokens are scored.
    assert mask.sum() == (labels[:, 1:] != -100).sum()
    # With a constant normalizer (the two behaviours): the same sum, divided by the constant.
    torch.testing.assert_close(response_loss(model, ids, mask, bf16=False, normalizer=1000.0),
                               ours * mask.sum() / 1000.0)


def test_two_behaviour_warm_start_weighs_every_token_alike(kk_tokenizer, tmp_path):
    """With guess_share > 0 the warm start divides each batch's loss by one constant per
    puzzle size (batch size x mean response tokens), so a batch of short guesses does not
    weigh its examples more than a batch of derivations (a per-batch mean collapsed the
    mixture to guesses); without, it keeps the per-batch mean."""
    seen = []
    orig = warmstart.response_loss

    def spy(*args, normalizer=None, **kw):
        seen.append(normalizer)
        return orig(*args, normalizer=normalizer, **kw)

    warmstart.response_loss = spy
    try:
        for share in (0.0, 0.65):
            cfg = WarmStartConfig(preset="nano", out=str(tmp_path / f"w{share}"), steps=4, tokens_per_batch=1024,
                                  curriculum=((0.0, {3: 1}),), eval_per_size=0, final_eval_per_size=0,
                                  progress=False, guess_share=share, phrased=share > 0)
            warmstart.warm_start(cfg, tokenizer=kk_tokenizer, log=lambda s: None)
    finally:
        warmstart.response_loss = orig
    assert seen[:4] == [None] * 4
    assert len(set(seen[4:])) == 1 and 20 < seen[4] < 1024, seen


def test_bucketed_batches_keep_every_example_once_and_cut_padding(kk_tokenizer):
    import random
    tok = kk_tokenizer
    recs = dataset.generate_records(4, 48, seed=7)
    ex = [encode_example(tok, prompts.compact_prompt(r["quiz"]), prompts.target_response(r)) for r in recs]
    batches = bucketed_batches(ex, 6, random.Random(0))
    assert [len(b) for b in batches] == [6] * 8
    assert sorted(e for b in batches for e in b) == sorted(ex)          # each example once
    # Neighbours in length: sorted by their shortest row, no two batches' ranges interleave.
    spans = sorted((min(len(e[0]) for e in b), max(len(e[0]) for e in b)) for b in batches)
    assert all(hi <= nxt_lo for (_, hi), (nxt_lo, _) in zip(spans, spans[1:]))
    # The order of batches is shuffled (not short-to-long), the same for the same seed.
    assert spans != [(min(len(e[0]) for e in b), max(len(e[0]) for e in b)) for b in batches]
    assert batches == bucketed_batches(ex, 6, random.Random(0))

    def padded_positions(bs):
        return sum(collate(b, tok.pad_token_id)[0].numel() for b in bs)
    drawn = [ex[i:i + 6] for i in range(0, 48, 6)]
    assert padded_positions(batches) < 0.85 * padded_positions(drawn)


def test_schedule_and_curriculum():
    cfg = WarmStartConfig(lr=1e-3, warmup_steps=10, min_lr_ratio=0.1)
    assert lr_at(0.0, 0, cfg) == pytest.approx(1e-4)
    assert lr_at(0.0, 10, cfg) == pytest.approx(1e-3)
    assert lr_at(0.5, 500, cfg) == pytest.approx(0.55e-3)
    assert lr_at(1.0, 1000, cfg) == pytest.approx(1e-4)
    assert lr_at(0.3, 300, cfg) > lr_at(0.6, 600, cfg)
    sizes = [max(size_weights(p, cfg)) for p in (0.0, 0.1, 0.3, 0.9)]
    assert sizes == sorted(sizes) and sizes[0] == 3 and sizes[-1] == 5


def test_puzzle_stream_mixes_in_the_asked_share_of_unsolvable_puzzles():
    plain = warmstart_data.PuzzleStream(seed=3, exclude=set(), chunk=64)
    assert all(kk.count_solutions(kk.record_statements(plain.next(3))) == 1 for _ in range(50))
    mixed = warmstart_data.PuzzleStream(seed=3, exclude=set(), chunk=64, unsolvable_share=0.25)
    drawn = [mixed.next(3) for _ in range(400)]
    unsolvable = [r for r in drawn if r.get("solvable") is False]
    assert 0.18 < len(unsolvable) / len(drawn) < 0.32
    assert all(kk.count_solutions(kk.record_statements(r)) == 0 for r in unsolvable)
    assert all(kk.count_solutions(kk.record_statements(r)) == 1 for r in drawn if r not in unsolvable)


def test_short_warm_start_saves_loadable_checkpoint(kk_tokenizer, tmp_path):
    out = str(tmp_path / "ck")
    cfg = WarmStartConfig(preset="nano", out=out, steps=12, lr=5e-3, warmup_steps=2,
                          tokens_per_batch=1024, curriculum=((0.0, {3: 1}),), eval_sizes=(3,),
                          eval_per_size=2, heldout_per_size=2, eval_every_steps=6,
                          final_eval_sizes=(3,), final_eval_per_size=2,
                          max_new_tokens={3: 8}, progress=False)
    model, tok, history = warmstart.warm_start(cfg, tokenizer=kk_tokenizer, log=lambda s: None)
    assert [h["step"] for h in history] == [6, 12, 12] and history[-1]["final"]
    assert set(history[-1]["official"][3]) >= {"accuracy", "format", "mean_tokens"}
    # A Hugging Face folder: bf16 safetensors, config, tokenizer, and our run record.
    files = set(os.listdir(out))
    assert {"model.safetensors", "config.json", "tokenizer.json", "warmstart.json"} <= files
    assert _stored_dtypes(out) == {torch.bfloat16}
    loaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.bfloat16)
    assert AutoTokenizer.from_pretrained(out)("Amelia")["input_ids"] == tok("Amelia")["input_ids"]
    info = json.load(open(os.path.join(out, "warmstart.json")))
    assert info["config"]["preset"] == "nano" and len(info["history"]) == 3
    assert info["machine"]["cores"] == os.cpu_count()          # step rates depend on it
    sd = model.state_dict()
    for k, v in loaded.state_dict().items():
        torch.testing.assert_close(v, sd[k].to(torch.bfloat16))


def test_loss_falls_in_a_short_run(kk_tokenizer, tmp_path):
    seen = []
    orig = warmstart.response_loss

    def spy(*a, **k):
        loss = orig(*a, **k)
        seen.append(loss.item())
        return loss

    warmstart.response_loss = spy
    try:
        cfg = WarmStartConfig(preset="nano", out=str(tmp_path / "ck"), steps=40, lr=1e-2,
                              warmup_steps=5, tokens_per_batch=1024, curriculum=((0.0, {3: 1}),),
                              eval_per_size=0, heldout_per_size=0, final_eval_per_size=0, progress=False)
        warmstart.warm_start(cfg, tokenizer=kk_tokenizer, log=lambda s: None)
    finally:
        warmstart.response_loss = orig
    assert sum(seen[-5:]) / 5 < 0.6 * sum(seen[:5]) / 5, seen


def test_tiny_warm_fixture_spreads_token_probabilities(tiny_warm):
    """The per-bin gradient tests need many response tokens below p = 0.25 and above 0.75."""
    model, tok = tiny_warm
    records = dataset.generate_records(3, 8, seed=4242)
    ex = [encode_example(tok, kk_prompt(r, tok), prompts.target_response(r)) for r in records]
    ids, attn, mask = collate(ex, tok.pad_token_id)
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids, attention_mask=attn).logits[:, :-1].float(), -1)
    p = logp.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1).exp()[mask > 0]
    low, high = (p < 0.25).float().mean().item(), (p > 0.75).float().mean().item()
    assert low > 0.05 and high > 0.3, (low, high)


# --- the shipped checkpoint -------------------------------------------------------------

@pytest.mark.parametrize("folder", [SHIPPED, DERIVE])
def test_shipped_checkpoint_is_small_bf16_and_round_trips(folder):
    assert os.path.isdir(folder), f"the shipped checkpoint {folder} is missing"
    size = os.path.getsize(os.path.join(folder, "model.safetensors"))
    assert size < 20 * 2**20
    model, tok = load_model_and_tokenizer(folder, device="cpu")
    assert _stored_dtypes(folder) == {torch.bfloat16}
    assert AutoModelForCausalLM.from_pretrained(folder) is not None
    assert 1_000_000 < count_parameters(model) < 20_000_000
    for r in kk.load_official():
        for text in (r["quiz"], r["solution_text_format"]):
            assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text


def test_tiny_derive_answers_in_format_and_above_chance():
    """Greedy on 20 official 3-person puzzles: well formed and right far above chance
    (0.125); measured 1.00 format and 0.55 accuracy (bf16 rounding may flip a response).
    The full per-size figures of its final evaluation are in warmstart.json."""
    model, tok = load_model_and_tokenizer(DERIVE, device="cpu")
    recs = kk.load_official([3])[:20]
    res = warmstart.evaluate(model, tok, recs, 640)[3]
    assert res["format"] >= 0.95, res
    assert res["accuracy"] >= 0.4, res


def test_shipped_warm_start_mostly_guesses_greedy_and_derives_when_sampled():
    """The two behaviours (behaviours.py) of the default warm start: greedy it guesses on
    at least 60% of official 3-person puzzles (the target; measured on 20 here), always in
    format; sampled at T 0.7 some responses derive, and those are right far more often
    than chance -- the behaviour RL selects."""
    from lopti_minimal.task.behaviours import DERIVE as DERIVES, GUESS, behaviour_of
    from lopti_minimal.task.evaluate import evaluate_records
    model, tok = load_model_and_tokenizer(SHIPPED, device="cpu")
    recs = kk.load_official([3])[:20]
    greedy = evaluate_records(model, tok, recs, max_new_tokens=640, prompt_style="compact",
                              progress=False, keep_responses=True)
    texts = [x["response"] for x in greedy["responses"]]
    assert sum(behaviour_of(t) == GUESS for t in texts) >= 12, texts
    assert greedy["per_size"][3]["format_error"] == 0.0
    sampled = evaluate_records(model, tok, recs, max_new_tokens=640, prompt_style="compact", samples=8,
                               temperature=0.7, seed=0, progress=False, keep_responses=True)
    rows = [(behaviour_of(x["response"]), x["correct"]) for x in sampled["responses"]]
    derived = [right for b, right in rows if b == DERIVES]
    assert 0.1 < len(derived) / len(rows) < 0.5, len(derived)
    assert sum(derived) / len(derived) > 0.3, derived


def test_shipped_warm_start_samples_tokens_of_every_probability():
    """The shipped warm start's phrasing (phrasing.py, learned from the first step): at the
    rollout temperature a fifth of its sampled tokens have pi_old < 0.5 (measured 0.22 on
    256 samples; tiny-derive 0.012), in the derivations as much as
    in the guesses. scripts/token_bins.py's measurement, on 6 puzzles x 8 samples."""
    tb = load_script("scripts/token_bins.py")
    model, tok = load_model_and_tokenizer(SHIPPED, device="cpu")
    res = tb.measure(model, tok, prompts=6, group_size=8)
    assert res["all"]["below_0.5"] >= 0.15 and res["derive"]["below_0.5"] >= 0.15, res
    assert 0.05 <= res["derive_share"] <= 0.5, res



def test_the_80_20_rule_never_trains_the_shipped_warm_starts_decision_token():
    """Why the entropy_top arm does not select derivations (docs/TOKEN_FIXES.md): the first
    response token decides guess or derive, a two-way choice of at most ln 2 nats (0.5 at
    the warm start's 23% derivations), while the batch's 80th entropy percentile sits at or
    above ln 2, set by the three-way phrasing choices and the guesses' random roles. So at
    rho = 0.2 no row keeps it; the 70th percentile (rho = 0.3) is already among the
    near-certain tokens, below every row's decision entropy. scripts/token_selection.py's
    measurement, on one batch of 4 x 8."""
    es = load_script("scripts/token_selection.py")
    model, tok = load_model_and_tokenizer(SHIPPED, device="cpu")
    (b,) = es.measure(model, tok, steps=1, prompts=4, top=0.2)
    assert b["decision"]["kept"] == 0.0 and max(b["decision_entropies"]) < b["tau"], b
    assert b["tau"] > 0.6 and 0.15 <= b["kept_share"] <= 0.25, b
    assert b["bins_of_kept"][1] > 0.8                     # the kept tokens: pi_old in [.25, .5)
    assert b["tau_by_top"][0.3] < min(b["decision_entropies"]), b

def _recipe_runs(runs):
    """The WarmStartConfig of each command line of a recipe, with its --init."""
    from lopti_minimal.cli import given
    out = []
    for args in runs:
        ns = warmstart.build_parser().parse_args(args)
        cfg = WarmStartConfig(**given(ns, WarmStartConfig))
        cfg.init = ns.init
        out.append(cfg)
    return out


def _check_record_against_recipe(stage1_folder, folder, want1, want2):
    """The two runs' records (warmstart.json) against the recipe's command lines. The
    paths the runs were made with are not compared: the checkpoints were moved here."""
    stage1 = json.load(open(os.path.join(stage1_folder, "warmstart.json")))
    stage2 = json.load(open(os.path.join(folder, "warmstart.json")))
    c1, c2, defaults = stage1["config"], stage2["config"], WarmStartConfig()
    assert c1["init"] is None and c1.get("unsolvable_share", 0.0) == 0.0           # from scratch
    assert c2["init"] is not None                                                 # from a stage 1
    assert (c1["minutes"], c1.get("steps"), c1["preset"], c1["bucket_batches"], c1["heldout_per_size"]) == \
        (want1.minutes, want1.steps, want1.preset, defaults.bucket_batches, want1.heldout_per_size)
    for c, want in ((c1, want1), (c2, want2)):
        assert (c.get("phrased", False), c.get("phrase_tails", False)) == (want.phrased, want.phrase_tails)
    assert (c2["minutes"], c2["lr"], c2["unsolvable_share"]) == (want2.minutes, want2.lr, want2.unsolvable_share)
    assert (c2.get("guess_share", 0.0), c2["bucket_batches"]) == (want2.guess_share, want2.bucket_batches)
    final = stage2["history"][-1]
    assert final["final"] and all(final["official"][str(n)]["n"] == 100 for n in range(3, 8))
    return stage1, final


def test_shipped_checkpoint_record_follows_the_recipe():
    """checkpoints/tiny-warm is the two runs of warmstart.recipe() (docs/TASK_AND_MODELS.md):
    stage 1 from scratch with phrased derivations for STAGE1_STEPS steps
    (checkpoints/tiny-warm-stage1), stage 2 from it on the two behaviours. Its final greedy
    evaluation on 100 official puzzles per size is in format on at least 99% of 3..5-person
    puzzles, and its greedy policy guesses: accuracy near chance (1/8) on 3 people."""
    runs = warmstart.recipe()
    want1, want2 = _recipe_runs(runs)
    assert runs[1][runs[1].index("--init") + 1] == "checkpoints/tiny-warm-stage1"   # train.py passes absolute paths
    assert want1.phrased and want1.phrase_tails and want1.steps == warmstart.STAGE1_STEPS
    stage1, final = _check_record_against_recipe(SHIPPED_STAGE1, SHIPPED, want1, want2)
    assert stage1["history"][-1]["step"] == warmstart.STAGE1_STEPS
    assert all(final["official"][str(n)]["format"] >= 0.99 for n in (3, 4, 5))
    assert final["official"]["3"]["accuracy"] <= 0.25


def test_a_time_bound_recipe_replaces_the_step_budget_of_stage_1():
    """--recipe --minutes M (train.py --warmstart-minutes M): stage 1 stops after M minutes
    instead of STAGE1_STEPS steps; the second run is unchanged."""
    runs = warmstart.recipe(minutes=30)
    timed, stepped = _recipe_runs(runs), _recipe_runs(warmstart.recipe())
    assert timed[0].minutes == 30 and timed[0].steps is None and stepped[0].steps == warmstart.STAGE1_STEPS
    assert runs[1] == warmstart.recipe()[1]


def test_tiny_derive_record_meets_the_targets():
    """checkpoints/tiny-derive is warmstart.recipe(derive_only=True): canonical derivations,
    both runs within 2 hours; accuracy 0.40 / 0.20 on 3 / 4 people, format +1 on at least
    99% of 3..5-person puzzles."""
    want1, want2 = _recipe_runs(warmstart.recipe(DERIVE, derive_only=True))
    assert not (want1.phrased or want2.phrased) and want2.guess_share == 0.0
    stage1, final = _check_record_against_recipe(DERIVE_STAGE1, DERIVE, want1, want2)
    stage2 = json.load(open(os.path.join(DERIVE, "warmstart.json")))
    assert stage1["history"][-1]["minutes"] + stage2["history"][-1]["minutes"] <= 120   # 2 CPU-hours
    assert final["official"]["3"]["accuracy"] >= 0.40 and final["official"]["4"]["accuracy"] >= 0.20
    assert all(final["official"][str(n)]["format"] >= 0.99 for n in (3, 4, 5))


def test_teacher_forced_errors_attributes_every_response_token(tiny_warm):
    """scripts/teacher_forced_errors.py: every response token gets
    exactly one kind of line, the derivation's kinds are all present, and the counts of
    wrong tokens are bounded by the token counts."""
    tfe = load_script("scripts/teacher_forced_errors.py")
    assert tfe.line_kind("  Amelia: not Evelyn (at Evelyn)") == "claim"
    assert tfe.line_kind("try Amelia=T Penelope=F") == "try"
    assert tfe.line_kind("  Amelia=T: not Evelyn=F = T ok") == "check"
    assert tfe.line_kind("  Evelyn=F: Penelope=T iff not Penelope=T = T bad") == "check"
    assert tfe.line_kind("found Amelia=T") == "found"
    assert tfe.line_kind("<answer> (1) Amelia is a knight") == "other"
    model, tok = tiny_warm
    recs = kk.load_official([3])[:2]
    tokens, wrong, nll, first = tfe.errors_for(model, tok, recs)
    encoded = [encode_example(tok, warmstart_data.default_prompt(r), warmstart_data.default_response(r)) for r in recs]
    n_response = sum(len(ids) - n_prompt for ids, n_prompt in encoded)
    assert sum(tokens.values()) == n_response
    assert {"claim", "try", "check", "found", "other"} <= set(tokens)
    assert all(0 <= wrong[k] <= tokens[k] for k in tokens) and sum(first.values()) <= len(recs)


def test_format_errors_script_tells_an_exhausted_search_from_a_mid_search_loop():
    """scripts/format_errors.py on hand-made responses."""
    fe = load_script("scripts/format_errors.py")
    ran_out = "\ntry A=T\n  A=T: B=F = F bad\ntry A=F\ntry A=F B=T\n  x bad\ntry A=F B=F\n  x bad\ntry A=F B=T\n"
    mid = "\ntry A=T\ntry A=T B=T\n  x bad\ntry A=T\n"
    assert fe.classify(ran_out) == "loop after the search ran out"
    assert fe.classify(mid) == "loop mid-search"
    assert fe.classify("\ntry A=T\nfound A=T\n</think>") == "no repeated node"



def test_warmstart_curves_script_lines_up_two_runs_by_evaluation(tmp_path):
    """scripts/warmstart_curves.py: one row per
    evaluation, each run's step and accuracies in its own columns, a shorter run blank."""
    wc = load_script("scripts/warmstart_curves.py")
    ev = lambda step, acc, final=False: {"step": step, "minutes": step / 100, "final": final,  # noqa: E731
                                         "official": {"3": {"accuracy": acc}}, "heldout": {"3": {"accuracy": acc / 2}}}
    rows = wc.table({"a": [ev(100, 0.25), ev(200, 0.5, final=True)], "b": [ev(100, 0.75)]}).split("\n")
    assert rows[0] == "| eval | a step | min | off 3p | held 3p | b step | min | off 3p | held 3p |"
    assert rows[2] == "| 1 | 100 | 1 | 0.250 | 0.125 | 100 | 1 | 0.750 | 0.375 |"
    assert rows[3] == "| 2 | 200 (final) | 2 | 0.500 | 0.250 |  |  |  |  |"
    assert len(wc.load_history(SHIPPED_STAGE1)) == 8

def test_an_interrupted_warm_start_resumes_exactly(kk_tokenizer, tmp_path):
    """Interrupted after the state saved at step 4 and resumed, a run ends with the same
    weights, evaluations and loss as the same run uninterrupted: the state holds every
    thing the loop changes (optimizer, generators, puzzle stream, queued batches)."""
    def cfg(out):
        return WarmStartConfig(preset="nano", out=str(out), steps=8, lr=5e-3, warmup_steps=2,
                               tokens_per_batch=1024, curriculum=((0.0, {2: 1, 3: 1}),),
                               eval_sizes=(3,), eval_per_size=1, heldout_per_size=1,
                               eval_every_steps=3, final_eval_sizes=(3,), final_eval_per_size=1,
                               max_new_tokens={3: 4}, state_every_steps=4, guess_share=0.5,
                               phrased=True, unsolvable_share=0.2, progress=False, seed=3)

    whole, _, hist_whole = warmstart.warm_start(cfg(tmp_path / "a"), tokenizer=kk_tokenizer,
                                                log=lambda s: None)
    assert not os.path.exists(warmstart.resume_dir(str(tmp_path / "a")))   # removed when complete

    class Interrupt(Exception):
        pass

    def stop_after_state(line):
        if line.startswith("[state] step 4"):
            raise Interrupt

    with pytest.raises(Interrupt):
        warmstart.warm_start(cfg(tmp_path / "b"), tokenizer=kk_tokenizer, log=stop_after_state)
    model, tok, state = warmstart.load_state(str(tmp_path / "b"))
    assert state["step"] == 4 and [h["step"] for h in state["history"]] == [3]
    record = json.load(open(os.path.join(warmstart.resume_dir(str(tmp_path / "b")), "warmstart.json")))
    assert [h["step"] for h in record["history"]] == [3]        # readable while a run goes on
    resumed, _, hist_resumed = warmstart.warm_start(state["config"], model=model, tokenizer=tok,
                                                    resume=state, log=lambda s: None)
    assert [h["step"] for h in hist_resumed] == [3, 6, 8]
    strip = lambda h: [{k: v for k, v in e.items() if k not in ("minutes", "eval_seconds")} for e in h]  # noqa: E731
    assert strip(hist_resumed) == strip(hist_whole)
    for (k, v), w in zip(whole.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(v, w), k


def test_resume_without_saved_state_says_what_is_missing(tmp_path):
    with pytest.raises(SystemExit, match="no saved training state"):
        warmstart.main(["--resume", str(tmp_path / "nothing")])


def test_an_interrupted_recipe_goes_on_with_the_run_it_stopped_in(tmp_path):
    """warmstart.resume_plan: run again, a recipe resumes the run that left a training
    state and skips the runs before it (they completed); with no state, it runs them all."""
    out = str(tmp_path / "warm")
    runs = warmstart.recipe(out)
    stage1, stage2 = (args[args.index("--out") + 1] for args in runs)
    assert warmstart.resume_plan(runs) == runs
    os.makedirs(warmstart.resume_dir(stage1))
    assert warmstart.resume_plan(runs) == [["--resume", stage1] + runs[0], runs[1]]
    os.makedirs(warmstart.resume_dir(stage2))
    assert warmstart.resume_plan(runs) == [["--resume", stage2] + runs[1]]


def test_resume_writes_where_it_was_told_not_where_the_run_first_wrote(kk_tokenizer, tmp_path, monkeypatch):
    """`--resume OUT` keeps writing to OUT: a run moved (or resumed from another working
    directory) must not write to the path saved in its config."""
    first, moved = tmp_path / "first", tmp_path / "moved"
    cfg = WarmStartConfig(preset="nano", out=str(first), steps=4, lr=5e-3, warmup_steps=2,
                          tokens_per_batch=512, curriculum=((0.0, {2: 1}),), eval_per_size=0,
                          heldout_per_size=0, final_eval_per_size=0, state_every_steps=2,
                          progress=False)

    def stop(line):
        if line.startswith("[state] step 2"):
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        warmstart.warm_start(cfg, tokenizer=kk_tokenizer, log=stop)
    os.rename(warmstart.resume_dir(str(first)), warmstart.resume_dir(str(moved)))
    seen = []
    monkeypatch.setattr(warmstart, "warm_start", lambda c, **k: seen.append(c.out) or (None, None, []))
    warmstart.main(["--resume", str(moved)])
    assert seen == [str(moved)]


def test_a_shipped_checkpoint_is_overwritten_only_when_asked(tmp_path, monkeypatch, capsys):
    """--out is required, and a run (one, a recipe, or a resumed one) that would write into
    a checkpoint the repository ships is refused with its name unless --overwrite-shipped
    is given (train.py --rebuild-warmstart gives it)."""
    seen = []
    monkeypatch.setattr(warmstart, "warm_start", lambda c, **k: seen.append(c.out) or (None, None, []))
    with pytest.raises(SystemExit) as e:
        warmstart.main(["--steps", "1"])
    assert e.value.code == 2 and "--out is required" in capsys.readouterr().err
    for args in (["--out", SHIPPED], ["--out", "checkpoints/tiny-warm/"], ["--recipe", "--out", SHIPPED],
                 ["--resume", DERIVE]):
        monkeypatch.chdir(ROOT)
        with pytest.raises(SystemExit) as e:
            warmstart.main(args + ["--steps", "1"])
        err = capsys.readouterr().err
        assert e.value.code == 2 and "would overwrite the shipped checkpoint checkpoints/tiny-" in err, (args, err)
        assert len(err.strip().splitlines()) == 1
    assert seen == [] and warmstart.shipped_checkpoint(str(tmp_path / "mine")) is None
    warmstart.main(["--out", SHIPPED, "--steps", "1", "--overwrite-shipped"])
    warmstart.main(["--out", str(tmp_path / "mine"), "--steps", "1"])
    assert seen == [SHIPPED, str(tmp_path / "mine")]
    # the recipe passes the permission on to both of its runs
    runs = []
    monkeypatch.setattr(warmstart, "resume_plan", lambda r: r)
    real_main = warmstart.main
    monkeypatch.setattr(warmstart, "main", lambda argv: runs.append(argv) if argv[0] != "--recipe" else real_main(argv))
    real_main(["--recipe", "--out", SHIPPED, "--overwrite-shipped"])
    assert len(runs) == 2 and all("--overwrite-shipped" in r for r in runs)
