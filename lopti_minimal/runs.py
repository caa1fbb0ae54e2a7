"""Run directories: what a run writes, how it is written, and how it is read back.

    RUN_DIR/run.json          marker + full config (what --resume reads back: config_from_json)
    RUN_DIR/metrics.jsonl     one JSON object per RL step
    RUN_DIR/evals.jsonl       one JSON object per evaluation (periodic and final)
    RUN_DIR/ckpt-000010/      HF checkpoint (save_pretrained) + trainer_state.pt (read_state)
    RUN_DIR/final/            the final policy, HF format (load it with eval.py --model)
    RUN_DIR/adapter/          a LoRA run's final adapter alone (peft layout, float32)
    RUN_DIR/eval_final.json   the final evaluation; summary.json: paths and the final accuracy
    RUN_DIR/eval_heldout_step<N>.json  greedy accuracy on cfg.heldout_data after step N

Design choices:

1. One atomic saver, ``save_hf_atomic``, writes every checkpoint of the project -- the RL
   loop's periodic and final policies (plumbing.Run) and the supervised warm start
   (experiments/warmstart.py).
2. A Hugging Face folder is written under a temporary name and renamed, so a reader (or a
   resume after kill -9) sees either the old folder or the complete new one.
3. Loading a run runs no code from it: run directories travel (a colleague's run, an
   archive), and a pickle can name any function for its loader to call. Weights are
   safetensors; what a checkpoint holds beside them (trainer_state.pt here, the warm
   start's warmstart_state.pt) is tensors, numbers, strings and plain containers only,
   saved with torch.save and read back by `read_state` with torch.load(weights_only=True),
   which builds data and calls nothing. A file not in that form is refused.
4. Every .jsonl line is strict JSON (RFC 8259 has no NaN): a non-finite value is written as
   null and named in the line's ``nonfinite_values``, which read_jsonl turns back into the
   float; run.json records the RL data's SHA-256 (run_guard.check_data compares it).
"""
from __future__ import annotations

import dataclasses
import json
import os
import platform
import random
import shutil
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from .config import TrainConfig
from .lora import adapter_state, is_lora, merged_copy
from .precision import NonFiniteError, nonfinite_weights
from .paths import swap_in, work_root

RUN_MARKER = "lopti-minimal-run"          # run.json["kind"]: what makes a dir "one of our runs"
RUNS_ROOT = work_root() / "runs"        # the repository's runs/, or ./runs of an installed copy


def default_run_dir(cfg) -> str:
    """runs/<time>-<preset>-<method>-s<seed> (cfg: a TrainConfig)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return str(RUNS_ROOT / f"{stamp}-{cfg.preset}-{cfg.method}-s{cfg.seed}")


def heldout_step_file(step: int) -> str:
    """The name of a run's held-out evaluation after RL step ``step`` (cfg.heldout_steps)."""
    return f"eval_heldout_step{int(step)}.json"


def saved_config(path) -> dict | None:
    """The config a run directory was made with (run.json["config"], a dict), or None when
    ``path`` is not one of our runs. The one reader of run.json."""
    try:
        saved = json.loads((Path(path) / "run.json").read_text())
        return saved["config"] if saved.get("kind") == RUN_MARKER else None
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        return None


def config_to_json(cfg: TrainConfig) -> dict:
    """run.json's "config" (and a checkpoint's): the TrainConfig as plain JSON."""
    d = dataclasses.asdict(cfg)
    d["eval_max_new_tokens"] = {str(k): v for k, v in cfg.eval_max_new_tokens.items()}
    return d


# How `config_from_json` reads a config saved by an older version (an archived run.json, a
# checkpoint's trainer_state.pt): a field the file lacks takes the value the code had before
# the field existed, which is its default unless listed below; a key that is no longer a
# field is dropped (a removed field).
MISSING_DEFAULTS = {
    # Runs saved before the clamp was an option ran with current verl's 20 (grpo.kl_k3).
    "kl_log_ratio_clamp": 20.0,
    # Runs saved before the decoder was an option sampled with transformers' forward.
    "decoder": "hf",
}
_TUPLE_FIELDS = ("rl_sizes", "eval_sizes", "adam_betas", "heldout_steps")


def config_from_json(d: dict) -> TrainConfig:
    """The TrainConfig of a saved config (`config_to_json`), old ones too (MISSING_DEFAULTS)."""
    names = {f.name for f in dataclasses.fields(TrainConfig)}
    d = {**MISSING_DEFAULTS, **{k: v for k, v in d.items() if k in names}}
    if "eval_max_new_tokens" in d:
        d["eval_max_new_tokens"] = {int(k): v for k, v in d["eval_max_new_tokens"].items()}
    for k in _TUPLE_FIELDS:
        if k in d:
            d[k] = tuple(d[k])
    return TrainConfig(**d)


def machine_info() -> dict:
    """The machine a measurement ran on (the CPU's model name, cores, GPU, versions): step
    rates and wall-clock budgets differ between machines by 1.5x and more, so every record
    that holds a time names its machine."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    import transformers
    # threads: torch's intra-op threads now (a run sets them before it records this); bf16
    # results differ by CPU and torch build, so a number is traced to all of these.
    return {"cpu": cpu, "cores": os.cpu_count(), "threads": torch.get_num_threads(), "gpu": gpu,
            "python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "platform": platform.platform()}


def code_version() -> dict | None:
    """The commit of the code a run was made with, and whether tracked files differed from
    it ("dirty"); None outside a git checkout (an installed copy). So a report can say
    which code its runs ran on."""
    import subprocess
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": head, "dirty": bool(dirty)}


def is_run_dir(path) -> bool:
    return saved_config(path) is not None


def checkpoints(run_dir) -> list[tuple[int, Path]]:
    """Complete periodic checkpoints, oldest first. A checkpoint is complete once renamed
    from its temporary name, so a crash mid-save leaves only a *.tmp folder, ignored."""
    out = []
    for p in Path(run_dir).glob("ckpt-*"):
        if p.is_dir() and p.name[5:].isdigit() and (p / "trainer_state.pt").exists():
            out.append((int(p.name[5:]), p))
    return sorted(out)


def resolve_model_source(path: str) -> tuple[str, dict | None]:
    """A run directory means its final policy (or, if unfinished, its latest checkpoint);
    returns (model source, the run's config as a dict or None)."""
    cfg = saved_config(path) if os.path.isdir(path) else None
    if cfg is not None:
        if (Path(path) / "final" / "config.json").exists():
            return str(Path(path) / "final"), cfg
        ck = checkpoints(path)
        if not ck:
            raise ValueError(f"run {path} has no checkpoint yet")
        return str(ck[-1][1]), cfg
    return path, None


def save_hf_atomic(model, tokenizer, out, extra: dict | None = None, dtype: torch.dtype | None = None) -> None:
    """save_pretrained into out.tmp, extra files beside it, then one rename: a reader (or a
    resume after kill -9) sees either the old checkpoint or the complete new one.

    extra: {file name: object}, written with json (names ending in .json) or torch.save.
    dtype: save the weights cast to this dtype (the model itself is left as it is).
    Non-finite weights are never written (precision.NonFiniteError, precision.py choice 7):
    the folder at ``out`` stays as it was, and save_checkpoint deletes no older one."""
    out = Path(out)
    model = merged_copy(model)     # LoRA: a plain checkpoint that eval.py loads (lora.py, choice 4)
    bad = nonfinite_weights(model)
    if bad:
        raise NonFiniteError("policy", bad, f"{out.name} was not written")
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        _write_folder(model, tokenizer, tmp, extra, dtype)
    except Exception as e:                # a full disk, a lost mount: the old folder stays
        shutil.rmtree(tmp, ignore_errors=True)
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise WriteError(f"cannot write {out}: {why}") from e
    swap_in(tmp, out)                     # "final" or a warm start is replaced


class WriteError(OSError):
    """A checkpoint could not be written (its temporary folder is removed; the previous one
    stands): one line for the command to print."""


def _write_folder(model, tokenizer, tmp: Path, extra: dict | None, dtype: torch.dtype | None) -> None:
    """save_hf_atomic's writes into the temporary folder."""
    if dtype is None:
        model.save_pretrained(tmp, safe_serialization=True)
    else:
        sd = {k: v.detach().to(dtype).clone() for k, v in model.state_dict().items()}
        dtype0 = model.config.dtype
        model.config.dtype = dtype
        try:
            model.save_pretrained(tmp, state_dict=sd, safe_serialization=True)
        finally:
            model.config.dtype = dtype0
    tokenizer.save_pretrained(tmp)
    for name, obj in (extra or {}).items():
        if name.endswith(".json"):
            with open(tmp / name, "w") as f:
                json.dump(obj, f, indent=1, default=str)
        else:
            torch.save(obj, tmp / name)


# The "format" entry of every state file (choice 3). Files of the first format carry no
# entry: they held numpy arrays and Python objects, which only the full unpickler loads.
STATE_FORMAT = 2


class StateFileError(ValueError):
    """A state file that is not in the form `read_state` loads: refused, nothing in it run."""


def read_state(path, remedy: str) -> dict:
    """A state file (choice 3) read with the weights-only unpickler. Anything else -- a
    crafted pickle, a file of the first format, a truncated file -- raises StateFileError,
    one line that ends in ``remedy`` (what the user can do)."""
    try:
        with warnings.catch_warnings():     # torch warns (on stderr) about odd pickles; the
            warnings.simplefilter("ignore")  # refusal below says it in one line
            state = torch.load(path, weights_only=True)
    except Exception:    # a bad file raises UnpicklingError, OSError, EOFError, RuntimeError...
        state = None
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        raise StateFileError(f"{path} is not a state file this version of lopti-minimal writes "
                             "(an older version's, a truncated one, or not one of ours): it was not "
                             "loaded, and nothing in it ran. An older version's file resumes with that "
                             f"version, if you trust it; otherwise {remedy}")
    return state


def rng_states() -> dict:
    """The global generators' states in read_state's form: numpy's array as a list of
    ints, Python's state a tuple of ints, torch's a tensor."""
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    return {"python": random.getstate(),
            "numpy": [name, keys.tolist(), int(pos), int(has_gauss), float(gauss)],
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def restore_rng_states(rng: dict) -> None:
    """Set the generators saved by `rng_states` (CUDA's is saved, not restored: no code of
    ours draws from it)."""
    random.setstate(rng["python"])          # tuples stay tuples through torch.save/load
    name, keys, pos, has_gauss, gauss = rng["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(rng["torch"])


def save_checkpoint(run_dir, step: int, model, tokenizer, optimizer, config: dict, keep: int) -> Path:
    """RUN_DIR/ckpt-<step>: the policy, and in trainer_state.pt (read_state's form) the
    optimizer state (Lopti per stage: both stages' states, lopti.StageOptimizers), the global
    RNG states and the run's config (``config``, JSON-ready).
    Older periodic checkpoints beyond the newest ``keep`` are deleted (0 keeps them all)."""
    state = {
        "format": STATE_FORMAT,
        "step": step,
        "optimizer": optimizer.state_dict(),
        "rng": rng_states(),
        "config": config,
    }
    if is_lora(model):
        state["lora"] = adapter_state(model)     # --resume puts these on the base model
    path = Path(run_dir) / f"ckpt-{step:06d}"
    save_hf_atomic(model, tokenizer, path, {"trainer_state.pt": state})
    if keep:                                     # 0 keeps them all
        for _, old in checkpoints(run_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return path


def truncate_jsonl(path: Path, max_step: int) -> None:
    """Drop lines logged after the checkpoint we resume from (they will be redone), and the
    final evaluation's line (a resumed run ends in its own, so a run has one "final" line),
    so the resumed run's log equals an uninterrupted run's. Atomic rewrite."""
    if not path.exists():
        return
    keep = []
    for line in path.read_text().splitlines():
        try:
            d = json.loads(line)
            if d.get("step", 0) <= max_step and not d.get("final"):
                keep.append(line)
        except ValueError:          # a half-written last line after kill -9
            pass
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(line + "\n" for line in keep))
    os.replace(tmp, path)


def record_session(run_dir, step: int, data_changed: dict | None = None) -> None:
    """A resumed run appends its session to run.json["resumed"] (from ``step``, when, the
    code and the machine), so that a run continued on another CPU, torch or thread count
    says so: the study pairs runs by machine (experiments/grid.py, choice 4). A change of
    the RL data that the resume was allowed (``data_changed``: the old and new hashes) is
    recorded in the session, and the new hash becomes the run's."""
    path = Path(run_dir) / "run.json"
    saved = json.loads(path.read_text())
    session = {"step": step, "at": time.strftime("%Y-%m-%d %H:%M:%S"), "code": code_version(),
               "machine": machine_info()}
    if data_changed:
        session.update(data_changed)
        saved["data_sha256"] = data_changed["data_sha256"]
    saved.setdefault("resumed", []).append(session)
    write_json(path, saved)


def write_json(path, obj) -> None:
    """``obj`` as indented JSON at ``path``, atomically (a temporary file, then os.replace):
    an interruption leaves the old file or the new one, never half of one."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1))
    os.replace(tmp, path)


def file_sha256(path) -> str:
    """"sha256:<hex>" of a file's bytes: run.json records each input file's (the RL data), so
    that --resume can tell when it changed under the run."""
    import hashlib
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return "sha256:" + h.hexdigest()


def read_jsonl(path) -> list[dict]:
    """A log that append_jsonl writes (metrics.jsonl, evals.jsonl, study_log.jsonl): its
    objects in order, each non-finite value that append_jsonl wrote as null a float again
    (`restore_nonfinite`); [] before the first line, and a half-written last line (a process
    killed mid-write) left out, as truncate_jsonl leaves it out on --resume."""
    path = Path(path)
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(restore_nonfinite(json.loads(line)))
        except ValueError:
            pass
    return out


# A .jsonl line is strict JSON (RFC 8259 has no NaN or Infinity, which strict readers refuse):
# a non-finite number is written as null, and this field of the line says where and what it
# was ({"reward": "nan", "bin_rose.2": "inf"}), so read_jsonl gives the float back.
NONFINITE_FIELD = "nonfinite_values"


def _strict(value, where: str, found: dict):
    if isinstance(value, float) and not np.isfinite(value):
        found[where] = "nan" if np.isnan(value) else ("inf" if value > 0 else "-inf")
        return None
    if isinstance(value, dict):
        return {k: _strict(v, f"{where}.{k}" if where else str(k), found) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict(v, f"{where}.{i}", found) for i, v in enumerate(value)]
    return value


def strict_json_line(obj: dict) -> str:
    """``obj`` as one line of strict JSON: non-finite floats as null, listed in
    NONFINITE_FIELD."""
    found: dict = {}
    clean = _strict(obj, "", found)
    if found:
        clean[NONFINITE_FIELD] = found
    return json.dumps(clean, allow_nan=False)


def restore_nonfinite(obj: dict) -> dict:
    """The inverse of strict_json_line on a parsed line: each value NONFINITE_FIELD names is
    its float again, and the field goes (the object is the one that was written)."""
    found = obj.pop(NONFINITE_FIELD, None) if isinstance(obj, dict) else None
    for where, what in (found or {}).items():
        *parents, last = where.split(".")
        node = obj
        try:
            for k in parents:
                node = node[int(k)] if isinstance(node, list) else node[k]
            if isinstance(node, list):
                node[int(last)] = float(what)
            else:
                node[last] = float(what)
        except (KeyError, IndexError, ValueError, TypeError):
            pass                       # a line edited by hand: leave it as it is
    return obj


def append_jsonl(path: Path, obj: dict) -> None:
    """One strict JSON line (strict_json_line), flushed, so a kill leaves at most
    a half-written last line (read_jsonl and truncate_jsonl skip it)."""
    line = strict_json_line(obj)
    with open(path, "a") as f:
        f.write(line + "\n")
        f.flush()
