"""The RL loop's plumbing: what it takes to run the method, and none of the method.

A reader of the method can skip this module (trainer.py is the method: `rl_step` and the
loop of `train`); try not to modify it (CleanRL marks its parts of this kind the same way).
What lives here:

- seeds: every random draw of a step derives from (seed, step);
- data: the cached RL prompt set, or the user's K&K file;
- the policy on the configured device and dtype;
- the run directory (runs.py writes the files; run_guard.py keeps it true to its name):
  checks, a new run or a resumed one (checkpoint, optimizer, RNG states), the per-step
  logs, TensorBoard, the evaluation hooks, periodic checkpoints, the end (final policy,
  evaluation, plots, summary);
- the step's metrics and its one-line summary; a non-finite batch or policy: the run
  stops there, or skips the update (precision.py, choice 7), and says so.

The GPU memory estimate (the table in docs/GPU.md) is gpu_memory.py's.

Design choices (the run directory in full: docs/ARCHITECTURE.md):

1. Every random choice of a step is derived from (seed, step): the prompts from a
   permutation seeded by (seed, epoch), the sampler's torch.Generator by (seed, step).
   Nothing random is carried between steps except the model and optimizer, which the
   checkpoints store exactly, so a run resumed from its step-k checkpoint repeats steps
   k+1.. bit for bit (tests/test_trainer.py proves it). The global RNG states are saved
   too, for code that might use them (none of ours does).
2. Everything a run writes lives in its run directory (run.json, metrics.jsonl,
   evals.jsonl, ckpt-*/, final/, eval_final.json, plots), read and written by runs.py.
3. Bad input is a TrainError, raised before anything is loaded or written where it can be.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from . import host_memory, precision, run_guard, runs
from .config import TrainConfig, TrainError, validate
from .grpo import UpdateMetrics, kl_k3
from .lopti import low_fraction
from .lora import load_adapter_state, save_adapter
from .mechanism import Probe
from .models import ModelLoadError, count_parameters, default_device, load_model_and_tokenizer, \
    set_gradient_checkpointing
from .paths import resolve_model, work_root
from .precision import attention_kernels, check_hardware, master_dtype
from .reweight import mean_weight
from .task import dataset, kk, reward
from .task.behaviours import derive_share
from .task.evaluate import evaluate_records, read_records, write_eval_json

# The repository (or, in an installed copy, the current directory): cache/ is written here.
ROOT = work_root()


# =======================================================================================
# Seeds: every random draw of a step derives from (seed, step)
# =======================================================================================

def step_generator(seed: int, step: int, device="cpu", round: int = 0) -> torch.Generator:
    """The sampler's generator for one step. Seeding by (seed, step) rather than carrying
    one generator through the run is what makes resume exact without saving its state.
    ``round`` > 0: dynamic sampling's further rounds of the step, each its own stream."""
    entropy = [seed, step, 1] + ([round] if round else [])      # round 0: the step's only one before
    g = torch.Generator(device=device)
    g.manual_seed(int(np.random.SeedSequence(entropy).generate_state(1)[0]))
    return g


def step_prompt_indices(seed: int, step: int, per_step: int, n: int, stream: int = 0) -> list[int]:
    """Indices of the step's prompts: consecutive slices of a fresh permutation of the
    prompt set per epoch (each epoch sees every prompt once), seeded by (seed, epoch).
    ``stream`` 1: dynamic sampling's further rounds, an independent permutation of their own."""
    out = []
    for k in range(step * per_step, (step + 1) * per_step):
        epoch, pos = divmod(k, n)
        out.append(int(_permutation(seed, epoch, n, stream)[pos]))
    return out


def step_prompts(records: list, prompt_ids: list, cfg: TrainConfig, step: int,
                 round: int = 0) -> tuple[list, list]:
    """(records, prompt ids) of a step's sampling round. Round 0: slice ``step`` of the
    prompt stream, the paper's step, the same prompts with or without dynamic sampling (so
    its runs pair with the paper's by seed). Round r >= 1 (dynamic sampling only): slice
    step * N + r - 1 of a second, independent stream (N = cfg.dynamic_sampling), so the
    rounds draw fresh prompts and a step's prompts still depend only on (seed, step)
    (dynamic_sampling.py, choice 2)."""
    if round == 0:
        idx = step_prompt_indices(cfg.seed, step, cfg.prompts_per_step, len(records))
    else:
        idx = step_prompt_indices(cfg.seed, step * cfg.dynamic_sampling + round - 1, cfg.prompts_per_step,
                                  len(records), stream=1)
    return [records[i] for i in idx], [prompt_ids[i] for i in idx]


_PERM_CACHE: dict = {}


def _permutation(seed: int, epoch: int, n: int, stream: int = 0) -> np.ndarray:
    key = (seed, epoch, n, stream)
    if key not in _PERM_CACHE:
        if len(_PERM_CACHE) >= 4:               # only the current epoch of each stream is needed
            _PERM_CACHE.clear()
        # stream 0 is seeded as before dynamic sampling existed: the paper's runs are unchanged
        entropy = [seed, epoch, 2] + ([stream] if stream else [])
        _PERM_CACHE[key] = np.random.default_rng(entropy).permutation(n)
    return _PERM_CACHE[key]


# =======================================================================================
# Data and the policy
# =======================================================================================

def rl_prompt_set(cfg: TrainConfig, progress: bool = True) -> tuple[list[dict], str]:
    """Generated K&K records for RL (sizes cfg.rl_sizes, cfg.rl_per_size each), with every
    official test puzzle excluded; cached as JSON Lines so later runs reuse the same set.
    With cfg.rl_data: that file's records. Returns (records, path)."""
    if cfg.rl_data:
        try:
            return read_records(cfg.rl_data), str(cfg.rl_data)
        except ValueError as e:
            raise TrainError(str(e)) from e
    sizes = "-".join(str(n) for n in cfg.rl_sizes)
    # ROOT / an absolute cache_dir is that absolute path.
    path = ROOT / cfg.cache_dir / "rl_prompts" / f"kk-n{sizes}-x{cfg.rl_per_size}-seed{cfg.data_seed}.jsonl"
    if path.exists():
        return kk.load_jsonl(path), str(path)
    exclude = kk.official_keys()
    records: list[dict] = []
    with tqdm(total=len(cfg.rl_sizes) * cfg.rl_per_size, desc="RL prompts", disable=not progress,
              file=sys.stderr) as bar:
        for n in cfg.rl_sizes:
            # A seed per size, so adding a size does not change the others' puzzles.
            records += dataset.generate_records(n, cfg.rl_per_size, seed=cfg.data_seed + 1000 * n,
                                                exclude=exclude, progress=bar)
    path.parent.mkdir(parents=True, exist_ok=True)
    kk.save_jsonl(records, path, overwrite=True)      # atomic (temp file, then rename)
    return records, str(path)


def resolve_device(cfg: TrainConfig) -> torch.device:
    return default_device() if cfg.device == "auto" else torch.device(cfg.device)


def load_policy(cfg: TrainConfig, source: str | None = None):
    """(model, tokenizer) from cfg.model (or ``source``, e.g. a checkpoint), on the
    configured device, in the master dtype (precision.py); gradient checkpointing as
    configured."""
    # repo-relative defaults work from any working dir, and from an installed copy
    src = source or cfg.model
    src = resolve_model(src) if src else src
    try:
        model, tok = load_model_and_tokenizer(src, dtype=master_dtype(cfg), device=resolve_device(cfg))
    except ModelLoadError as e:
        raise TrainError(str(e)) from e
    set_gradient_checkpointing(model, cfg.gradient_checkpointing)
    return model, tok


# =======================================================================================
# The run directory: checks, start or resume, per-step logs, checkpoints, the end
# =======================================================================================

def read_run_config(path) -> TrainConfig:
    """The config of an existing run; TrainError if ``path`` is not one of our runs."""
    if not Path(path).is_dir():
        raise TrainError(f"--resume {path}: no such directory")
    saved = runs.saved_config(path)
    if saved is None:
        raise TrainError(f"--resume {path}: not a lopti-minimal run directory (no valid run.json)")
    return runs.config_from_json(saved)


def resume_config(run_dir, steps: int | None = None, progress: bool | None = None,
                  on_nonfinite: str | None = None, threads: int | None = None) -> TrainConfig:
    """The saved config of a run, to continue it; ``steps`` may extend a finished run,
    ``on_nonfinite`` may change what a NaN does from here on (it changes no good step), and
    ``threads`` fits the machine it resumes on (bf16 sums may then differ in the last bits)."""
    cfg = read_run_config(run_dir)
    if threads:
        cfg.threads = threads
    cfg.run_dir = str(run_dir)
    if steps:
        cfg.steps = steps
    if progress is not None:
        cfg.progress = progress
    if on_nonfinite is not None:
        cfg.on_nonfinite = on_nonfinite
    return cfg


class Run:
    """One run's directory and everything the loop writes into it (runs.py's layout).

    `Run(cfg, resume)` checks everything that can be checked before a model is loaded;
    `start` resumes from the latest checkpoint or starts the directory; `begin` opens the
    logs; `after_step` logs, evaluates and checkpoints; `finish` writes the end."""

    def __init__(self, cfg: TrainConfig, resume: bool = False, log=None, allow_changed_data: bool = False):
        self.cfg, self.resume, self.allow_changed_data, self.data_changed = cfg, resume, allow_changed_data, None
        self.log = log or (lambda s: tqdm.write(s, file=sys.stdout))
        if resume:
            read_run_config(cfg.run_dir)          # TrainError unless it is one of our runs
        validate(cfg)
        check_hardware(cfg)                       # before any model is loaded
        attention_kernels("cuda" if cfg.device == "auto" and torch.cuda.is_available() else cfg.device)
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        # host memory (host_memory.py): large freed blocks go back to the kernel (the config's
        # mmap_threshold_mb), oneDNN's kernel caches are capped; the peak resident set is
        # logged per step and per evaluation
        host_memory.bound_process_memory(cfg.mmap_threshold_mb)
        self.dir = Path(cfg.run_dir or runs.default_run_dir(cfg))
        if not resume and self.dir.exists() and any(self.dir.iterdir()):
            raise TrainError(f"run directory {self.dir} exists and is not empty: pass --resume {self.dir} "
                             "or choose another --run-dir")
        if not resume:
            run_guard.check_writable(self.dir)
        # the puzzles of the held-out evaluations along the run, read (and checked) now
        self.heldout = heldout_records(cfg) if cfg.heldout_data else None
        self.metrics_path, self.evals_path = self.dir / "metrics.jsonl", self.dir / "evals.jsonl"
        self.start_step, self.writer, self.bar, self.history = 0, None, None, []
        self.peak_rss_gb = 0.0
        # read now, so that a state file not in plain-data form is refused before a model loads
        self.checkpoint = self.latest_checkpoint() if resume else None
        self.lock = run_guard.RunLock(self.dir)
        if resume:                                # extend, never shrink; one writer at a time
            run_guard.check_length(self.dir, cfg, self.checkpoint[0] if self.checkpoint else 0)
            self.lock.acquire()

    def check_data(self, data_path: str) -> str:
        """The RL data's content hash, checked against the run's on resume (run_guard)."""
        digest, self.data_changed = run_guard.check_data(self.dir, data_path, self.resume, self.allow_changed_data)
        return digest

    def unlock(self) -> None:
        self.lock.release()

    def __enter__(self) -> "Run":
        return self

    def __exit__(self, *exc) -> None:
        self.unlock()                 # the run folder is free again, however the run ended

    def latest_checkpoint(self) -> tuple | None:
        """(step, folder, its trainer_state.pt) of the run's latest checkpoint, or None (the
        run starts at step 0). The state is read by runs.read_state, which runs no code
        from the file; a file not in its form is a TrainError."""
        ck = runs.checkpoints(self.dir)
        if not ck:
            return None
        step, path = ck[-1]
        try:
            state = runs.read_state(path / "trainer_state.pt",
                                    f"delete {path} to resume from the checkpoint before it, or start a new run")
        except runs.StateFileError as e:
            raise TrainError(f"cannot resume: {e}") from None
        return step, path, state

    def start(self, model, optimizer, data_path: str, data_sha256: str | None = None) -> int:
        """Resume: the latest checkpoint's policy, optimizer and RNG states, the logs cut
        back to it. Otherwise a new directory with run.json (the data's path and content
        hash: check_data). Returns the first step."""
        cfg, run_dir = self.cfg, self.dir
        if not self.resume:
            try:
                run_dir.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise TrainError(f"run directory {run_dir}: {e.strerror or e}") from None
            self.lock.acquire()
            if runs.is_run_dir(run_dir):      # another run took this folder while this one loaded
                self.unlock()
                raise TrainError(f"run directory {run_dir} now holds another run: choose another --run-dir")
            runs.write_json(run_dir / "run.json",
                            {"kind": runs.RUN_MARKER, "config": runs.config_to_json(cfg), "data": data_path,
                             "data_sha256": data_sha256,
                             "created": time.strftime("%Y-%m-%d %H:%M:%S"), "code": runs.code_version(),
                             "machine": runs.machine_info()})
            return 0
        if self.checkpoint:
            self.start_step, path, state = self.checkpoint
            self.restore(model, optimizer, path, state)
            self.checkpoint = None                # its optimizer state is in the optimizer now
            self.log(f"[resume] {path} (step {self.start_step})")
        runs.record_session(run_dir, self.start_step, self.data_changed)
        for name in ("metrics.jsonl", "evals.jsonl"):
            runs.truncate_jsonl(run_dir / name, self.start_step)
        return self.start_step

    def restore(self, model, optimizer, path: Path, state: dict) -> None:
        """The checkpoint at ``path`` (``state``: its trainer_state.pt) into the model (LoRA:
        its adapters), the optimizer and the global RNG states."""
        if self.cfg.lora_rank:
            load_adapter_state(model, state["lora"])
        else:
            loaded, _ = load_policy(self.cfg, str(path))
            model.load_state_dict(loaded.state_dict())
            del loaded
        optimizer.load_state_dict(state["optimizer"])
        runs.restore_rng_states(state["rng"])

    def begin(self, model, tokenizer, n_records: int, data_path: str) -> None:
        """The run's first log line, TensorBoard, the evaluation before RL, the progress bar."""
        cfg = self.cfg
        p = next(model.parameters())
        self.log(f"[run] {self.dir}\n[run] model {cfg.model} ({count_parameters(model):,} params, "
                 f"{p.dtype}, {p.device}), method {cfg.method}, "
                 f"{cfg.prompts_per_step} prompts x G={cfg.group_size}, lr {cfg.optimizer_lr:g}, T {cfg.temperature}, "
                 f"{n_records} RL prompts ({data_path}), threads {torch.get_num_threads()}")
        self.writer = _tensorboard(cfg, self.dir)
        if cfg.eval_before and self.start_step == 0:
            ev, _ = self.evaluate(model, tokenizer)
            write_eval_json(ev, self.dir / "eval_before.json")
            self.log("[eval] before RL: " + _eval_text(ev))
        self.history = runs.read_jsonl(self.metrics_path)     # a resumed run's steps so far, as logged
        self.bar = tqdm(total=cfg.steps, initial=self.start_step, desc="RL steps", disable=not cfg.progress,
                        file=sys.stderr, unit="step")
        self.t_run = time.perf_counter()
        host_memory.take_peak_rss_gb()     # from here on: the peak of each step, each evaluation

    def evaluate(self, model, tokenizer) -> tuple[dict, float]:
        """The run's evaluation (evaluate_policy) and the peak resident memory it took."""
        host_memory.take_peak_rss_gb()     # the step before it has logged its peak
        ev = evaluate_policy(model, tokenizer, self.cfg, progress=self.cfg.progress)
        peak = host_memory.take_peak_rss_gb()
        self.peak_rss_gb = max(self.peak_rss_gb, peak)
        return ev, peak

    def evaluate_heldout(self, model, tokenizer, step: int) -> None:
        """Greedy accuracy on cfg.heldout_data after ``step``, with the final evaluation's
        numerics and budget (evaluate_on), into RUN_DIR/eval_heldout_step<N>.json."""
        cfg = self.cfg
        host_memory.take_peak_rss_gb()     # the step before it has logged its peak
        ev = evaluate_on(model, tokenizer, cfg, self.heldout, progress=cfg.progress)
        self.peak_rss_gb = max(self.peak_rss_gb, host_memory.take_peak_rss_gb())
        ev.update(model=f"{self.dir.name} after step {step}", data=cfg.heldout_data)
        write_eval_json(ev, self.dir / runs.heldout_step_file(step))
        self.log(f"[eval] {cfg.heldout_data} after step {step}: accuracy {ev['overall']['accuracy']:.3f}")

    def after_step(self, m: dict, model, tokenizer, optimizer) -> None:
        """Log the step's metrics; evaluate and checkpoint when due (not at the last step:
        `finish` does)."""
        cfg = self.cfg
        self.history.append(m)
        self.peak_rss_gb = max(self.peak_rss_gb, m["peak_rss_gb"])
        runs.append_jsonl(self.metrics_path, m)
        if self.writer:
            for k, v in m.items():
                for name, x in ([(f"{k}/bin{i}", x) for i, x in enumerate(v)] if isinstance(v, list) else [(k, v)]):
                    if isinstance(x, (int, float)):      # numbers only ("nonfinite" holds words)
                        self.writer.add_scalar(f"train/{name}", x, m["step"])
        self.bar.update(1)
        self.bar.set_postfix(reward=f"{m['reward']:+.2f}", acc=f"{m['accuracy']:.2f}", refresh=False)
        self.log(summary_line(m, cfg.steps))
        done = m["step"]
        # Evaluations before the checkpoint of the same step: a run resumed from ckpt-N has
        # every evaluation up to step N on disk, and redoes (identically) any after it.
        if done in cfg.heldout_steps:
            self.evaluate_heldout(model, tokenizer, done)
        if cfg.eval_every and done % cfg.eval_every == 0 and done < cfg.steps:
            ev, peak = self.evaluate(model, tokenizer)
            runs.append_jsonl(self.evals_path, {"step": done, **_eval_brief(ev), "peak_rss_gb": peak})
            self.log(f"[eval] step {done}: " + _eval_text(ev))
        if cfg.save_every and done % cfg.save_every == 0 and done < cfg.steps:
            runs.save_checkpoint(self.dir, done, model, tokenizer, optimizer, runs.config_to_json(cfg),
                                 cfg.keep_checkpoints)

    def stop(self, error: precision.NonFiniteError, step: int) -> None:
        """A non-finite value stopped the run at ``step`` (precision.py, choice 7): nothing of
        that step was saved, so the latest checkpoint is the last good policy; ``error``
        gets the step and how to go on, for its one line."""
        self.bar.close()
        if self.writer:
            self.writer.close()
        ck = runs.checkpoints(self.dir)
        start = f"from {ck[-1][1].name}" if ck else "from step 0 (no checkpoint yet)"
        error.step = step
        error.resume = (f"the run stopped; python train.py --resume {self.dir} continues {start} "
                        "(add --on-nonfinite skip to skip such updates)")

    def finish(self, model, tokenizer, optimizer) -> dict:
        """A final checkpoint (resumable: extend with --resume --steps N), the final policy in
        HF format, the final evaluation, plots, summary.json. Returns train()'s result."""
        cfg, run_dir = self.cfg, self.dir
        self.bar.close()
        rl_seconds = time.perf_counter() - self.t_run
        paths = {"run_dir": str(run_dir), "metrics": str(self.metrics_path)}
        if cfg.steps > self.start_step or not (run_dir / "final").exists():
            runs.save_checkpoint(run_dir, cfg.steps, model, tokenizer, optimizer, runs.config_to_json(cfg),
                                 cfg.keep_checkpoints)
            runs.save_hf_atomic(model, tokenizer, run_dir / "final")
        if cfg.lora_rank and not (cfg.steps == self.start_step and (run_dir / "adapter").exists()):
            # the final policy also as its LoRA adapter alone (peft's layout, a few MB, float32:
            # what was trained), naming its start: eval.py --model RUN_DIR/adapter loads it
            save_adapter(model, str(run_dir / "adapter"), base=cfg.model, dtype=torch.float32,
                         extra={"adapter_of.json": {"run": run_dir.name, "step": cfg.steps}})
            paths["adapter"] = str(run_dir / "adapter")
        paths["final_model"] = str(run_dir / "final")
        final_eval = None
        if cfg.final_eval:
            final_eval, peak = self.evaluate(model, tokenizer)
            write_eval_json(final_eval, run_dir / "eval_final.json")
            runs.append_jsonl(self.evals_path, {"step": cfg.steps, "final": True, **_eval_brief(final_eval),
                                                "peak_rss_gb": peak})
            paths["eval"] = str(run_dir / "eval_final.json")
            self.log("[eval] final: " + _eval_text(final_eval))
        if cfg.plots:
            try:
                from .plots import plot_run
                paths["plots"] = plot_run(run_dir)
            except Exception as e:           # plotting must never lose a finished run
                self.log(f"[plots] skipped: {e}")
        if self.writer:
            self.writer.close()
        runs.write_json(run_dir / "summary.json",
            {"steps": cfg.steps, "rl_seconds_this_session": round(rl_seconds, 1), "paths": paths,
             # the host process's peak resident memory in this session's steps and evaluations
             "peak_rss_gb_this_session": self.peak_rss_gb,
             "final_eval": _eval_brief(final_eval) if final_eval else None})
        return {"run_dir": str(run_dir), "metrics": self.history, "final_eval": final_eval, "paths": paths,
                "config": cfg}


def _tensorboard(cfg: TrainConfig, run_dir: Path):
    if not cfg.tensorboard:
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        print("[tensorboard] not installed (pip install tensorboard); logging to JSON Lines only")
        return None
    return SummaryWriter(str(run_dir / "tb"))


# =======================================================================================
# Evaluation hook
# =======================================================================================

def evaluate_policy(model, tokenizer, cfg: TrainConfig, sizes=None, per_size=None, progress=True) -> dict:
    """Greedy accuracy on the official sets (task/evaluate.py), with the run's numerics."""
    sizes = tuple(sizes or cfg.eval_sizes)
    per = per_size or cfg.eval_per_size
    records = [r for n in sizes for r in kk.load_official([n])[:per]]
    return evaluate_on(model, tokenizer, cfg, records, progress)


def evaluate_on(model, tokenizer, cfg: TrainConfig, records: list[dict], progress=True) -> dict:
    """Greedy accuracy on any K&K records with the run's evaluation numerics and budget."""
    return evaluate_records(model, tokenizer, records, max_new_tokens=cfg.eval_max_new_tokens,
                            batch_size=cfg.eval_batch_size, prompt_style=cfg.prompt_style,
                            autocast_bf16=cfg.autocast_bf16, progress=progress,
                            decoder=cfg.decoder)


def heldout_records(cfg: TrainConfig) -> list[dict]:
    """The K&K records of cfg.heldout_data (a repository-relative path works from any
    folder); TrainError if unreadable."""
    path = Path(cfg.heldout_data)
    if not path.is_absolute() and not path.exists() and (ROOT / path).exists():
        path = ROOT / path
    try:
        return read_records(path)
    except ValueError as e:
        raise TrainError(str(e)) from e


def _eval_brief(ev: dict) -> dict:
    return {"accuracy": {str(n): v["accuracy"] for n, v in ev["per_size"].items()},
            "mean_accuracy": ev["overall"]["accuracy"],
            "format_error": ev["overall"]["format_error"]}


def _eval_text(ev: dict) -> str:
    per = " ".join(f"{n}p {v['accuracy']:.2f}" for n, v in ev["per_size"].items())
    return f"accuracy {per} | mean {ev['overall']['accuracy']:.3f} | format errors {ev['overall']['format_error']:.3f}"


# =======================================================================================
# The step's metrics
# =======================================================================================

def step_metrics(cfg: TrainConfig, step: int, sb, stages: tuple, probe, fix, seconds: dict) -> dict:
    """The flat dict one RL step logs (metrics.jsonl): the samples (``sb``: trainer.make_batch's
    StepBatch), the update (``stages``: grpo_update's metrics, one per Lopti stage in the order
    they ran), the mechanism (``probe``), the times."""
    batch, rewards, texts = sb.batch, sb.rewards, sb.texts
    mask = batch.response_mask
    low = low_fraction(batch.old_logprobs, mask, cfg.low_eta)
    lengths = mask.sum(1)                          # response tokens per row
    n_tok = float(lengths.sum())
    # KL: k3 between pi_old (this step's policy) and pi_ref, over all tokens.
    kl = (float((kl_k3(batch.old_logprobs, batch.ref_logprobs, cfg.kl_log_ratio_clamp) * mask).sum()
                / max(n_tok, 1)) if batch.ref_logprobs is not None else 0.0)
    # Token shares of the stages in the order they ran (stage 1 = the high tokens if high_first).
    shares = ((low, 1 - low) if cfg.lopti_order == "low_first" else (1 - low, low)) if len(stages) == 2 else (1.0,)
    correct = (rewards == reward.RIGHT).float()
    groups = rewards.view(-1, cfg.group_size)
    return {
        "step": step + 1,
        "reward": float(rewards.mean()),
        "accuracy": float(correct.mean()),
        "format_ok": float((rewards > reward.BAD_FORMAT).float().mean()),
        # The behaviour of the samples (behaviours.py): the share that derive rather than
        # guess. From the shipped warm start RL should raise it (the selection it makes).
        "derive_share": derive_share(texts),
        "response_len": float(lengths.mean()),
        # the longest response: with the rows it sizes the KV cache and the widest micro-batch
        "max_len": int(lengths.max()),
        "truncated": float((lengths >= cfg.max_new_tokens).float().mean()),
        "kl": kl,
        "clip_frac": sum(s * st["clip_frac"] for s, st in zip(shares, stages)),
        "grad_norm": float(np.mean([st["grad_norm"] for st in stages if st["n_steps"]] or [0.0])),
        # pi_old < eta: the run's eta for a Lopti method (0.4 Lopti alone), else 0.5
        "low_fraction": low,
        **token_shares(cfg, batch, low),
        # the share of groups whose rewards are all equal (GRPO advantage 0); under dynamic
        # sampling the share of all the groups its rounds sampled: the share it dropped
        "zero_adv_groups": (sb.dynamic.uniform_groups / sb.dynamic.sampled_groups if sb.dynamic else
                            float((groups == groups[:, :1]).all(1).float().mean())),
        **dynamic_sampling_counts(sb.dynamic),
        "pg_loss": sum(st["pg_loss"] for st in stages),
        # Ratios of the first update: exactly 1 on its first mini-batch (fresh samples).
        "ratio_min": stages[0]["ratio_min"], "ratio_max": stages[0]["ratio_max"],
        **probe.metrics,
        # the share of tokens a token fix singles out (kept, detached or penalised)
        **({"fix_fraction": fix.fraction(mask)} if fix is not None and fix.mask is not None else {}),
        "tokens": int(n_tok),
        "sample_s": round(seconds["sample"], 3),
        "update_s": round(seconds["update"], 3),
        "mechanism_s": round(probe.seconds, 3),      # the mechanism's measurements (mechanism.py)
        "step_s": round(seconds["step"], 3),
        # the peak resident memory of the host process during this step (host_memory.py);
        # an evaluation's peak is logged with it (evals.jsonl)
        "peak_rss_gb": host_memory.take_peak_rss_gb(),
        # on_nonfinite "skip": the updates this step did not make (precision.py, choice 7)
        **({"nonfinite": skipped} if (skipped := precision.take_skipped()) else {}),
    }


def token_shares(cfg: TrainConfig, batch, low: float) -> dict:
    """The token metrics of the paper's question, over the valid response tokens (``low``:
    `low_fraction`'s share): ``pi_old_below_half``, the share with pi_old < 0.5 (AR+Lopti's
    eta), every method at one threshold; ``stage1_share`` (Lopti), the share Lopti's first
    stage updates (Algorithm 1: pi_old < eta, = low_fraction; the others under high_first;
    as many at random under the random split); ``ar_weight`` (AR), the mean of Eq. 4's factor
    alpha * pi_old + 1 - alpha: by how much AR scales the step's advantages on average."""
    mask = batch.response_mask
    out = {"pi_old_below_half": low_fraction(batch.old_logprobs, mask, 0.5)}
    if cfg.uses_lopti:
        out["stage1_share"] = low if cfg.lopti_order == "low_first" else 1 - low
    if cfg.uses_ar:
        out["ar_weight"] = mean_weight(batch.old_logprobs, mask, cfg.alpha)
    return out


def dynamic_sampling_counts(kept) -> dict:
    """Dynamic sampling's counts of a step (``kept``: dynamic_sampling.Kept; None: off, no
    entry): its sampling rounds, the groups kept, and why a step that kept none made no update."""
    if kept is None:
        return {}
    out = {"gen_rounds": kept.gen_rounds, "kept_groups": kept.kept_groups}
    if not kept.kept_groups:
        out["no_update"] = (f"dynamic sampling: all {kept.sampled_groups} groups of {kept.gen_rounds} "
                            "rounds had equal rewards")
    return out


def finite_batch(sb, cfg: TrainConfig) -> bool:
    """Whether the step's batch (``sb``: trainer.make_batch's StepBatch) may update the
    policy: its rewards, advantages (after AR), log pi_old and log pi_ref all finite
    (precision.py, choice 7: else the run stops, or under "skip" this is False)."""
    b = sb.batch
    return precision.finite_values({"reward": sb.rewards, "advantage": b.advantages,
                                    "log pi_old": b.old_logprobs, "log pi_ref": b.ref_logprobs}, cfg)


def skipped_step_metrics(cfg: TrainConfig, step: int, sb, seconds: float) -> dict:
    """The metrics line of a step that made no update: its batch was not finite under
    on_nonfinite "skip" (the "nonfinite" entry says what was skipped), or dynamic sampling
    kept no group ("no_update"). Its samples as `step_metrics` logs them, an update of no
    optimizer step, no mechanism measurement."""
    probe = Probe(cfg, step)
    return step_metrics(cfg, step, sb, (UpdateMetrics().result(),), probe, None,
                        {"sample": sb.sample_s, "update": 0.0, "step": seconds})


def summary_line(m: dict, steps: int) -> str:
    """The one-line per-step summary."""
    return (f"step {m['step']:>4}/{steps} | reward {m['reward']:+.3f} | acc {m['accuracy']:.3f} | "
            f"derive {m.get('derive_share', float('nan')):.2f} | len {m['response_len']:6.1f} | kl {m['kl']:.2e} | clip {m['clip_frac']:.3f} | "
            f"gnorm {m['grad_norm']:.3f} | low {m['low_fraction']:.3f} | "
            f"{m['step_s']:.1f}s (sample {m['sample_s']:.1f}s)"
            + (f" | kept {m['kept_groups']} groups in {m['gen_rounds']} rounds" if "kept_groups" in m else "")
            + (f" | skipped: {'; '.join(m['nonfinite'])}" if m.get("nonfinite") else "")
            + (f" | no update: {m['no_update']}" if m.get("no_update") else ""))
