"""Supervised warm start of the tiny model: next-token loss on the response only.

    python -m lopti_minimal.warmstart --preset tiny --threads 2 --out DIR      # one run, 95 minutes
    python -m lopti_minimal.warmstart --recipe          # the shipped checkpoint: `recipe()`, two
                                                        # runs: 14,082 steps (2.6-2.9 h on a 2-core
                                                        # AMD EPYC), then 10 minutes
    python -m lopti_minimal.warmstart --recipe derive --out checkpoints/tiny-derive
    python -m lopti_minimal.warmstart --resume DIR      # go on with an interrupted run (an
                                                        # interrupted --recipe: run it again)

Design choices (in full, with the measurements: docs/TASK_AND_MODELS.md):

1. RL needs a policy that already writes well-formed answers and is sometimes right (a
   group with equal rewards has advantage 0), so the model first imitates generated
   solutions: prompts.compact_prompt + prompts.target_response, loss on the response only.
2. Fast on a 2-core CPU (measured): bf16 autocast on float32 master weights (about 2x),
   as many threads as free cores, a curriculum from small to large puzzles, batches of
   one size length-bucketed (padding ~35% -> ~10%, benchmarks/warmstart_step.py), no
   attention mask (right padding, causal attention: same loss, tests/test_warmstart.py).
3. Cosine learning-rate decay to a small floor, over --minutes or a fixed --steps
   (reproducible).
4. Evaluation: greedy decoding scored by the Logic-RL reward (accuracy: scores 3; format:
   format part +1), per size, on held-out generated puzzles and the official sets.
5. The shipped recipe's second run mixes in 5% unsolvable puzzles (--unsolvable-share), so
   the model has seen a search run out of candidates, and teaches the two behaviours
   (behaviours.py: --guess-share, --phrased) that give RL something to select.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from tqdm import tqdm

from .cli import HelpFormatter, add_options, given, option
from .models import count_parameters, load_model_and_tokenizer, make_tiny_model
from .runs import machine_info, save_hf_atomic
from .task import dataset, explain, kk, prompts
from .task.behaviours import TwoBehaviourTargets
from .task.evaluate import evaluate_records
from .tokenizer import build_kk_tokenizer


# ---------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------

@dataclass
class WarmStartConfig:
    """Every option of a warm-start run, declared once (cli.option: default + help; the
    command line is generated from the fields that have help)."""
    preset: str = option("tiny", "model size (models.make_tiny_model)")
    out: str = option("checkpoints/tiny-warm", "where to write the checkpoint")
    # tiny-derive's stage 1: 95 + the final evaluation (1.6 min measured, docs/EXPERIMENTS.md)
    # fits a 2-hour budget on 2 cores. The shipped recipe bounds its stage 1 by steps (recipe()).
    minutes: float = option(95.0, "wall-clock budget of the training loop (excl. final eval)")
    steps: int | None = option(None, "fixed step budget (overrides --minutes)", type=int)
    lr: float = option(2e-3, "peak AdamW learning rate")
    min_lr_ratio: float = 0.05       # cosine floor, as a fraction of lr
    warmup_steps: int = 50
    weight_decay: float = 0.05
    tokens_per_batch: int = option(4096, "prompt + response tokens per optimizer step")
    # Length bucketing: draw this many batches of one size at once, sort the puzzles by
    # length and cut them into batches of neighbours, used in random order (1: no bucketing).
    bucket_batches: int = option(16, "batches drawn at once and length-bucketed (1: random batches)")
    # Unsolvable puzzles (dataset.generate_unsolvable_records): their trace runs out of
    # candidates and ends in a "guess", which teaches the model to close its answer when
    # its own wrong check has rejected the solution instead of looping.
    unsolvable_share: float = option(0.0, "share of training puzzles drawn unsolvable, whose "
                                     "trace ends in a guess")
    # The two behaviours (behaviours.py): 0 and False = the canonical derivation only
    # (tiny-derive).
    guess_share: float = option(0.0, "share of targets that guess (a random answer at once) "
                                "instead of deriving")
    phrased: bool = option(False, "phrase the derivations freely (phrasing.py): "
                           "reward-irrelevant word choices")
    phrase_tails: bool = option(False, "with --phrased, a tail word at the end of every "
                                "derivation line too (phrasing.TAILS): more choice tokens")
    # Curriculum: (progress, {size: weight}); the last stage whose start <= progress applies.
    curriculum: tuple = ((0.0, {2: 1, 3: 2}), (0.08, {2: 1, 3: 3, 4: 2}),
                         (0.25, {3: 3, 4: 3, 5: 2}), (0.5, {3: 2, 4: 3, 5: 3}))
    vocab_size: int = 1024
    seed: int = option(0, "seed of the puzzles, batches and initial weights")
    threads: int | None = option(None, "torch threads (default: all cores)", type=int)
    bf16: bool = option(True, "train in float32 (about 2x slower on CPU)", flag="--no-bf16")
    eval_every_minutes: float = option(12.0, "periodic evaluation every N minutes")
    eval_every_steps: int | None = option(None, "periodic evaluation every N steps (overrides "
                                          "--eval-every-minutes)", type=int)
    eval_sizes: tuple = (3, 4)       # periodic evaluation (official and held-out)
    eval_per_size: int = option(20, "official puzzles per size at each periodic evaluation (0: none)")
    heldout_per_size: int = option(40, "generated held-out puzzles per size (0: none; selects "
                                   "the checkpoint)")
    final_eval_sizes: tuple = (3, 4, 5, 6, 7)
    final_eval_per_size: int = option(100, "official puzzles per size in the final evaluation")
    # Response caps per size: above the longest compact target seen for sizes 3..5 at
    # the 95th percentile, so a model that has learned the format is never cut short
    # there; 6 and 7 people need longer searches and are capped to keep evaluation cheap.
    # (Phrased derivations with tail words, the shipped warm start's: the longest of 100
    # generated targets plus 100 unsolvable searches has 511 tokens for 3 people, 1,060
    # for 4, 2,212 for 5 -- scripts/phrasing_choices.py, docs/TWO_BEHAVIOURS.md.)
    max_new_tokens: dict = field(default_factory=lambda: {2: 300, 3: 640, 4: 1152, 5: 1600, 6: 2048, 7: 2048})
    progress: bool = option(True, "no tqdm bar (log files)", flag="--no-progress")
    # Nothing lost on interruption: the whole training state (float32 weights, AdamW state,
    # the puzzle stream and the batches queued from it, the random generators, the elapsed
    # time) goes to OUT.resume every N steps; `--resume OUT` continues the run from there
    # exactly (tests/test_warmstart.py); the folder is deleted when the run completes.
    state_every_steps: int = option(500, "save the training state for --resume every N steps "
                                    "(0: never)")
    init: str | None = None          # the checkpoint this run continued from (--init), if any


# ---------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------

def default_prompt(record: dict) -> str:
    return prompts.compact_prompt(record["quiz"])


def default_response(record: dict) -> str:
    return prompts.target_response(record, "compact")


def numbered_response(record: dict) -> str:
    """Variant target: the compact explanation with people written as their numbers
    1..n (the numbering of the answer, "(1) Amelia ..."): only the restated claims and the
    answer then depend on the names, so far fewer tokens need a name lookup."""
    n = record["n_people"]
    text = explain.compact_explanation(statements=kk.record_statements(record),
                                       names=[str(i + 1) for i in range(n)])
    return "\n" + text + "\n" + prompts.answer_block(record["solution_text_format"])


def direct_response(record: dict) -> str:
    """Variant target without explanation: close the thinking at once, then the answer."""
    return "\n" + prompts.answer_block(record["solution_text_format"])


RESPONSE_STYLES = {"compact": default_response, "numbered": numbered_response, "direct": direct_response}


class PuzzleStream:
    """An endless supply of generated training records per size, excluding held-out puzzles.

    Records come in chunks from dataset.generate_records with a fresh seed per chunk (so the
    stream is deterministic for cfg.seed); puzzles of the official test sets and of our
    held-out set are excluded by puzzle key.  Tiny sizes have few distinct puzzles
    (about 180 for 2 people), so a chunk request is capped by what exists.
    """

    def __init__(self, seed: int, exclude: set, chunk: int = 256, unsolvable_share: float = 0.0):
        self.seed, self.exclude, self.chunk = seed, exclude, chunk
        self.buffers: dict[int, list] = {}
        self.calls = 0
        self.unsolvable_share = unsolvable_share
        self.unsolvable: dict[int, list] = {}
        self.coin = random.Random(seed * 31 + 17)     # its own stream: share 0 changes nothing

    def next(self, n: int) -> dict:
        if self.unsolvable_share > 0 and self.coin.random() < self.unsolvable_share:
            return self._next_unsolvable(n)
        buf = self.buffers.setdefault(n, [])
        if not buf:
            seed = self._chunk_seed(n)
            count = self.chunk
            while True:
                try:
                    recs = dataset.generate_records(n, count, seed=seed, exclude=self.exclude)
                    break
                except kk.InfeasibleRequest:
                    count //= 2   # small n: fewer distinct puzzles than a chunk
            random.Random(seed).shuffle(recs)
            buf.extend(recs)
        return buf.pop()

    def _next_unsolvable(self, n: int) -> dict:
        buf = self.unsolvable.setdefault(n, [])
        if not buf:
            buf.extend(dataset.generate_unsolvable_records(n, 64, seed=self._chunk_seed(n)))
        return buf.pop()

    def _chunk_seed(self, n: int) -> int:
        """A fresh generator seed for every chunk (solvable or not), from cfg.seed."""
        self.calls += 1
        return self.seed * 1_000_003 + self.calls * 7919 + n


def encode_example(tokenizer, prompt: str, response: str) -> tuple[list[int], int]:
    """Token ids of prompt + response + eos, and the prompt length (the loss starts there).

    Prompt and response are tokenized separately, exactly as at sampling time, where the
    model continues the tokenized prompt; the tokenizer adds bos in front of the prompt."""
    p = tokenizer(prompt)["input_ids"]
    r = tokenizer(response, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return p + r, len(p)


PAD_MULTIPLE = 64


def collate(examples: list[tuple[list[int], int]], pad_id: int, multiple: int = PAD_MULTIPLE):
    """Right-padded batch: input_ids, attention_mask, loss_mask ([B, T]).

    loss_mask[b, t] = 1 where token t+1 is a response token (or the final eos), i.e. it
    marks the positions whose next-token prediction is trained.

    T is rounded up to a multiple of 64: the CPU's bf16 matmul kernels (oneDNN) are built
    per input shape, and with a new shape every step training ran 2.5x slower and its
    memory kept growing (measured); a few recurring shapes avoid that."""
    T = max(len(ids) for ids, _ in examples)
    T = -(-T // multiple) * multiple
    B = len(examples)
    input_ids = torch.full((B, T), pad_id, dtype=torch.long)
    attn = torch.zeros(B, T, dtype=torch.long)
    loss_mask = torch.zeros(B, T - 1)
    for b, (ids, n_prompt) in enumerate(examples):
        input_ids[b, :len(ids)] = torch.tensor(ids)
        attn[b, :len(ids)] = 1
        loss_mask[b, n_prompt - 1:len(ids) - 1] = 1.0
    return input_ids, attn, loss_mask


def response_loss(model, input_ids, loss_mask, bf16: bool = True, attention_mask=None,
                  normalizer: float | None = None) -> torch.Tensor:
    """Mean next-token cross-entropy over the response tokens (prompt and padding masked);
    with ``normalizer``, their sum divided by that constant instead of by their number.

    Why a constant: with the two behaviours (behaviours.py) and length-bucketed batches, a
    batch of short guesses has far fewer tokens than a batch of derivations, so a
    per-batch mean gives each guess's first token several times the weight of a
    derivation's, and the mixture collapsed to 99.8% guesses (measured); divided by a
    constant, every token of the data weighs the same, and the policy learns the mixture.

    Needs no attention mask (``attention_mask=None``, what the warm start passes; the mask
    of collate gives the same loss, slower), for right-padded batches only: with causal attention
    position t sees positions <= t, which are all real tokens wherever t is one; the pads'
    own predictions are masked out of the loss.  Without a mask SDPA takes its fused causal
    kernel: a step on 2 CPU threads ran 1.08x / 1.16x / 1.23x as fast as with the
    explicit mask on 3- / 4- / 5-person batches (benchmarks/warmstart_step.py, docs/PERFORMANCE.md)."""
    device_type = input_ids.device.type
    with torch.autocast(device_type, dtype=torch.bfloat16, enabled=bf16):
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1]
    nll = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                          input_ids[:, 1:].reshape(-1), reduction="none").view_as(loss_mask)
    return (nll * loss_mask).sum() / (normalizer or loss_mask.sum())


def batch_size_for(stream, n: int, tokenizer, response_fn, tokens_per_batch: int,
                   response_tokens: bool = False):
    """Puzzles per batch of size ``n``: ``tokens_per_batch`` over the mean encoded length of
    32 puzzles of that size (fixed per size afterwards, so the shapes recur; see collate).
    With ``response_tokens``: (that, the mean number of response tokens of a puzzle)."""
    sample = [encode_example(tokenizer, default_prompt(r), response_fn(r)) for r in
              (stream.next(n) for _ in range(32))]
    mean = sum(len(ids) for ids, _ in sample) / len(sample)
    size = max(1, round(tokens_per_batch / mean))
    if response_tokens:
        return size, sum(len(ids) - n_prompt for ids, n_prompt in sample) / len(sample)
    return size


def bucketed_batches(examples: list, batch_size: int, rng: random.Random) -> list[list]:
    """Cut ``examples`` into batches of ``batch_size`` neighbours in length, in random order.

    A batch is padded to its longest row, so random batches of one puzzle size waste about
    a third of their positions on padding (the explanation's length varies with the search);
    sorted neighbours waste little.  The order of the batches is shuffled, so the model
    does not see short puzzles first and long ones last."""
    ordered = sorted(examples, key=lambda e: len(e[0]))
    batches = [ordered[i:i + batch_size] for i in range(0, len(ordered), batch_size)]
    rng.shuffle(batches)
    return batches


# ---------------------------------------------------------------------------------------
# Greedy evaluation
# ---------------------------------------------------------------------------------------

def evaluate(model, tokenizer, records: list[dict], max_new_tokens: dict | int,
             bf16: bool = True, batch_size: int = 50) -> dict:
    """Per size: accuracy (total == 3), format (format part +1), mean response tokens.

    A thin view of evaluate.evaluate_records (greedy, the compact prompt, the same
    decoding code as the RL rollouts and eval.py), keeping the two numbers the warm start
    is judged by."""
    report = evaluate_records(model, tokenizer, records, max_new_tokens=max_new_tokens,
                              batch_size=batch_size, prompt_style="compact",
                              autocast_bf16=bf16, progress=False)
    return {n: {"accuracy": v["accuracy"], "format": 1.0 - v["format_error"],
                "mean_tokens": v["mean_tokens"], "n": v["n"]}
            for n, v in report["per_size"].items()}


def format_eval(res: dict) -> str:
    return "  ".join(f"{n}p acc {v['accuracy']:.2f} fmt {v['format']:.2f}" for n, v in res.items())


# ---------------------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------------------

def save_warm_start(model, tokenizer, out: str, info: dict) -> None:
    """Save as a Hugging Face folder: bf16 safetensors + config + tokenizer + info json
    (warmstart.json), with the project's one atomic saver (runs.save_hf_atomic: written
    to a temporary folder first and then renamed, so an interruption never leaves a
    half-written checkpoint in ``out``). bf16 halves the file; the weights came from
    bf16 autocast training anyway."""
    save_hf_atomic(model, tokenizer, out, {"warmstart.json": info}, dtype=torch.bfloat16)


STATE_FILE = "warmstart_state.pt"


def resume_dir(out: str) -> str:
    """Where a run writing to ``out`` keeps its training state: beside the checkpoint, not
    in it (the checkpoint folder is replaced whenever a better evaluation is saved)."""
    return out.rstrip("/") + ".resume"


def save_state(model, tokenizer, state: dict, record: dict, out: str) -> None:
    """The training state at a step boundary, atomically (runs.save_hf_atomic): the float32
    weights as a Hugging Face folder and, in warmstart_state.pt, everything else the loop
    needs to go on as if never stopped (``state``: optimizer, generators, stream, queue...);
    beside it the run's record so far (warmstart.json: every evaluation, where OUT holds
    the best one's), which scripts/warmstart_curves.py reads while the run goes on."""
    save_hf_atomic(model, tokenizer, resume_dir(out), {STATE_FILE: state, "warmstart.json": record})


def load_state(out: str) -> tuple:
    """(model, tokenizer, state) saved by ``save_state`` for the run writing to ``out``."""
    folder = resume_dir(out)
    if not os.path.exists(os.path.join(folder, STATE_FILE)):
        raise SystemExit(f"--resume {out}: no saved training state at {folder} (a run saves it "
                         f"every --state-every-steps steps and deletes it when it completes)")
    model, tokenizer = load_model_and_tokenizer(folder, dtype=torch.float32, device="cpu")
    # weights_only=False: the state holds Python objects (the puzzle stream, random.Random);
    # it is a file this module wrote, not a downloaded one.
    return model, tokenizer, torch.load(os.path.join(folder, STATE_FILE), weights_only=False)


# ---------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------

def lr_at(progress: float, step: int, cfg: WarmStartConfig) -> float:
    """Linear warmup, then cosine decay from lr to min_lr_ratio * lr over the budget."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    p = min(max(progress, 0.0), 1.0)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * p)))


def size_weights(progress: float, cfg: WarmStartConfig) -> dict:
    stage = cfg.curriculum[0][1]
    for start, weights in cfg.curriculum:
        if progress >= start:
            stage = weights
    return stage


def heldout_records(sizes, per_size: int, seed: int = 99_991, exclude: set = frozenset()) -> list[dict]:
    """Generated puzzles kept out of training (a fixed seed, disjoint from the official set)."""
    out = []
    for n in sizes:
        out += dataset.generate_records(n, per_size, seed=seed + n, exclude=exclude)
    return out


def warm_start(cfg: WarmStartConfig, model=None, tokenizer=None, response_fn=default_response,
               log=print, resume: dict | None = None) -> tuple:
    """Train (from scratch unless ``model``/``tokenizer`` are given) and save to cfg.out.

    ``resume``: the state saved by ``save_state`` (``load_state``; with the model and
    tokenizer saved beside it), to go on from its step exactly.
    Returns (model, tokenizer, history) where history holds the evaluations."""

    if cfg.bucket_batches < 1:
        raise ValueError(f"bucket_batches must be >= 1, got {cfg.bucket_batches}")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    if tokenizer is None:
        tokenizer = build_kk_tokenizer(vocab_size=cfg.vocab_size)
    if model is None:
        model = make_tiny_model(cfg.preset, len(tokenizer), tokenizer=tokenizer, seed=cfg.seed)
    log(f"[warmstart] preset {cfg.preset}: {count_parameters(model):,} parameters, "
        f"vocab {len(tokenizer)}, threads {torch.get_num_threads()}")

    official = kk.load_official()
    heldout = heldout_records(cfg.eval_sizes, cfg.heldout_per_size, exclude=kk.keys_of(official)) \
        if cfg.heldout_per_size > 0 else []
    if cfg.phrase_tails and not cfg.phrased:
        raise ValueError("phrase_tails needs phrased (--phrase-tails is a part of --phrased)")
    if response_fn is default_response and (cfg.guess_share > 0 or cfg.phrased):
        response_fn = TwoBehaviourTargets(cfg.guess_share, cfg.phrased, cfg.seed, cfg.phrase_tails)
    if not 0.0 <= cfg.unsolvable_share < 1.0:
        raise ValueError(f"unsolvable_share must lie in [0, 1), got {cfg.unsolvable_share}")
    stream = PuzzleStream(cfg.seed, exclude=kk.keys_of(official) | kk.keys_of(heldout),
                          unsolvable_share=cfg.unsolvable_share)

    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95),
                            weight_decay=cfg.weight_decay)
    batch_size: dict[int, int] = {}     # per puzzle size, fixed (recurring shapes, see collate)
    mean_response: dict[int, float] = {}   # per puzzle size: mean response tokens of a puzzle
    queued: dict[int, list] = {}        # per puzzle size, length-bucketed batches still to train on
    history: list[dict] = []
    best = -1.0
    step, elapsed, ema = 0, 0.0, None
    if resume is not None:              # everything that changes as the loop runs
        opt.load_state_dict(resume["optimizer"])
        rng.setstate(resume["rng"])
        torch.set_rng_state(resume["torch_rng"])
        stream, response_fn = resume["stream"], resume["response_fn"]
        batch_size, mean_response, queued = resume["batch_size"], resume["mean_response"], resume["queued"]
        history, best, step, elapsed, ema = (resume[k] for k in ("history", "best", "step", "elapsed", "ema"))
        log(f"[resume] {resume_dir(cfg.out)} at step {step} ({elapsed / 60:.1f} min)")
    budget_s = cfg.minutes * 60
    t0 = time.time() - elapsed          # a resumed run's --minutes budget counts its first part
    last_eval = time.time()
    bar = tqdm(total=cfg.steps or int(budget_s), initial=step if cfg.steps else int(elapsed),
               disable=not cfg.progress, file=sys.stderr, unit="step" if cfg.steps else "s",
               mininterval=5)

    def state() -> dict:
        return {"config": cfg, "optimizer": opt.state_dict(), "rng": rng.getstate(),
                "torch_rng": torch.get_rng_state(), "stream": stream, "response_fn": response_fn,
                "batch_size": batch_size, "mean_response": mean_response, "queued": queued,
                "history": history, "best": best, "step": step, "elapsed": time.time() - t0,
                "ema": ema}

    def progress() -> float:
        return step / cfg.steps if cfg.steps else (time.time() - t0) / budget_s

    def record() -> dict:               # warmstart.json: how it was made, how it did, where
        return {"config": asdict(cfg), "history": history, "machine": machine_info()}

    def do_eval(final: bool = False):
        nonlocal best, last_eval
        if (cfg.final_eval_per_size if final else cfg.eval_per_size) <= 0:   # evaluation off
            if final:
                save_warm_start(model, tokenizer, cfg.out, record())
            return
        sizes = cfg.final_eval_sizes if final else cfg.eval_sizes
        per = cfg.final_eval_per_size if final else cfg.eval_per_size
        off = [r for n in sizes for r in [x for x in official if x["n_people"] == n][:per]]
        te = time.time()
        res_off = evaluate(model, tokenizer, off, cfg.max_new_tokens, cfg.bf16)
        res_held = evaluate(model, tokenizer, heldout, cfg.max_new_tokens, cfg.bf16) \
            if heldout else {}
        model.train()
        entry = {"step": step, "minutes": round((time.time() - t0) / 60, 2), "loss": ema,
                 "official": res_off, "heldout": res_held, "final": final,
                 "eval_seconds": round(time.time() - te, 1)}
        history.append(entry)
        log(f"[eval] step {step} min {entry['minutes']:.1f} loss {ema:.4f} ({entry['eval_seconds']}s)\n"
            f"  official: {format_eval(res_off)}\n  held-out: {format_eval(res_held)}")
        # Keep the best checkpoint by accuracy on 3 and 4 people (the targets): later steps
        # are usually better, but an interrupted or unlucky run keeps its best.  Selected on
        # the generated held-out puzzles, so the official test sets stay untouched by model
        # selection (official only when no held-out set is configured).
        sel = res_held or res_off
        metric = sum(sel[n]["accuracy"] for n in (3, 4) if n in sel)
        if final or metric >= best:
            best = max(best, metric)
            save_warm_start(model, tokenizer, cfg.out, record())
            log(f"[save] {cfg.out} (metric {metric:.2f})")
        last_eval = time.time()

    model.train()
    while True:
        p = progress()
        if p >= 1.0:
            break
        for g in opt.param_groups:
            g["lr"] = lr_at(p, step, cfg)
        weights = size_weights(p, cfg)
        n = rng.choices(list(weights), weights=list(weights.values()))[0]
        if n not in batch_size:
            batch_size[n], mean_response[n] = batch_size_for(stream, n, tokenizer, response_fn,
                                                             cfg.tokens_per_batch, response_tokens=True)
        if not queued.get(n):
            recs = [stream.next(n) for _ in range(batch_size[n] * cfg.bucket_batches)]
            examples = [encode_example(tokenizer, default_prompt(r), response_fn(r)) for r in recs]
            queued[n] = bucketed_batches(examples, batch_size[n], rng)
        ids, _, mask = collate(queued[n].pop(), tokenizer.pad_token_id)
        # Two behaviours: every token weighs the same (see response_loss); the constant
        # is the batch's expected number of response tokens, so the scale is a mean's.
        norm = batch_size[n] * mean_response[n] if cfg.guess_share > 0 else None
        loss = response_loss(model, ids, mask, cfg.bf16, normalizer=norm)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        per_token = loss.item() * (norm / mask.sum().item() if norm else 1.0)   # the logged mean
        ema = per_token if ema is None else 0.98 * ema + 0.02 * per_token
        if cfg.steps:
            bar.update(1)
        else:
            bar.n = min(int(time.time() - t0), int(budget_s))
            bar.refresh() if step % 20 == 0 else None
        bar.set_postfix(loss=f"{ema:.3f}", n=n, lr=f"{opt.param_groups[0]['lr']:.1e}", refresh=False)
        due = (cfg.eval_every_steps and step % cfg.eval_every_steps == 0) or \
              (not cfg.eval_every_steps and time.time() - last_eval > cfg.eval_every_minutes * 60)
        if due:
            do_eval()
        if cfg.state_every_steps and step % cfg.state_every_steps == 0:
            save_state(model, tokenizer, state(), record(), cfg.out)
            log(f"[state] step {step}: {resume_dir(cfg.out)}")
    bar.close()
    log(f"[warmstart] {step} steps in {(time.time() - t0) / 60:.1f} min; final evaluation")
    do_eval(final=True)
    shutil.rmtree(resume_dir(cfg.out), ignore_errors=True)    # complete: nothing to resume
    return model, tokenizer, history


# ---------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------

STAGE2_MINUTES = 10.0     # the second run of the shipped two-behaviour warm start (train.py says it too)
DERIVE_STAGE2_MINUTES = 15.0   # the second run of tiny-derive
GUESS_SHARE = 0.7         # the shipped warm start's share of guess targets
# Stage 1 of the shipped warm start is bounded by steps, not minutes, so the checkpoint does
# not depend on the machine's speed: 14,082 is what the canonical stage 1 (tiny-derive's)
# made of its 95 minutes on the 2-core machine that built it; phrasing costs no step time
# (docs/TWO_BEHAVIOURS.md), but the 2-core AMD EPYC of later sessions makes 80-90 steps a
# minute, so there the same steps take 2.6-2.9 hours.
STAGE1_STEPS = 14082
PHRASING = ["--phrased", "--phrase-tails"]      # phrasing.py, with a tail word on every line


def recipe(out: str = "checkpoints/tiny-warm", threads: int = 2, minutes: float | None = None,
           derive_only: bool = False, stage1: str | None = None) -> list[list[str]]:
    """A shipped checkpoint's recipe: two runs of this CLI (``--recipe`` runs both; docs/EXPERIMENTS.md).

    1. From scratch, on solvable puzzles, to ``stage1`` (default ``OUT-stage1``):
       - the default (checkpoints/tiny-warm-stage1): derivations phrased freely from the
         first step (``--phrased --phrase-tails``, phrasing.py), STAGE1_STEPS steps
         (``minutes``, if given, bounds it by time instead: a shorter schedule, a weaker
         model on a slow machine);
       - ``derive_only`` (checkpoints/tiny-derive-stage1): canonical derivations,
         ``minutes`` (default 95) of training, as that checkpoint was made.
    2. From stage 1, a fresh schedule from lr 2e-4 (the last curriculum stage) with 5%
       unsolvable puzzles: the stage-1 model's only format errors were responses that loop
       once its search ran out of candidates (its own wrong check had rejected the
       solution), and the unsolvable puzzles show it how a search that runs out ends
       ("guess ...").  No periodic evaluation: the final model is kept.
       - the default (checkpoints/tiny-warm): 10 minutes on the two behaviours
         (behaviours.py): 70% of the targets guess, the derivations are phrased as in
         stage 1, and every token of the data weighs the same (response_loss's normalizer);
       - ``derive_only`` (checkpoints/tiny-derive): 15 minutes of canonical derivations."""
    stage1 = stage1 or out.rstrip("/") + "-stage1"
    common = ["--threads", str(threads), "--heldout-per-size", "40"]
    second = ["--init", stage1, "--lr", "2e-4", "--unsolvable-share", "0.05"]
    if derive_only:
        first = ["--preset", "tiny", "--minutes", f"{minutes or WarmStartConfig.minutes:g}"]
        second += ["--minutes", f"{DERIVE_STAGE2_MINUTES:g}"]
    else:
        budget = ["--minutes", f"{minutes:g}"] if minutes else ["--steps", str(STAGE1_STEPS)]
        first = ["--preset", "tiny"] + PHRASING + budget + ["--eval-every-steps", "1780"]
        second += ["--minutes", f"{STAGE2_MINUTES:g}", "--guess-share", f"{GUESS_SHARE:g}"] + PHRASING
    return [first + common + ["--out", stage1],
            second + common + ["--eval-every-minutes", "100", "--out", out]]


def resume_plan(runs: list[list[str]]) -> list[list[str]]:
    """The runs of a recipe still to do: all of them, unless an interrupted run left its
    training state (OUT.resume; deleted when a run completes): then that run resumed
    (``--resume OUT``) and the runs after it -- the ones before it had completed, or it
    would not have started."""
    outs = [args[args.index("--out") + 1] for args in runs]
    last = max((i for i, out in enumerate(outs) if os.path.isdir(resume_dir(out))), default=None)
    if last is None:
        return runs
    return [["--resume", outs[last]] + runs[last]] + runs[last + 1:]


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description="Supervised warm start of the tiny K&K model.",
                                 formatter_class=HelpFormatter)
    ap.add_argument("--recipe", nargs="?", const="two-behaviour", choices=("two-behaviour", "derive"),
                    help="make a shipped checkpoint: the two runs of warmstart.recipe() into --out "
                         "(default checkpoints/tiny-warm) and OUT-stage1, with --threads (--minutes: stage 1 "
                         f"bounded by time instead of its {STAGE1_STEPS:,} steps); "
                         "'derive' makes tiny-derive (canonical derivations only); run again after "
                         "an interruption, it goes on where it stopped (delete OUT.resume and "
                         "OUT-stage1.resume to start over)")
    ap.add_argument("--resume", metavar="OUT", default=None,
                    help="continue the interrupted run that wrote to OUT, from the training state "
                         "it saved last (OUT.resume), writing to OUT; its own options apply, except "
                         "--threads and --no-progress")
    ap.add_argument("--init", default=None,
                    help="continue from this checkpoint (its tokenizer too) with a fresh schedule "
                         "and the last curriculum stage")
    ap.add_argument("--style", choices=sorted(RESPONSE_STYLES), default="compact",
                    help="target: compact explanation (names), numbered (people as 1..n), or direct (answer only)")
    add_options(ap.add_argument_group("run options"), WarmStartConfig)
    return ap


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    cfg = WarmStartConfig(**given(a, WarmStartConfig))
    cfg.threads = cfg.threads or os.cpu_count()
    if a.recipe:
        # --minutes given: stage 1 bounded by time; not given (None): the recipe's own budget
        for args in resume_plan(recipe(cfg.out, a.threads or 2, a.minutes, derive_only=a.recipe == "derive")):
            print("[recipe] python -m lopti_minimal.warmstart " + " ".join(args), flush=True)
            main(args + ([] if cfg.progress else ["--no-progress"]))
        return 0
    model = tokenizer = state = None
    if a.resume:                      # the run's own config; only these follow the command
        model, tokenizer, state = load_state(a.resume)
        cfg, threads, progress = state["config"], cfg.threads, cfg.progress
        # OUT as given now: the saved (maybe relative) path may point elsewhere from here
        cfg.out, cfg.threads, cfg.progress = a.resume, threads, progress
    elif a.init:
        model, tokenizer = load_model_and_tokenizer(a.init, dtype=torch.float32, device="cpu")
        cfg.curriculum = (cfg.curriculum[-1],)
        cfg.warmup_steps = 20
        cfg.init = a.init
    _, _, hist = warm_start(cfg, model=model, tokenizer=tokenizer, response_fn=RESPONSE_STYLES[a.style],
                            log=lambda s: print(s, flush=True), resume=state)
    if hist:                                          # (no evaluation: nothing to print)
        print(json.dumps(hist[-1]["official"], indent=1))
    return 0


if __name__ == "__main__":
    # Run as `python -m`, this file is the module __main__; the resume state pickles objects
    # of this module (the config, the puzzle stream), so they are made by the importable
    # lopti_minimal.warmstart, which any entry point (train.py too) can load them from.
    from lopti_minimal import warmstart
    sys.exit(warmstart.main())
