"""Headroom for GRPO: what an RL run from a start would see, measured before any RL.

    python scripts/headroom.py --data data/heldout3.jsonl --limit 64        # tiny-warm, cpu-tiny's settings
    python scripts/headroom.py --preset smollm2-kk --data data/heldout3.jsonl --limit 40 --threads 2
    python scripts/headroom.py --model runs/<run> --data data/heldout3.jsonl     # a run's policy, its settings

GRPO learns only from a group whose rewards differ: A_i = (r_i - mean) / (std + eps) (paper
section 2) is 0 for every response of a group whose rewards are all equal, and AR (Eq. 4) and
Lopti (Algorithm 1) only rescale or reorder those advantages. So a start on which every group
of G samples is all right or all wrong gives an RL run nothing to learn from, whatever the
method. This script samples G responses to each puzzle as the trainer samples them and
reports, per puzzle (OUT.jsonl, one line each) and in sum (OUT.json, and a short table):
the sampled accuracy, the share of informative groups (rewards not all equal) and how many
of a step's prompts that makes, the response lengths and cut-offs at the budget, and where
the sampled tokens' pi_old lies (below 0.5, AR+Lopti's eta; the paper's bins of Fig. 1a).

Design choices:

1. Sampled as the trainer samples. The settings are the preset's (--preset, default
   cpu-tiny; a run directory's own when --model is one and no --preset is given): G,
   temperature, top-p/k, the budget, the decoder, bf16 autocast, the prompt (models.
   encode_prompts: the chat template of an instruct model; a prompt longer than
   max_prompt_len is dropped, as the trainer drops it). The puzzles go in chunks of
   prompts_per_step, and chunk k is sampled by trainer.rollout with the trainer's generator
   of step k (plumbing.step_generator(seed, k)): each chunk is one RL step's rollout, and
   its draws depend on (seed, k) alone. --order run takes the puzzles in the order an RL run
   with --data FILE --seed S draws them (plumbing.step_prompt_indices), so chunk k is the
   batch step k of that run would sample if the policy had not moved yet: chunk 0 is that
   run's first batch, bit for bit (tested against trainer.make_batch).
2. The reward is the trainer's (trainer.default_reward, the Logic-RL total). A group is
   informative when its rewards are not all equal: exactly the groups grpo.group_advantages
   gives a nonzero advantage. The reward has a format part, so a group can be informative
   with no right answer in it (-3 against -0.5); "mixed" counts the groups with right *and*
   wrong answers, the ones whose signal is about the answer itself.
3. pi_old is what the update would use as pi_old. Every preset recomputes it
   (recompute_old_logprobs, the reference's way): a teacher-forced forward of the sampled
   batch (grpo.batch_logprobs) under the run's autocast, of logits / T at the sampling
   temperature (sampling.py, choice 1), on the rows in the trainer's order (grpo.
   sort_by_length) in micro-batches of micro_batch_size, so each token gets the very bits
   trainer.make_batch computes (tested). A config without recomputation takes the log-probs
   the sampler recorded, as its trainer does. A LoRA preset's fresh adapters are not added:
   their B matrices start at zero, so they change no output.
   Counted per sample: the tokens with pi_old < 0.5 (lopti.split_by_probability at
   AR+Lopti's eta, config.LOW_FRACTION_ETA: the tokens Lopti's first stage would update in
   the paper's best K&K setting, one threshold for every method) and the tokens in each of
   the paper's bins [0,.25) [.25,.5) [.5,.75) [.75,1] (mechanism.bin_masks, the runs'
   bin_share).
4. Puzzles are the unit of the statistics (the G samples of a puzzle are not independent):
   the accuracy and the shares of informative and mixed groups are means over puzzles with
   a 95% t interval (experiments/stats.mean_ci, clipped to [0, 1]; it has zero width when
   every puzzle agrees, so read it with the puzzle count).
   A step of P prompts then holds P x share informative groups on average, and none at all
   with probability (1 - share)^P (puzzles drawn independently).
5. Nothing is lost on interruption: after each chunk its puzzles' lines are appended to
   OUT.jsonl and OUT.json is rewritten with the summary so far. A rerun of the same command
   skips the chunks whose puzzles are all there; since a chunk's draws depend on (seed, k)
   alone, a resumed file equals an uninterrupted one (on the same machine and threads: bf16
   kernels differ by CPU). Every line carries a fingerprint of the settings that decide its
   numbers (not --limit or --threads); lines of other settings are refused, not mixed in.
   A larger --limit later extends the same puzzles (both orders take a prefix; a last chunk
   that was partial is sampled whole again for its new puzzles).
6. What the tokens below 0.5 are (`low_token_kinds`): each is a phrasing choice (phrasing.
   choice_spans: a derivation line's optional word or ending, an answer line's mark), else
   the first token (guess or derive), else a token of the answer block (the roles), else
   "other" (names, roles tried, checks: the reasoning). AR and Lopti act on these tokens;
   whether they are the puzzle's decisions or words the reward ignores is what matters.

Bad input (a missing data file, G < 2, a value out of range, a model that does not load):
one line, exit code 2.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from lopti_minimal.cli import HelpFormatter, TrainError, one_line_error  # noqa: E402
from lopti_minimal.config import PRESETS  # noqa: E402

ORDERS = ("file", "run")
QUANTILES = (50, 90, 99)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    ap.add_argument("--data", required=True, help="K&K JSON Lines file (e.g. data/heldout3.jsonl)")
    ap.add_argument("--preset", choices=list(PRESETS),
                    help="the run whose sampling to measure (default: cpu-tiny, or the run's own "
                         "settings when --model is a run directory)")
    ap.add_argument("--model", help="HF folder, LoRA adapter folder, hub id, .gguf file or run directory "
                                    "(default: the preset's)")
    ap.add_argument("--limit", type=int, help="only the first K puzzles of --order (default: all)")
    ap.add_argument("--order", choices=ORDERS, default="file",
                    help="file: the file's order; run: a seeded sample, in the order an RL run with "
                         "--data FILE --seed S draws the puzzles (chunk k = its step k)")
    ap.add_argument("--group-size", type=int, help="G, responses per puzzle (default: the preset's)")
    ap.add_argument("--temperature", type=float, help="sampling temperature (default: the preset's)")
    ap.add_argument("--max-new-tokens", type=int, help="the response budget (default: the preset's)")
    ap.add_argument("--prompts-per-step", type=int,
                    help="puzzles sampled together, as one RL step (default: the preset's)")
    ap.add_argument("--seed", type=int, help="the run's seed: the sampler's generators (default: the preset's)")
    ap.add_argument("--threads", type=int, help="torch CPU threads (default: all cores)")
    ap.add_argument("--device", help="cpu, cuda ... (default: the preset's)")
    ap.add_argument("--out", help="the summary (.json); the per-puzzle lines go to the same name with "
                                  ".jsonl (default: runs/headroom/<model>-<data>-g<G>-b<budget>-s<seed>.json)")
    ap.add_argument("--save-responses", action="store_true", help="also keep each response's text in OUT.jsonl")
    ap.add_argument("--no-progress", action="store_true")
    ap.error = one_line_error
    return ap.parse_args(argv)


# ---------------------------------------------------------------------------------------
# Settings: the run's config, the puzzles, the fingerprint
# ---------------------------------------------------------------------------------------

def make_config(a):
    """The TrainConfig whose sampling is measured (design choice 1): the preset's settings,
    or a run directory's own (its model: the run's final policy), with the options given.
    TrainError (one line) for a value out of range, e.g. G < 2."""
    from lopti_minimal import config, runs
    from lopti_minimal.ranges import check_range, int_range
    check_range("--limit", a.limit, int_range(1))
    overrides = {"group_size": a.group_size, "temperature": a.temperature, "max_new_tokens": a.max_new_tokens,
                 "prompts_per_step": a.prompts_per_step, "seed": a.seed, "threads": a.threads,
                 "device": a.device}
    source, run_cfg = a.model, None
    if a.model:
        source, run_cfg = runs.resolve_model_source(a.model)   # a run directory: its final policy
    if run_cfg is not None and a.preset is None:
        cfg = runs.config_from_json(run_cfg)
        cfg = dataclasses.replace(cfg, model=source, **{k: v for k, v in overrides.items() if v is not None})
        config.validate(cfg)
    else:
        cfg = config.make_config(a.preset or "cpu-tiny", model=source, **overrides)
    return cfg


def select(n: int, cfg, order: str, limit: int | None) -> list[int]:
    """Indices (into the n usable puzzles) of the puzzles to sample, in chunk order: the
    first K of the file, or of the order an RL run with this seed draws them in its first
    epoch (plumbing.step_prompt_indices: chunk k = the run's step k). Both are prefixes, so
    a larger K extends a smaller one."""
    from lopti_minimal import plumbing
    k = min(limit or n, n)
    if order == "file":
        return list(range(k))
    p = cfg.prompts_per_step
    return [i for step in range(math.ceil(k / p)) for i in plumbing.step_prompt_indices(cfg.seed, step, p, n)][:k]


def settings_of(cfg, a, data_sha: str, device: str) -> dict:
    """Everything that decides the numbers of a puzzle's line (its fingerprint: the data by
    its content, wherever it lies), then what does not (the data's path, --limit, --threads,
    --save-responses)."""
    decides = {"model": cfg.model, "data_sha256": data_sha, "order": a.order,
               "group_size": cfg.group_size, "temperature": cfg.temperature, "top_p": cfg.top_p,
               "top_k": cfg.top_k, "max_new_tokens": cfg.max_new_tokens,
               "prompts_per_step": cfg.prompts_per_step, "seed": cfg.seed, "prompt_style": cfg.prompt_style,
               "max_prompt_len": cfg.max_prompt_len, "decoder": cfg.decoder, "device": device,
               "dtype": cfg.dtype, "autocast_bf16": cfg.autocast_bf16, "rollout_chunk": cfg.rollout_chunk,
               "recompute_old_logprobs": cfg.recompute_old_logprobs, "micro_batch_size": cfg.micro_batch_size,
               "mini_batch_size": cfg.mini_batch_size, "grad_accum": cfg.grad_accum}
    fp = hashlib.sha256(json.dumps(decides, sort_keys=True).encode()).hexdigest()[:12]
    return {**decides, "data": a.data, "preset": cfg.preset, "limit": a.limit, "threads": cfg.threads,
            "save_responses": a.save_responses, "fingerprint": fp}


def default_out(cfg, a) -> Path:
    from lopti_minimal.runs import RUNS_ROOT
    name = Path((a.model or cfg.model).rstrip("/")).name
    return RUNS_ROOT / "headroom" / (f"{name}-{Path(a.data).stem}-g{cfg.group_size}-b{cfg.max_new_tokens}"
                                     f"-s{cfg.seed}.json")


# ---------------------------------------------------------------------------------------
# One chunk: the trainer's rollout, reward and pi_old
# ---------------------------------------------------------------------------------------

def sample_chunk(model, tokenizer, records: list[dict], prompt_ids: list[list[int]], cfg, step: int):
    """One RL step's batch on these prompts as trainer.make_batch builds it, up to pi_old
    (design choices 1-3): (batch, rewards, texts), group-major, batch.old_logprobs set."""
    import torch
    from lopti_minimal import plumbing, precision, trainer
    from lopti_minimal.batch import decode_responses
    from lopti_minimal.grpo import batch_logprobs, sort_by_length
    device = next(model.parameters()).device
    batch = trainer.rollout(model, tokenizer, prompt_ids, cfg, plumbing.step_generator(cfg.seed, step, device))
    texts = decode_responses(tokenizer, batch)
    group_records = [r for r in records for _ in range(cfg.group_size)]
    rewards = [float(trainer.default_reward(t, r)) for t, r in zip(texts, group_records)]
    if cfg.recompute_old_logprobs:
        # The trainer recomputes pi_old on its rows sorted by length (its micro-batches); we
        # let sort_by_length itself carry each row's index (in the advantages, unused here)
        # so the order is the trainer's whatever that function does, and undo it afterwards.
        B, R = batch.response_mask.shape
        tag = torch.arange(B, device=device, dtype=torch.float32)[:, None].expand(B, R)
        ordered = sort_by_length(dataclasses.replace(batch, advantages=tag), cfg)
        with precision.autocast(cfg, device):
            logp = batch_logprobs(model, ordered, cfg)
        old = torch.empty_like(logp)
        old[ordered.advantages[:, 0].long()] = logp
        batch = dataclasses.replace(batch, old_logprobs=old)
    return batch, rewards, texts


# What a token below pi_old 0.5 is (design choice 6), in this order of precedence.
LOW_KINDS = ("choice", "first", "answer", "other")


def token_spans(tokenizer, ids: list[int]) -> tuple[str, list[tuple[int, int]]]:
    """(the decoded text, each token's character span in it), by decoding growing prefixes:
    exact for any tokenizer whose prefix decodes are prefixes of the whole (K&K text is
    ASCII), where one token decoded alone may drop a leading space."""
    text, spans, start = "", [], 0
    for k in range(len(ids)):
        text = tokenizer.decode(ids[:k + 1])
        spans.append((start, len(text)))
        start = len(text)
    return text, spans


def low_token_kinds(tokenizer, ids: list[int], low: list[bool]) -> dict:
    """How many of a response's tokens below 0.5 (``low``) are, first that applies: a
    phrasing choice (phrasing.choice_spans: a derivation line's optional word or ending,
    an answer line's mark), the first token (the guess-or-derive decision), a token of the
    answer block (the roles), or anything else (names, roles tried, checks: reasoning)."""
    from lopti_minimal.task.phrasing import choice_spans
    text, spans = token_spans(tokenizer, ids)
    choices = choice_spans(text)
    a0 = text.find("<answer>")
    counts = dict.fromkeys(LOW_KINDS, 0)
    for k, ((s, e), is_low) in enumerate(zip(spans, low)):
        if not is_low:
            continue
        if any(s < ce and cs < e for cs, ce in choices):
            counts["choice"] += 1
        elif k == 0:
            counts["first"] += 1
        elif 0 <= a0 <= s:
            counts["answer"] += 1
        else:
            counts["other"] += 1
    return counts


def puzzle_lines(batch, rewards, texts, tokenizer, cfg, puzzles: list[int], records: list[dict]) -> list[dict]:
    """One line per puzzle of a sampled chunk (group-major): its G samples' rewards, token
    counts, cut-offs, and tokens with pi_old below 0.5 and in each of its bins."""
    import torch
    from lopti_minimal.config import LOW_FRACTION_ETA
    from lopti_minimal.lopti import split_by_probability
    from lopti_minimal.mechanism import bin_masks
    from lopti_minimal.task.evaluate import record_size
    from lopti_minimal.task.reward import RIGHT
    mask = batch.response_mask
    lengths = mask.sum(1).long()
    # The sampler stops a row at its first EOS, so a row ended iff its last token is one;
    # a row that did not end was cut at the budget.
    eos = tokenizer.eos_token_id
    eos = torch.as_tensor([eos] if isinstance(eos, int) else list(eos), device=mask.device)
    last = batch.response_ids.gather(1, (lengths - 1).clamp_min(0)[:, None]).squeeze(1)
    cut = ~torch.isin(last, eos)
    low, _ = split_by_probability(batch.old_logprobs, mask, LOW_FRACTION_ETA)
    below = low.sum(1).long()
    bins = torch.stack([m.sum(1) for m in bin_masks(batch.old_logprobs.exp(), mask)], 1).long()
    kinds = [low_token_kinds(tokenizer, batch.response_ids[i, :lengths[i]].tolist(),
                             low[i, :lengths[i]].bool().tolist()) for i in range(len(lengths))]
    G, out = cfg.group_size, []
    for j, (p, rec) in enumerate(zip(puzzles, records)):
        rows = slice(j * G, (j + 1) * G)
        r = rewards[rows]
        correct = sum(x == RIGHT for x in r)
        line = {"puzzle": p, "n_people": record_size(rec), "rewards": r,
                "correct": correct,
                "informative": len(set(r)) > 1,       # nonzero GRPO advantage (choice 2)
                "mixed": 0 < correct < G,             # right and wrong answers
                "tokens": lengths[rows].tolist(), "cut": cut[rows].tolist(),
                "below_half": below[rows].tolist(), "bins": bins[rows].tolist(),
                "below_half_kinds": {k: sum(c[k] for c in kinds[rows]) for k in LOW_KINDS}}
        if texts is not None:
            line["responses"] = texts[rows]
        out.append(line)
    return out


# ---------------------------------------------------------------------------------------
# The summary
# ---------------------------------------------------------------------------------------

def quantiles(xs: list[int]) -> dict | None:
    import numpy as np
    if not xs:
        return None
    q = np.percentile(np.asarray(xs, dtype=float), QUANTILES)
    return {**{f"p{k}": float(v) for k, v in zip(QUANTILES, q)}, "max": int(max(xs)), "n": len(xs)}


def share_ci(values) -> dict:
    """experiments/stats.mean_ci of values in [0, 1], its interval clipped to [0, 1] (a t
    interval of a share near 0 or 1 over few puzzles reaches past them)."""
    from lopti_minimal.experiments.stats import mean_ci
    d = mean_ci(values)
    if d["lo"] is not None:
        d["lo"], d["hi"] = max(d["lo"], 0.0), min(d["hi"], 1.0)
    return d


def summarize(lines: list[dict], settings: dict, requested: int, dropped: int) -> dict:
    """The summary of the per-puzzle lines (design choice 4)."""
    from lopti_minimal.config import LOW_FRACTION_ETA
    from lopti_minimal.mechanism import BIN_LABELS
    from lopti_minimal.task.reward import RIGHT
    G, P = settings["group_size"], settings["prompts_per_step"]
    informative = share_ci(float(x["informative"]) for x in lines)
    share = informative["mean"]
    per_step = {k: (None if informative[k] is None else P * informative[k]) for k in ("mean", "lo", "hi")}
    lengths = [t for x in lines for t in x["tokens"]]
    right = [t for x in lines for t, r in zip(x["tokens"], x["rewards"]) if r == RIGHT]
    tokens = sum(lengths)
    bins = [sum(b[k] for x in lines for b in x["bins"]) for k in range(len(BIN_LABELS))]
    below = sum(sum(x["below_half"]) for x in lines)
    return {
        "puzzles": len(lines), "requested": requested, "dropped_long_prompts": dropped,
        "complete": len(lines) == requested, "samples": len(lengths),
        "accuracy": share_ci(x["correct"] / G for x in lines),
        "informative": informative,
        "mixed": share_ci(float(x["mixed"]) for x in lines),
        "prompts_per_step": P,
        "informative_per_step": per_step,
        "p_step_without_informative": None if share is None else (1 - share) ** P,
        "mean_reward": (sum(sum(x["rewards"]) for x in lines) / len(lengths)) if lengths else None,
        "lengths": {"all": quantiles(lengths), "correct": quantiles(right)},
        "cut_off": (sum(sum(x["cut"]) for x in lines) / len(lengths)) if lengths else None,
        "tokens": tokens, "eta": LOW_FRACTION_ETA,
        "below_half": below / tokens if tokens else None,
        # what those tokens are (design choice 6): shares of the tokens below 0.5, from the
        # puzzles that record it (lines written before it existed do not)
        "below_half_kinds": _kinds_share(lines),
        "bin_labels": list(BIN_LABELS),
        "bin_share": [b / tokens if tokens else None for b in bins],
    }


def _kinds_share(lines: list[dict]) -> dict | None:
    have = [x["below_half_kinds"] for x in lines if "below_half_kinds" in x]
    total = sum(sum(k.values()) for k in have)
    return {k: sum(x[k] for x in have) / total for k in LOW_KINDS} if total else None


def format_summary(s: dict) -> str:
    """The short table main prints."""
    def ci(d, scale=1.0):
        if d["mean"] is None:
            return "-"
        text = f"{d['mean'] * scale:.3f}"
        return text if d["lo"] is None else f"{text}  (95% CI {d['lo'] * scale:.3f} to {d['hi'] * scale:.3f})"

    def q(d):
        return "-" if d is None else f"p50 {d['p50']:.0f}  p90 {d['p90']:.0f}  p99 {d['p99']:.0f}  max {d['max']}"

    def share(x):
        return "-" if x is None else f"{x:.3f}"

    st, P = s["settings"], s["prompts_per_step"]
    lines = [f"[headroom] {st['model']} on {s['puzzles']} of {s['requested']} puzzles ({st['data']}), "
             f"G {st['group_size']}, T {st['temperature']}, budget {st['max_new_tokens']}",
             f"  sampled accuracy           {ci(s['accuracy'])}",
             f"  informative groups         {ci(s['informative'])}",
             f"    per step of {P} prompts    {ci(s['informative'], P)};  "
             f"a step with none: {share(s['p_step_without_informative'])}",
             f"  groups right and wrong     {ci(s['mixed'])}",
             f"  length (tokens)            {q(s['lengths']['all'])}",
             f"    of right answers         {q(s['lengths']['correct'])}",
             f"  cut off at the budget      {share(s['cut_off'])}"]
    if s["tokens"]:
        bins = "  ".join(f"{lab} {v:.3f}" for lab, v in zip(s["bin_labels"], s["bin_share"]))
        lines.append(f"  tokens, pi_old < {s['eta']}       {s['below_half']:.3f}   bins {bins}")
        if s.get("below_half_kinds"):
            lines.append("    of them                  " + "  ".join(f"{k} {v:.3f}" for k, v in s["below_half_kinds"].items()))
    if s["dropped_long_prompts"]:
        lines.append(f"  ({s['dropped_long_prompts']} puzzles dropped: prompt longer than max_prompt_len)")
    return "\n".join(lines)


def write_json(path: Path, obj) -> None:
    """Atomically (a temporary file, then a rename): a reader never sees half a summary."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1) + "\n")
    os.replace(tmp, path)


def read_lines(path: Path, fingerprint: str) -> dict:
    """The finished puzzles of OUT.jsonl, by puzzle. A half-written last line (a process
    killed mid-write) is dropped and the file rewritten without it, so the next append
    starts on a line of its own; lines of other settings are a TrainError."""
    from lopti_minimal.runs import read_jsonl
    if not path.exists():
        return {}
    text = path.read_text()
    lines = read_jsonl(path)
    if len(lines) != len(text.splitlines()) or (text and not text.endswith("\n")):
        write_json_lines(path, lines)
    other = {x.get("run") for x in lines} - {fingerprint}
    if other:
        raise TrainError(f"{path} holds puzzles sampled with other settings (fingerprint {sorted(other)[0]}, "
                         f"these are {fingerprint}): use another --out, or delete it")
    return {x["puzzle"]: x for x in lines}


def write_json_lines(path: Path, lines: list[dict]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(x) + "\n" for x in lines))
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------

def main(argv=None) -> int:
    a = parse_args(argv)
    t_start = time.perf_counter()
    try:
        import torch
        from lopti_minimal import host_memory, plumbing, precision
        from lopti_minimal.models import encode_prompts
        from lopti_minimal.runs import code_version, machine_info
        from lopti_minimal.task.evaluate import read_records
        cfg = make_config(a)
        out = Path(a.out) if a.out else default_out(cfg, a)
        if out.suffix != ".json":
            raise TrainError(f"--out {out}: name the summary (.json); the per-puzzle lines go beside it (.jsonl)")
        records = read_records(a.data)
        data_sha = hashlib.sha256(Path(a.data).read_bytes()).hexdigest()
        precision.check_hardware(cfg)
        # the finished lines are checked before the model loads: a refusal is instant
        settings = settings_of(cfg, a, data_sha, plumbing.resolve_device(cfg).type)
        lines_path = out.with_suffix(".jsonl")
        done = read_lines(lines_path, settings["fingerprint"])
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        host_memory.bound_process_memory(cfg.mmap_threshold_mb)
        model, tok = plumbing.load_policy(cfg)
        precision.attention_kernels(next(model.parameters()).device)
    except ValueError as e:                 # TrainError, ModelLoadError, a bad data file
        print(f"error: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
        return 2
    out.parent.mkdir(parents=True, exist_ok=True)

    # the trainer's prompts (models.encode_prompts, which drops a prompt longer than
    # max_prompt_len), one puzzle at a time, so we know which line of the file each one is
    kept, ids = [], []
    for i, r in enumerate(records):
        _, p = encode_prompts([r], tok, cfg.prompt_style, cfg.max_prompt_len)
        if p:
            kept.append(i)
            ids.append(p[0])
    chosen = select(len(kept), cfg, a.order, a.limit)
    P = cfg.prompts_per_step
    chunks = [chosen[s:s + P] for s in range(0, len(chosen), P)]
    info = {"settings": settings, "machine": machine_info(), "code": code_version()}

    def finish(interrupted: bool = False) -> dict:
        mine = [done[kept[i]] for i in chosen if kept[i] in done]
        s = summarize(mine, settings, len(chosen), len(records) - len(kept))
        chunk_s = {x["chunk"]: x["chunk_seconds"] for x in mine}
        s.update(info, seconds={"wall": round(time.perf_counter() - t_start, 1),
                                "sampling": round(sum(chunk_s.values()), 1)},
                 interrupted=interrupted, lines=str(lines_path))
        write_json(out, s)
        return s

    from tqdm import tqdm
    n_done = sum(kept[i] in done for i in chosen)
    bar = tqdm(total=len(chosen), initial=n_done, desc="headroom", unit="puzzle", file=sys.stderr,
               disable=a.no_progress)
    try:
        for k, chunk in enumerate(chunks):
            todo = [i for i in chunk if kept[i] not in done]
            if not todo:
                continue
            t0 = time.perf_counter()
            batch, rewards, texts = sample_chunk(model, tok, [records[kept[i]] for i in chunk],
                                                 [ids[i] for i in chunk], cfg, k)
            seconds = round(time.perf_counter() - t0, 2)
            lines = puzzle_lines(batch, rewards, texts if a.save_responses else None, tok, cfg,
                                 [kept[i] for i in chunk], [records[kept[i]] for i in chunk])
            with open(lines_path, "a") as f:       # a chunk's missing puzzles only (resume)
                for line in lines:
                    if line["puzzle"] not in done:
                        line.update(chunk=k, chunk_seconds=seconds, run=settings["fingerprint"])
                        f.write(json.dumps(line) + "\n")
                        done[line["puzzle"]] = line
            bar.update(len(todo))
            finish()
    except KeyboardInterrupt:
        bar.close()
        s = finish(interrupted=True)
        print(f"\ninterrupted: {s['puzzles']} of {s['requested']} puzzles in {lines_path}; "
              "the same command resumes", file=sys.stderr)
        return 130
    bar.close()
    s = finish()
    print(format_summary(s))
    print(f"[headroom] {s['seconds']['wall']} s ({s['seconds']['sampling']} s sampling in all runs), "
          f"{torch.get_num_threads()} threads; summary {out}, per puzzle {lines_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
