"""Supervised LoRA warm start of a pretrained LM on K&K: a start from which RL can learn.

    python scripts/fetch_smollm2.py                      # models/smollm2-135m-instruct
    python -m lopti_minimal.experiments.lm_warmstart --out checkpoints/smollm2-kk-sft-compact --threads 2
    python eval.py --model checkpoints/smollm2-kk-sft-compact --data data/heldout3.jsonl
    python -m lopti_minimal.experiments.lm_warmstart --resume checkpoints/smollm2-kk-sft-compact

Why: SmolLM2-135M-Instruct writes no format-valid response to the paper's prompt (0 of 160
sampled, results/smollm2-probe), so every group's rewards are equal, every GRPO advantage
is 0, and RL cannot start. A short supervised run on generated puzzles gives it the format
and a first, imperfect skill; RL then has rewards that differ within a group.

Design choices:

1. Prompt: the paper's (the Logic-RL system message through the model's chat template,
   models.kk_prompt), the very prompt train.py samples from. Target: a chain of thought and
   the answer in the reward's format (prompts.target_response), then the model's end-of-turn
   token. The default chain of thought, ``--style compact``, is the tiny model's trace
   (explain.compact_explanation: the statements restated, then a search that tries roles
   and checks each statement by a local look-up). ``--style backtracking`` is the K&K
   generator's official plain-English text, which SmolLM2 imitates without learning to
   check it: its greedy held-out accuracy was 0.207, the compact start's 0.703, on the
   same 400 puzzles (docs/TASK_AND_MODELS.md).
2. Only targets that fit the RL run's response budget (``max_response_tokens``, the
   smollm2-cpu preset's 384) are trained on: the model learns to close its answer within
   what RL samples. A longer target's puzzle is skipped and another drawn (the compact start
   skipped 739 in 250 steps, the backtracking one 352: warmstart.json's skipped_targets).
3. LoRA (lora.add_lora: rank r on every projection of every layer, alpha = 2r), the base
   frozen: what ships is the adapter (rank 8: 2.4M parameters, 4.9 MB in bf16), not the
   538 MB base. lora.save_adapter writes it with its base named relative to the checkout,
   and models.load_model_and_tokenizer loads such a folder as that base with the adapter
   merged, so ``--model OUT`` works in train.py and eval.py like any checkpoint.
4. Data: warmstart_data.PuzzleStream (the tiny warm start's generator), a batch of one
   puzzle size drawn uniformly from ``sizes``, the official test sets and every puzzle of
   the ``exclude`` files left out: every evaluation set stays unseen. ``exclude`` takes
   files or glob patterns, comma-separated; the default, data/heldout*.jsonl, is every
   held-out set scripts/heldout_set.py has made (3, 4 and 5 people), so a supervised
   control cannot train on one it forgot to name. A pattern is expanded when the run
   starts and the files are what the config (OUT.resume, warmstart.json) records, so
   --resume excludes exactly the same puzzles even if a file appears meanwhile; an older
   state's single path reads as before. Excluding heldout4/5 changes no puzzle a run at
   seeds 0-3 draws in its first 256 chunks: heldout_set.py made them from outside those
   chunks, so runs made before them are rebuilt exactly.
5. Loss and numerics: warmstart.response_loss (mean next-token cross-entropy over the
   response tokens, right padding without a mask), bf16 autocast on float32 adapters,
   AdamW, linear warmup then cosine decay to ``min_lr_ratio``, gradient norm clipped at 1.
6. Nothing lost on interruption: the adapter, the optimizer, the generators and the stream
   go to OUT.resume every ``state_every_steps`` steps in runs.read_state's plain-data form
   (resuming runs no code from the file); ``--resume OUT`` goes on exactly where it was.
7. ``--style two-behaviour`` builds a start the way checkpoints/tiny-warm is built
   (experiments/warmstart.py): a guess (``--guess-share`` of the targets: the answer at
   once, random roles) or a derivation phrased freely with a tail word on every line
   (task/phrasing.py), puzzles without a solution at ``--unsolvable-share``, and the loss
   divided by a constant, the batch's expected response tokens, so that every token weighs
   the same. Greedy, such a start guesses; sampled, it sometimes derives, and its phrasing
   choices are tokens RL samples below pi_old 0.5: a behaviour to select and uncertain tokens,
   what RL acts on in the tiny model.
"""
from __future__ import annotations

import argparse
import glob
import json
import math
import os
import random
import shutil
import sys
import time
from dataclasses import asdict, dataclass, replace

import torch
from tqdm import tqdm

from ..cli import HelpFormatter, add_options, given, one_line_error, option
from ..config import parse_sizes
from ..runs import STATE_FORMAT, StateFileError, machine_info, read_state
from ..task import kk
from ..task.prompts import target_response
from .warmstart import response_loss
from .warmstart_data import PuzzleStream, collate


@dataclass
class LMWarmStartConfig:
    """Every option of a run (cli.option: default + help; the command line is generated)."""
    model: str = option("models/smollm2-135m-instruct", "the pretrained base (a folder, .gguf or hub id)")
    out: str | None = option(None, "the adapter folder to write (required)", type=str)
    init: str | None = option(None, "start from this adapter folder (one of --model's) instead of "
                              "fresh adapters: more supervised training, with a fresh schedule, "
                              "in the folder's own --style unless given", type=str)
    steps: int = option(250, "optimizer steps (checkpoints/smollm2-kk-sft-compact: 250, 70 minutes on a 2-core AMD EPYC)")
    batch_size: int = option(8, "puzzles per optimizer step")
    lr: float = option(1e-3, "peak AdamW learning rate of the adapters")
    warmup_steps: int = option(10, "linear warmup steps")
    min_lr_ratio: float = 0.1        # cosine floor, as a fraction of lr
    lora_rank: int = option(8, "LoRA rank (lora.add_lora)")
    style: str = option("compact", "the chain of thought to train: compact (the tiny model's trace), "
                        "backtracking (the official, plain English) or two-behaviour (tiny-warm's recipe: "
                        "a guess or a freely phrased derivation with tail words, design choice 7)",
                        choices=("compact", "backtracking", "two-behaviour"))
    guess_share: float = option(0.0, "two-behaviour: the share of targets that guess (tiny-warm's second "
                                "stage: 0.7)")
    unsolvable_share: float = option(0.0, "the share of puzzles without a solution, whose trace runs out of "
                                     "candidates and ends in a guess (tiny-warm's second stage: 0.05)")
    sizes: tuple = option((2, 3, 4), "people per training puzzle, e.g. 3 or 2,3,4 (one size per "
                          "batch, drawn uniformly)", type=parse_sizes)
    max_response_tokens: int = option(384, "train only on targets of at most this many tokens "
                                      "(the RL run's response budget)")
    exclude: str = option("data/heldout*.jsonl", "JSON Lines of puzzles never to train on: files "
                          "or glob patterns, comma-separated, '' none (the official test sets are "
                          "always excluded)")
    seed: int = option(0, "seed of the puzzles, the batches and the adapters' init")
    threads: int | None = option(None, "torch threads (default: all cores)", type=int)
    bf16: bool = option(True, "train in float32 (slower on a CPU)", flag="--no-bf16")
    state_every_steps: int = option(25, "save the training state for --resume every N steps (0: never)")
    progress: bool = option(True, "no tqdm bar (log files)", flag="--no-progress")


def lr_at(step: int, cfg: LMWarmStartConfig) -> float:
    """Linear warmup, then cosine decay from lr to min_lr_ratio * lr at the last step."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    p = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(p, 1.0))))


def encode(tokenizer, record: dict, style: str, target=None) -> tuple[list[int], int]:
    """(prompt + target + end-of-turn ids, prompt length), tokenized as train.py samples:
    the prompt as models.encode_prompts encodes it, the target (design choice 1; ``target``:
    a function of the record, else the style's) continuing it."""
    from ..models import adds_bos, kk_prompt
    p = tokenizer(kk_prompt(record, tokenizer), add_special_tokens=adds_bos(tokenizer))["input_ids"]
    text = target(record) if target else target_response(record, style)
    r = tokenizer(text, add_special_tokens=False)["input_ids"]
    return p + r + [tokenizer.eos_token_id], len(p)


def targets(cfg: LMWarmStartConfig):
    """The target of a record (design choice 7): the style's text, or for two-behaviour
    behaviours.TwoBehaviourTargets (a guess with probability guess_share, else a phrased
    derivation with tail words; deterministic per seed and puzzle, so resume needs no state)."""
    if cfg.style != "two-behaviour":
        return lambda record: target_response(record, cfg.style)
    from ..task.behaviours import TwoBehaviourTargets
    return TwoBehaviourTargets(cfg.guess_share, phrased=True, seed=cfg.seed, tails=True)


# Puzzles whose targets give the loss's constant divisor (two-behaviour, design choice 7),
# drawn from a stream of their own, so the training stream is the same with or without it.
NORM_PROBE, NORM_SEED = 64, 7_919


def exclude_files(spec: str | None) -> list[str]:
    """The files of an ``exclude`` spec: comma-separated paths or glob patterns, each as
    written or else relative to the checkout (paths.resolve_model), a pattern expanded to
    its matches in sorted order (written as the pattern was: relative stays relative).
    A path that does not exist or a pattern that matches nothing is an error: a typo must
    not silently train on an evaluation set."""
    from ..paths import CHECKOUT, in_checkout, resolve_model
    files: list[str] = []
    for item in (x.strip() for x in (spec or "").split(",")):
        if not item:
            continue
        if glob.has_magic(item):
            matches = sorted(glob.glob(item))
            if not matches and in_checkout() and not os.path.isabs(item):
                matches = sorted(os.path.relpath(m, CHECKOUT) for m in glob.glob(str(CHECKOUT / item)))
            if not matches:
                raise SystemExit(f"--exclude {item}: no file matches (python scripts/heldout_set.py "
                                 "--size N makes data/heldoutN.jsonl)")
        elif not os.path.exists(resolve_model(item)):
            raise SystemExit(f"--exclude {item}: no such file (python scripts/heldout_set.py --size N "
                             "makes data/heldoutN.jsonl)")
        else:
            matches = [item]
        files += [m for m in matches if m not in files]
    return files


def excluded_keys(spec: str | None) -> set:
    """Puzzle keys never to train on: the official test sets and the puzzles in the files of
    ``spec`` (exclude_files: one path, as every run before the patterns, or several)."""
    from ..paths import resolve_model          # as written, else relative to the checkout
    keys = kk.keys_of(kk.load_official())
    for file in exclude_files(spec):
        keys |= kk.keys_of(kk.load_jsonl(resolve_model(file)))
    return keys


def trained_style(folder: str) -> str | None:
    """The chain-of-thought style an adapter folder was trained on (its warmstart.json; a
    file from before ``style`` existed means backtracking), None without the file: more
    training from ``--init`` continues that style unless ``--style`` is given."""
    path = os.path.join(folder, "warmstart.json")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)["config"].get("style", "backtracking")


def init_adapter(cfg: LMWarmStartConfig) -> dict:
    """The adapter weights of cfg.init (float32), after checking that it adapts cfg.model
    with cfg.lora_rank: any other adapter would load into the wrong weights or fail."""
    from safetensors.torch import load_file
    from ..lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS, adapter_base, is_adapter_folder
    if not is_adapter_folder(cfg.init):
        raise SystemExit(f"--init {cfg.init}: not an adapter folder (no {ADAPTER_CONFIG})")
    with open(os.path.join(cfg.init, ADAPTER_CONFIG)) as f:
        rank = json.load(f)["r"]
    if os.path.realpath(adapter_base(cfg.init)) != os.path.realpath(cfg.model) or rank != cfg.lora_rank:
        raise SystemExit(f"--init {cfg.init} adapts {adapter_base(cfg.init)} at rank {rank}, not "
                         f"--model {cfg.model} at --lora-rank {cfg.lora_rank}")
    return {k: v.float() for k, v in load_file(os.path.join(cfg.init, ADAPTER_WEIGHTS)).items()}


class LMWarmStart:
    """One run: the model with its adapters, the data, and the state `state` saves."""

    def __init__(self, cfg: LMWarmStartConfig, model, tokenizer, resume: dict | None = None, log=print):
        from ..lora import add_lora, load_adapter_state
        if resume is None:      # the files, not a pattern: --resume must exclude the same ones
            cfg = replace(cfg, exclude=",".join(exclude_files(cfg.exclude)))
        self.cfg, self.log, self.tokenizer = cfg, log, tokenizer
        self.model = add_lora(model, cfg.lora_rank, seed=cfg.seed)
        if cfg.init and resume is None:
            load_adapter_state(self.model, init_adapter(cfg))
        self.model.train()
        self.rng = random.Random(cfg.seed)
        keys = excluded_keys(cfg.exclude)
        self.stream = PuzzleStream(cfg.seed, exclude=keys, unsolvable_share=cfg.unsolvable_share)
        self.target = targets(cfg)
        self.normalizer = self.expected_tokens(keys) if cfg.style == "two-behaviour" else None
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(trainable, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
        self.step, self.skipped, self.history, elapsed = 0, 0, [], 0.0
        if resume is not None:
            load_adapter_state(self.model, resume["adapter"])
            self.opt.load_state_dict(resume["optimizer"])
            self.rng.setstate(resume["rng"])
            self.stream.restore(resume["stream"])
            self.step, self.skipped, self.history = resume["step"], resume["skipped"], resume["history"]
            elapsed = resume["elapsed"]
            log(f"[resume] {resume_dir(cfg.out)} at step {self.step}")
        log(f"[lm-warmstart] {cfg.model}: {sum(p.numel() for p in trainable):,} adapter parameters "
            f"(rank {cfg.lora_rank}), threads {torch.get_num_threads()}")
        self.t0 = time.time() - elapsed         # a resumed run's clock counts its first part

    def expected_tokens(self, keys: set) -> float:
        """The loss's constant divisor for two behaviours (tiny-warm's, warmstart.py): a batch's
        expected number of response tokens, batch_size x the mean over NORM_PROBE targets of
        the first size that fit the budget. A per-batch mean would weigh a short guess's
        tokens several times a derivation's; with the constant every token weighs the same."""
        probe = PuzzleStream(self.cfg.seed + NORM_SEED, exclude=keys, unsolvable_share=self.cfg.unsolvable_share)
        lengths = []
        while len(lengths) < NORM_PROBE:
            ids, n_prompt = encode(self.tokenizer, probe.next(self.cfg.sizes[0]), self.cfg.style, self.target)
            if len(ids) - n_prompt <= self.cfg.max_response_tokens:
                lengths.append(len(ids) - n_prompt)
        return self.cfg.batch_size * sum(lengths) / len(lengths)

    def batch(self) -> tuple:
        """The next batch: ``batch_size`` puzzles of one size whose target fits the budget."""
        n = self.rng.choice(self.cfg.sizes)
        examples = []
        while len(examples) < self.cfg.batch_size:
            ids, n_prompt = encode(self.tokenizer, self.stream.next(n), self.cfg.style, self.target)
            if len(ids) - n_prompt <= self.cfg.max_response_tokens:
                examples.append((ids, n_prompt))
            else:
                self.skipped += 1
        return collate(examples, self.tokenizer.pad_token_id)

    def train_step(self) -> float:
        """One optimizer step; its loss, learning rate and the run's clock go to history."""
        for g in self.opt.param_groups:
            g["lr"] = lr_at(self.step, self.cfg)
        ids, _, mask = self.batch()
        loss = response_loss(self.model, ids, mask, self.cfg.bf16, normalizer=self.normalizer)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in self.model.parameters() if p.requires_grad], 1.0)
        self.opt.step()
        self.step += 1
        per_token = loss.item() * (self.normalizer / mask.sum().item() if self.normalizer else 1.0)
        self.history.append({"step": self.step, "loss": round(per_token, 5),
                             "lr": self.opt.param_groups[0]["lr"], "seconds": round(time.time() - self.t0, 1)})
        return per_token

    def state(self) -> dict:
        """What --resume needs, as plain data (runs.read_state's form)."""
        from ..lora import adapter_state
        return {"format": STATE_FORMAT, "config": asdict(self.cfg), "adapter": adapter_state(self.model),
                "optimizer": self.opt.state_dict(), "rng": self.rng.getstate(), "stream": self.stream.state(),
                "step": self.step, "skipped": self.skipped, "history": self.history,
                "elapsed": time.time() - self.t0}

    def run(self) -> None:
        cfg = self.cfg
        bar = tqdm(total=cfg.steps, initial=self.step, disable=not cfg.progress, file=sys.stderr, unit="step")
        while self.step < cfg.steps:
            loss = self.train_step()
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.3f}", refresh=False)
            if not cfg.progress and self.step % 10 == 0:
                self.log(f"[step {self.step}] loss {loss:.4f} ({time.time() - self.t0:.0f} s)")
            if cfg.state_every_steps and self.step % cfg.state_every_steps == 0 and self.step < cfg.steps:
                save_state(self.state(), cfg.out)
        bar.close()
        self.save()

    def save(self) -> None:
        """The adapter folder, with warmstart.json (the config, the loss curve, the machine)."""
        from ..lora import save_adapter
        info = {"config": asdict(self.cfg), "skipped_targets": self.skipped, "history": self.history,
                "loss_normalizer": self.normalizer, "machine": machine_info()}
        save_adapter(self.model, self.cfg.out, base=self.cfg.model, extra={"warmstart.json": info})
        shutil.rmtree(resume_dir(self.cfg.out), ignore_errors=True)     # complete: nothing to resume
        self.log(f"[save] {self.cfg.out} ({self.step} steps, {self.skipped} targets over budget skipped)")


STATE_FILE = "state.pt"


def resume_dir(out: str) -> str:
    return out.rstrip("/") + ".resume"


def save_state(state: dict, out: str) -> None:
    """OUT.resume/state.pt, written beside and renamed (a kill never leaves half a file)."""
    folder = resume_dir(out)
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, STATE_FILE + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, os.path.join(folder, STATE_FILE))


def load_state(out: str) -> dict:
    path = os.path.join(resume_dir(out), STATE_FILE)
    if not os.path.exists(path):
        raise SystemExit(f"--resume {out}: no saved training state at {path} (a run saves it every "
                         "--state-every-steps steps and deletes it when it completes)")
    state = read_state(path, f"delete {resume_dir(out)} and run the original command again")
    state["config"] = LMWarmStartConfig(**{k: tuple(v) if k == "sizes" else v for k, v in state["config"].items()})
    return state


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m lopti_minimal.experiments.lm_warmstart",
                                 description="Supervised LoRA warm start of a pretrained LM on K&K.",
                                 formatter_class=HelpFormatter)
    ap.add_argument("--resume", metavar="OUT", default=None,
                    help="continue the interrupted run that writes OUT from its saved state (its own "
                         "options apply, except --threads and --no-progress)")
    add_options(ap.add_argument_group("run options"), LMWarmStartConfig)
    ap.error = one_line_error
    return ap


def main(argv=None) -> int:
    ap = build_parser()
    a = ap.parse_args(argv)
    opts = given(a, LMWarmStartConfig)
    if opts.get("init") and "style" not in opts and trained_style(opts["init"]):
        opts["style"] = trained_style(opts["init"])
    cfg = LMWarmStartConfig(**opts)
    state = None
    if a.resume:
        try:
            state = load_state(a.resume)
        except StateFileError as e:
            ap.error(f"cannot resume: {e}")
        cfg, threads, progress = state["config"], cfg.threads, cfg.progress
        cfg.out, cfg.threads, cfg.progress = a.resume, threads, progress
    if not cfg.out:
        ap.error("--out is required: the adapter folder to write")
    if cfg.steps < 1 or cfg.batch_size < 1 or cfg.lora_rank < 1:
        ap.error("--steps, --batch-size and --lora-rank must be >= 1")
    if not (0 <= cfg.guess_share < 1 and 0 <= cfg.unsolvable_share < 1):
        ap.error("--guess-share and --unsolvable-share must lie in [0, 1)")
    if cfg.guess_share and cfg.style != "two-behaviour":
        ap.error(f"--guess-share is for --style two-behaviour; --style {cfg.style} has one behaviour")
    exclude_files(cfg.exclude)          # a missing file is refused before the model loads
    torch.set_num_threads(cfg.threads or os.cpu_count())
    torch.manual_seed(cfg.seed)
    from ..models import load_model_and_tokenizer
    model, tokenizer = load_model_and_tokenizer(cfg.model, dtype=torch.float32, device="cpu")
    LMWarmStart(cfg, model, tokenizer, resume=state, log=lambda s: print(s, flush=True)).run()
    print(json.dumps({"out": cfg.out, "steps": cfg.steps}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
