"""Supervised warm start of the tiny model: next-token loss on the response only.

    python -m lopti_minimal.experiments.warmstart --out DIR --threads 2     # one run, 95 minutes
    python -m lopti_minimal.experiments.warmstart --recipe --out DIR        # the shipped kind:
        # `recipe()`, two runs into DIR-stage1 and DIR: 14,082 steps (2.6-2.9 h on a 2-core
        # AMD EPYC), then 10 minutes
    python -m lopti_minimal.experiments.warmstart --recipe derive --out DIR  # tiny-derive's kind
    python -m lopti_minimal.experiments.warmstart --resume DIR   # go on with an interrupted run
        # (an interrupted --recipe: run it again)

--out is required, and a run that would replace a checkpoint the repository ships
(checkpoints/NAME) is refused unless --overwrite-shipped is given (train.py
--rebuild-warmstart gives it: rebuilding checkpoints/tiny-warm is what it asks for).

Design choices (in full, with the measurements: docs/TASK_AND_MODELS.md):

1. RL needs a policy that already writes well-formed answers and is sometimes right (a
   group with equal rewards has advantage 0), so the model first imitates generated
   solutions: prompts.compact_prompt + prompts.target_response, loss on the response only.
2. Fast on a 2-core CPU (measured): bf16 autocast on float32 master weights (about 2x),
   as many threads as free cores, a curriculum from small to large puzzles, batches of
   one size length-bucketed (warmstart_data.py; padding ~35% -> ~10%,
   benchmarks/warmstart_step.py), no attention mask (right padding, causal attention: same
   loss, tests/test_warmstart.py).
3. Cosine learning-rate decay to a small floor, over --minutes or a fixed --steps
   (reproducible).
4. Evaluation: greedy decoding scored by the Logic-RL reward (accuracy: scores 3; format:
   format part +1), per size, on held-out generated puzzles and the official sets.
5. The shipped recipe's second run mixes in 5% unsolvable puzzles (--unsolvable-share), so
   the model has seen a search run out of candidates, and teaches the two behaviours
   (task/behaviours.py: --guess-share, --phrased) that give RL something to select.
6. Nothing is lost on interruption: the training state goes to OUT.resume every
   --state-every-steps steps (`WarmStart.state`), and --resume OUT goes on exactly. The
   state is plain data (tensors, numbers, strings, containers: runs.read_state), so
   resuming runs no code from the folder; a file not in that form is refused.
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

from ..cli import HelpFormatter, add_options, given, one_line_error, option
from ..models import count_parameters, load_model_and_tokenizer, make_tiny_model
from ..paths import CHECKOUT, in_checkout
from ..runs import STATE_FORMAT, StateFileError, machine_info, read_state, save_hf_atomic
from ..task import kk
from ..task.behaviours import TwoBehaviourTargets
from ..task.evaluate import evaluate_records
from ..tokenizer import build_kk_tokenizer
from .warmstart_data import (RESPONSE_STYLES, PuzzleStream, batch_size_for, bucketed_batches, collate, default_prompt, default_response,
                             encode_example, heldout_records)


# ---------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------

@dataclass
class WarmStartConfig:
    """Every option of a warm-start run, declared once (cli.option: default + help; the
    command line is generated from the fields that have help)."""
    preset: str = option("tiny", "model size (models.make_tiny_model)")
    out: str | None = option(None, "where to write the checkpoint (required; a shipped one, "
                             "checkpoints/NAME, only with --overwrite-shipped)", type=str)
    # 95 + the final evaluation (1.6 min measured) fits a 2-hour budget on 2 cores; the
    # shipped recipe bounds its stage 1 by steps instead (recipe()).
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
    # for 4, 2,212 for 5 -- scripts/phrasing_choices.py.)
    max_new_tokens: dict = field(default_factory=lambda: {2: 300, 3: 640, 4: 1152, 5: 1600, 6: 2048, 7: 2048})
    progress: bool = option(True, "no tqdm bar (log files)", flag="--no-progress")
    # Nothing lost on interruption: the whole training state (float32 weights, AdamW state,
    # the puzzle stream and the batches queued from it, the random generators, the elapsed
    # time) goes to OUT.resume every N steps; `--resume OUT` continues the run from there
    # exactly (tests/test_warmstart.py); the folder is deleted when the run completes.
    state_every_steps: int = option(500, "save the training state for --resume every N steps "
                                    "(0: never)")
    init: str | None = None          # the checkpoint this run continued from (--init), if any


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
    needs to go on as if never stopped (``state``, `WarmStart.state`: optimizer, generators,
    stream, queue..., all plain data);
    beside it the run's record so far (warmstart.json: every evaluation, where OUT holds
    the best one's), which scripts/warmstart_curves.py reads while the run goes on."""
    save_hf_atomic(model, tokenizer, resume_dir(out), {STATE_FILE: state, "warmstart.json": record})


def load_state(out: str) -> tuple:
    """(model, tokenizer, state) saved by ``save_state`` for the run writing to ``out``, with
    state["config"] a WarmStartConfig again. The state file is read first, by
    runs.read_state: it runs no code, and a file not in its form raises StateFileError
    before the model is loaded."""
    folder = resume_dir(out)
    path = os.path.join(folder, STATE_FILE)
    if not os.path.exists(path):
        raise SystemExit(f"--resume {out}: no saved training state at {folder} (a run saves it "
                         f"every --state-every-steps steps and deletes it when it completes)")
    state = read_state(path, f"delete {folder} and run the original command again to start over")
    state["config"] = WarmStartConfig(**state["config"])
    model, tokenizer = load_model_and_tokenizer(folder, dtype=torch.float32, device="cpu")
    return model, tokenizer, state


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


class WarmStart:
    """One warm-start run: the model, its data, and everything that changes as the loop
    runs -- the training state `save_state` stores (`state`) and a resumed run restores.

    `run` is the loop: `train_step` until the budget is spent, `evaluate` when due (it keeps
    the best checkpoint in cfg.out), the state every cfg.state_every_steps steps."""

    def __init__(self, cfg: WarmStartConfig, model=None, tokenizer=None, response_fn=default_response,
                 log=print, resume: dict | None = None):
        if cfg.bucket_batches < 1:
            raise ValueError(f"bucket_batches must be >= 1, got {cfg.bucket_batches}")
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        self.cfg, self.log = cfg, log
        torch.manual_seed(cfg.seed)
        self.rng = random.Random(cfg.seed)
        if tokenizer is None:
            tokenizer = build_kk_tokenizer(vocab_size=cfg.vocab_size)
        if model is None:
            model = make_tiny_model(cfg.preset, len(tokenizer), tokenizer=tokenizer, seed=cfg.seed)
        self.model, self.tokenizer = model, tokenizer
        log(f"[warmstart] preset {cfg.preset}: {count_parameters(model):,} parameters, "
            f"vocab {len(tokenizer)}, threads {torch.get_num_threads()}")

        self.official = kk.load_official()
        self.heldout = heldout_records(cfg.eval_sizes, cfg.heldout_per_size, exclude=kk.keys_of(self.official)) \
            if cfg.heldout_per_size > 0 else []
        if cfg.phrase_tails and not cfg.phrased:
            raise ValueError("phrase_tails needs phrased (--phrase-tails is a part of --phrased)")
        # The target's name goes into the state, so that --resume makes the same targets
        # (None: a function of the caller's, which a resumed run must be given again).
        self.style = next((k for k, f in RESPONSE_STYLES.items() if f is response_fn), None)
        if response_fn is default_response and (cfg.guess_share > 0 or cfg.phrased):
            response_fn = TwoBehaviourTargets(cfg.guess_share, cfg.phrased, cfg.seed, cfg.phrase_tails)
        if not 0.0 <= cfg.unsolvable_share < 1.0:
            raise ValueError(f"unsolvable_share must lie in [0, 1), got {cfg.unsolvable_share}")
        self.response_fn = response_fn
        self.stream = PuzzleStream(cfg.seed, exclude=kk.keys_of(self.official) | kk.keys_of(self.heldout),
                                   unsolvable_share=cfg.unsolvable_share)
        self.opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95),
                                     weight_decay=cfg.weight_decay)
        self.batch_size: dict[int, int] = {}     # per puzzle size, fixed (recurring shapes, see collate)
        self.mean_response: dict[int, float] = {}   # per puzzle size: mean response tokens of a puzzle
        self.queued: dict[int, list] = {}        # per puzzle size, length-bucketed batches still to train on
        self.history: list[dict] = []
        self.best = -1.0
        self.step, elapsed, self.ema = 0, 0.0, None
        if resume is not None:
            self.opt.load_state_dict(resume["optimizer"])
            self.rng.setstate(resume["rng"])
            torch.set_rng_state(resume["torch_rng"])
            self.stream.restore(resume["stream"])
            for k in ("batch_size", "mean_response", "queued", "history", "best", "step", "ema"):
                setattr(self, k, resume[k])
            elapsed = resume["elapsed"]
            log(f"[resume] {resume_dir(cfg.out)} at step {self.step} ({elapsed / 60:.1f} min)")
        self.budget_s = cfg.minutes * 60
        self.t0 = time.time() - elapsed          # a resumed run's --minutes budget counts its first part
        self.last_eval = time.time()
        self.bar = tqdm(total=cfg.steps or int(self.budget_s), initial=self.step if cfg.steps else int(elapsed),
                        disable=not cfg.progress, file=sys.stderr, unit="step" if cfg.steps else "s",
                        mininterval=5)

    def state(self) -> dict:
        """What a resumed run needs to go on exactly (save_state / load_state), as plain data
        (runs.read_state's form): the config as a dict, the target by its name (style),
        random.Random's state as its tuple of ints, the stream by where it stands. The
        queued batches are lists of token ids; the history, numbers and strings."""
        return {"format": STATE_FORMAT, "config": asdict(self.cfg), "style": self.style,
                "optimizer": self.opt.state_dict(), "rng": self.rng.getstate(),
                "torch_rng": torch.get_rng_state(), "stream": self.stream.state(),
                "batch_size": self.batch_size, "mean_response": self.mean_response, "queued": self.queued,
                "history": self.history, "best": self.best, "step": self.step,
                "elapsed": time.time() - self.t0, "ema": self.ema}

    def record(self) -> dict:
        """warmstart.json: how it was made, how it did, where."""
        return {"config": asdict(self.cfg), "history": self.history, "machine": machine_info()}

    def progress(self) -> float:
        """The share of the budget (steps, or else minutes) spent."""
        cfg = self.cfg
        return self.step / cfg.steps if cfg.steps else (time.time() - self.t0) / self.budget_s

    def run(self) -> list[dict]:
        """The loop; then the final evaluation. Returns the evaluations (history)."""
        cfg = self.cfg
        self.model.train()
        while (p := self.progress()) < 1.0:
            self.train_step(p)
            due = (cfg.eval_every_steps and self.step % cfg.eval_every_steps == 0) or \
                  (not cfg.eval_every_steps and time.time() - self.last_eval > cfg.eval_every_minutes * 60)
            if due:
                self.evaluate()
            if cfg.state_every_steps and self.step % cfg.state_every_steps == 0:
                save_state(self.model, self.tokenizer, self.state(), self.record(), cfg.out)
                self.log(f"[state] step {self.step}: {resume_dir(cfg.out)}")
        self.bar.close()
        self.log(f"[warmstart] {self.step} steps in {(time.time() - self.t0) / 60:.1f} min; final evaluation")
        self.evaluate(final=True)
        shutil.rmtree(resume_dir(cfg.out), ignore_errors=True)    # complete: nothing to resume
        return self.history

    def train_step(self, p: float) -> None:
        """One optimizer step at progress ``p``: the schedule's lr, a puzzle size drawn from
        the curriculum, the next length-bucketed batch of that size."""
        cfg, tokenizer = self.cfg, self.tokenizer
        for g in self.opt.param_groups:
            g["lr"] = lr_at(p, self.step, cfg)
        weights = size_weights(p, cfg)
        n = self.rng.choices(list(weights), weights=list(weights.values()))[0]
        if n not in self.batch_size:
            self.batch_size[n], self.mean_response[n] = batch_size_for(
                self.stream, n, tokenizer, self.response_fn, cfg.tokens_per_batch, response_tokens=True)
        if not self.queued.get(n):
            recs = [self.stream.next(n) for _ in range(self.batch_size[n] * cfg.bucket_batches)]
            examples = [encode_example(tokenizer, default_prompt(r), self.response_fn(r)) for r in recs]
            self.queued[n] = bucketed_batches(examples, self.batch_size[n], self.rng)
        ids, _, mask = collate(self.queued[n].pop(), tokenizer.pad_token_id)
        # Two behaviours: every token weighs the same (see response_loss); the constant
        # is the batch's expected number of response tokens, so the scale is a mean's.
        norm = self.batch_size[n] * self.mean_response[n] if cfg.guess_share > 0 else None
        loss = response_loss(self.model, ids, mask, cfg.bf16, normalizer=norm)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.step += 1
        per_token = loss.item() * (norm / mask.sum().item() if norm else 1.0)   # the logged mean
        self.ema = per_token if self.ema is None else 0.98 * self.ema + 0.02 * per_token
        if cfg.steps:
            self.bar.update(1)
        else:
            self.bar.n = min(int(time.time() - self.t0), int(self.budget_s))
            self.bar.refresh() if self.step % 20 == 0 else None
        self.bar.set_postfix(loss=f"{self.ema:.3f}", n=n, lr=f"{self.opt.param_groups[0]['lr']:.1e}",
                             refresh=False)

    def evaluate(self, final: bool = False) -> None:
        """Greedy evaluation on the official sets and the held-out puzzles; saves the
        checkpoint to cfg.out when it is the best so far by held-out accuracy (and always
        at the end)."""
        cfg, model, tokenizer = self.cfg, self.model, self.tokenizer
        if (cfg.final_eval_per_size if final else cfg.eval_per_size) <= 0:   # evaluation off
            if final:
                save_warm_start(model, tokenizer, cfg.out, self.record())
            return
        sizes = cfg.final_eval_sizes if final else cfg.eval_sizes
        per = cfg.final_eval_per_size if final else cfg.eval_per_size
        off = [r for n in sizes for r in [x for x in self.official if x["n_people"] == n][:per]]
        te = time.time()
        res_off = evaluate(model, tokenizer, off, cfg.max_new_tokens, cfg.bf16)
        res_held = evaluate(model, tokenizer, self.heldout, cfg.max_new_tokens, cfg.bf16) \
            if self.heldout else {}
        model.train()
        entry = {"step": self.step, "minutes": round((time.time() - self.t0) / 60, 2), "loss": self.ema,
                 "official": res_off, "heldout": res_held, "final": final,
                 "eval_seconds": round(time.time() - te, 1)}
        self.history.append(entry)
        self.log(f"[eval] step {self.step} min {entry['minutes']:.1f} loss {self.ema:.4f} "
                 f"({entry['eval_seconds']}s)\n  official: {format_eval(res_off)}\n  held-out: {format_eval(res_held)}")
        # Keep the best checkpoint by accuracy on 3 and 4 people (the targets): later steps
        # are usually better, but an interrupted or unlucky run keeps its best.  Selected on
        # the generated held-out puzzles, so the official test sets stay untouched by model
        # selection (official only when no held-out set is configured).
        sel = res_held or res_off
        metric = sum(sel[n]["accuracy"] for n in (3, 4) if n in sel)
        if final or metric >= self.best:
            self.best = max(self.best, metric)
            save_warm_start(model, tokenizer, cfg.out, self.record())
            self.log(f"[save] {cfg.out} (metric {metric:.2f})")
        self.last_eval = time.time()


def warm_start(cfg: WarmStartConfig, model=None, tokenizer=None, response_fn=default_response,
               log=print, resume: dict | None = None) -> tuple:
    """Train (from scratch unless ``model``/``tokenizer`` are given) and save to cfg.out.

    ``resume``: the state saved by ``save_state`` (``load_state``; with the model and
    tokenizer saved beside it), to go on from its step exactly, given the ``response_fn``
    the run was made with (RESPONSE_STYLES[state["style"]]; the default for the two
    behaviours, which are made from the config).
    Returns (model, tokenizer, history) where history holds the evaluations."""
    run = WarmStart(cfg, model, tokenizer, response_fn, log, resume)
    return run.model, run.tokenizer, run.run()


# ---------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------

STAGE2_MINUTES = 10.0     # the second run of the shipped two-behaviour warm start (train.py says it too)
DERIVE_STAGE2_MINUTES = 15.0   # the second run of tiny-derive
GUESS_SHARE = 0.7         # the shipped warm start's share of guess targets
# Stage 1 of the shipped warm start is bounded by steps, not minutes, so the checkpoint does
# not depend on the machine's speed. 14,082 is the budget checkpoints/tiny-warm-stage1 was
# trained with (its warmstart.json; tests/test_warmstart.py checks the two agree); a 2-core
# AMD EPYC makes 80-90 steps a minute, 2.6-2.9 hours for the whole budget.
STAGE1_STEPS = 14082
PHRASING = ["--phrased", "--phrase-tails"]      # phrasing.py, with a tail word on every line


def recipe(out: str = "checkpoints/tiny-warm", threads: int = 2, minutes: float | None = None,
           derive_only: bool = False, stage1: str | None = None) -> list[list[str]]:
    """A shipped checkpoint's recipe: two runs of this CLI (``--recipe`` runs both).

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


def shipped_checkpoint(out: str) -> str | None:
    """The shipped checkpoint a run writing to ``out`` would replace -- a folder of the
    checkout's checkpoints/ that holds a model -- as its repository path, or None."""
    if not in_checkout():
        return None
    path = os.path.realpath(out)
    root = os.path.realpath(CHECKOUT / "checkpoints")
    if os.path.dirname(path) == root and os.path.isfile(os.path.join(path, "config.json")):
        return f"checkpoints/{os.path.basename(path)}"
    return None


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m lopti_minimal.experiments.warmstart",
                                 description="Supervised warm start of the tiny K&K model.",
                                 formatter_class=HelpFormatter)
    ap.add_argument("--recipe", nargs="?", const="two-behaviour", choices=("two-behaviour", "derive"),
                    help="make a shipped checkpoint's kind: the two runs of warmstart.recipe() into --out "
                         "and OUT-stage1, with --threads (--minutes: stage 1 "
                         f"bounded by time instead of its {STAGE1_STEPS:,} steps); "
                         "'derive' makes tiny-derive's kind (canonical derivations only); run again after "
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
    ap.add_argument("--overwrite-shipped", action="store_true",
                    help="allow --out to replace a checkpoint the repository ships (checkpoints/NAME); "
                         "without it such a run is refused")
    add_options(ap.add_argument_group("run options"), WarmStartConfig)
    ap.error = one_line_error
    return ap


def resumed(ap, out: str, given_cfg: WarmStartConfig) -> tuple:
    """--resume OUT: (config, model, tokenizer, state, response_fn) of the interrupted run --
    its own config and target; only --threads and --no-progress follow the command
    (``given_cfg``). A state file not in plain-data form is refused: one line, exit code 2."""
    try:
        model, tokenizer, state = load_state(out)
    except StateFileError as e:
        ap.error(f"cannot resume: {e}")
    if state["style"] not in RESPONSE_STYLES:
        ap.error(f"--resume {out}: the run was made with a target function of its own (not "
                 "--style); resume it from Python: warm_start(..., response_fn=, resume=)")
    cfg = state["config"]
    # OUT as given now: the saved (maybe relative) path may point elsewhere from here
    cfg.out, cfg.threads, cfg.progress = out, given_cfg.threads, given_cfg.progress
    return cfg, model, tokenizer, state, RESPONSE_STYLES[state["style"]]


def main(argv=None) -> int:
    ap = build_parser()
    a = ap.parse_args(argv)
    cfg = WarmStartConfig(**given(a, WarmStartConfig))
    cfg.threads = cfg.threads or os.cpu_count()
    if a.resume:
        cfg.out = a.resume
    if not cfg.out:
        ap.error("--out is required: the folder the checkpoint is written to")
    shipped = shipped_checkpoint(cfg.out)
    if shipped and not a.overwrite_shipped:
        ap.error(f"--out {cfg.out} would overwrite the shipped checkpoint {shipped}: choose another "
                 "folder, or pass --overwrite-shipped to rebuild it")
    if a.recipe:
        keep = (["--overwrite-shipped"] if a.overwrite_shipped else []) + ([] if cfg.progress else ["--no-progress"])
        # --minutes given: stage 1 bounded by time; not given (None): the recipe's own budget
        for args in resume_plan(recipe(cfg.out, a.threads or 2, a.minutes, derive_only=a.recipe == "derive")):
            print("[recipe] python -m lopti_minimal.experiments.warmstart " + " ".join(args), flush=True)
            main(args + keep)
        return 0
    model = tokenizer = state = None
    response_fn = RESPONSE_STYLES[a.style]
    if a.resume:
        cfg, model, tokenizer, state, response_fn = resumed(ap, a.resume, cfg)
    elif a.init:
        model, tokenizer = load_model_and_tokenizer(a.init, dtype=torch.float32, device="cpu")
        cfg.curriculum = (cfg.curriculum[-1],)
        cfg.warmup_steps = 20
        cfg.init = a.init
    _, _, hist = warm_start(cfg, model=model, tokenizer=tokenizer, response_fn=response_fn,
                            log=lambda s: print(s, flush=True), resume=state)
    if hist:                                          # (no evaluation: nothing to print)
        print(json.dumps(hist[-1]["official"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
