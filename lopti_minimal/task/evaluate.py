"""Evaluation on K&K: batched greedy (or sampled) decoding, scored by the Logic-RL reward.

Design choices:

1. The paper's metric (its K&K results table): accuracy = share of puzzles whose greedy
   response scores 3 (format right, every role right), reported per size (3..7 people,
   the official test sets, 100 each) and averaged over sizes.
2. How the other responses failed is reported too, because for a small model that is what
   moves first:

    format_error   the four tags are not each present once, in order   (reward -3)
    unparseable    format fine, answer not "Name is a knight|knave" x n (reward -1)
    wrong_answer   parsed, some role wrong                               (reward -0.5)
    truncated      the response hit max_new_tokens (usually also a format error)

3. Decoding reuses sampling.sample_groups (greedy=True, one row per puzzle, KV cache), so
   evaluation and RL rollouts share one code path. Puzzles are grouped by size and sorted
   by prompt length inside a batch so little padding is computed.
4. With ``samples=K`` each puzzle gets K sampled responses at ``temperature``; accuracy is
   then the mean over all K x n responses (avg@K) and pass_at_k the share of puzzles with
   at least one right.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from ..batch import decode_responses
from ..models import adds_bos, kk_prompt
from ..precision import free_memory
from ..sampling import sample_groups
from .kk import load_jsonl_lines
from .reward import parse_ground_truth, score_response


def record_size(r: dict) -> int:
    return int(r["n_people"]) if "n_people" in r else len(r["names"])


def record_problem(r) -> str | None:
    """What is wrong with one K&K record, field by field, or None: the quiz, the solution
    text the reward compares with (parse_ground_truth), and, where given, the names, the
    number of people and the solution, which must all agree."""
    if not isinstance(r, dict):
        return f"a K&K record is a JSON object, not {type(r).__name__}"
    if not isinstance(r.get("quiz"), str) or not r["quiz"].strip():
        return "quiz: missing or empty"
    if not isinstance(r.get("solution_text_format"), str):
        return "solution_text_format: missing (the answer the reward compares with)"
    truth = parse_ground_truth(r["solution_text_format"])
    if not truth:
        return "solution_text_format: no '(1) Name is a knight|knave' line"
    if "n_people" not in r and "names" not in r:
        return "needs n_people or names"
    names = r.get("names")
    if names is not None:
        if not isinstance(names, list) or not all(isinstance(x, str) and x for x in names) \
                or len(set(names)) != len(names):
            return "names: a list of distinct, non-empty names"
        if set(truth) != set(names):
            return f"solution_text_format names {sorted(truth)}, names are {sorted(names)}"
    n = r.get("n_people", len(truth))
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        return f"n_people: a positive integer, got {n!r}"
    if n != len(truth) or (names is not None and n != len(names)):
        return f"n_people {n} but {len(truth)} people in solution_text_format"
    sol = r.get("solution")
    if sol is not None:
        if not isinstance(sol, list) or len(sol) != n or not all(isinstance(x, bool) for x in sol):
            return f"solution: {n} true/false values (one per person), got {sol!r}"[:160]
        if names is not None and [truth[x] == "knight" for x in names] != sol:
            return "solution disagrees with solution_text_format"
    return None


def check_records(records: list[dict], source: str = "data", lines: list[int] | None = None) -> None:
    """Every record checked by record_problem; the message names the record's line in the
    file (``lines``, as load_jsonl_lines reads them; else its position)."""
    if not records:
        raise ValueError(f"{source}: no records")
    for i, r in enumerate(records):
        why = record_problem(r)
        if why:
            where = f"line {lines[i]}" if lines else f"record {i + 1}"
            raise ValueError(f"{source}: {where} is not a K&K record: {why}")


def read_records(path) -> list[dict]:
    """The K&K records of a JSON Lines file (``--data`` of train.py and eval.py), checked;
    anything unreadable is a ValueError of one line: "cannot read K&K data PATH: why"."""
    try:
        numbered = load_jsonl_lines(path)
        records = [r for _, r in numbered]
        check_records(records, str(path), [no for no, _ in numbered])
    except (OSError, ValueError, UnicodeDecodeError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ValueError(f"cannot read K&K data {path}: {msg}") from e
    return records


def budget(max_new_tokens, n: int) -> int:
    if isinstance(max_new_tokens, dict):
        return int(max_new_tokens.get(n, max_new_tokens.get(str(n), max(max_new_tokens.values()))))
    return int(max_new_tokens)


@torch.no_grad()
def evaluate_records(model, tokenizer, records: list[dict], *, max_new_tokens,
                     batch_size: int = 100, samples: int = 1, temperature: float = 0.7,
                     seed: int = 0, prompt_style: str = "auto", autocast_bf16: bool = False,
                     progress: bool = True, keep_responses: bool = False, response_prefix: str = "",
                     decoder: str = "auto") -> dict:
    """Evaluate ``model`` on ``records``; returns the report dict (see module docstring).

    max_new_tokens: an int, or {size: int} (a run's: TrainConfig.eval_max_new_tokens).
    batch_size: responses decoded together (prompts per batch = batch_size // samples).
    autocast_bf16: decode under bf16 autocast, CPU or CUDA (the training numerics).
    response_prefix: text the response is forced to start with (appended to the prompt;
        scored as part of the response), e.g. "\n " to make the two-behaviour warm start
        derive (behaviours.py): its derivations open with that token, its guesses with "\n".
    decoder: sample_groups' decode step (auto | lean | hf; TrainConfig.decoder).
    """
    check_records(records)
    greedy = samples == 1
    by_size: dict[int, list[dict]] = {}
    for r in records:
        by_size.setdefault(record_size(r), []).append(r)
    t0 = time.perf_counter()
    per_size, rows_out = {}, []
    bar = tqdm(total=len(records), desc="evaluate", disable=not progress, file=sys.stderr, unit="puzzle")
    for n in sorted(by_size):
        recs, m = by_size[n], budget(max_new_tokens, n)
        texts, lengths = _responses(model, tokenizer, recs, n, m, batch_size=batch_size, samples=samples,
                                    temperature=temperature, seed=seed, prompt_style=prompt_style,
                                    autocast_bf16=autocast_bf16, response_prefix=response_prefix,
                                    decoder=decoder, bar=bar)
        scores = [[score_response(t, r) for t in tt] for tt, r in zip(texts, recs)]
        per_size[n] = size_report(scores, lengths, m)
        if keep_responses:
            rows_out += [{"n_people": n, "index": r.get("index"), "response": t, "reward": sc.total,
                          "correct": sc.correct}
                         for r, tt, ss in zip(recs, texts, scores) for t, sc in zip(tt, ss)]
    bar.close()
    keys = ("accuracy", "format_error", "unparseable", "wrong_answer", "mean_reward", "mean_tokens", "truncated")
    report = {
        "per_size": per_size,
        # The paper's "avg" column: the unweighted mean over sizes.
        "overall": {k: float(np.mean([v[k] for v in per_size.values()])) for k in keys},
        "settings": {"greedy": greedy, "samples": samples, "temperature": None if greedy else temperature,
                     "seed": seed, "prompt_style": prompt_style, "autocast_bf16": autocast_bf16,
                     "max_new_tokens": {str(n): budget(max_new_tokens, n) for n in per_size}},
        "seconds": round(time.perf_counter() - t0, 1),
    }
    if keep_responses:
        report["responses"] = rows_out
    return report


def _responses(model, tokenizer, recs: list[dict], n: int, max_new_tokens: int, *, batch_size, samples,
               temperature, seed, prompt_style, autocast_bf16, response_prefix, decoder, bar):
    """The ``samples`` responses (texts, token counts) of every puzzle of size ``n``: greedy for
    one, else sampled; batches of prompts sorted by length (little padding), each with its
    own generator from (seed, n, batch)."""
    greedy = samples == 1
    device = next(model.parameters()).device
    amp = torch.autocast(device.type, dtype=torch.bfloat16) if autocast_bf16 and device.type in ("cpu", "cuda") \
        else contextlib.nullcontext()
    add_bos = adds_bos(tokenizer)
    ids = [tokenizer(kk_prompt(r, tokenizer, prompt_style) + response_prefix,
                     add_special_tokens=add_bos)["input_ids"] for r in recs]
    order = sorted(range(len(recs)), key=lambda i: len(ids[i]))
    per_batch = max(1, batch_size // samples)
    texts, lengths = [None] * len(recs), [None] * len(recs)
    for b, s in enumerate(range(0, len(order), per_batch)):
        chunk = order[s:s + per_batch]
        gen = torch.Generator(device=device)
        gen.manual_seed(int(np.random.SeedSequence([seed, n, b]).generate_state(1)[0]))
        with amp:
            ro = sample_groups(model, [ids[i] for i in chunk], samples, max_new_tokens,
                               temperature=None if greedy else temperature,
                               eos_token_id=tokenizer.eos_token_id,
                               pad_token_id=tokenizer.pad_token_id, generator=gen, greedy=greedy,
                               logprobs=False, decoder=decoder)
        out = [response_prefix + t for t in decode_responses(tokenizer, ro)]
        lens = ro.response_mask.sum(1).long().tolist()
        for j, i in enumerate(chunk):
            texts[i] = out[j * samples:(j + 1) * samples]
            lengths[i] = lens[j * samples:(j + 1) * samples]
        bar.update(len(chunk))
        free_memory(device)      # the batch's KV cache: its heap pages back (precision.py)
    return texts, lengths


def size_report(scores: list[list], lengths: list[list[int]], max_new_tokens: int) -> dict:
    """One size's row of the report from each puzzle's scores and token counts (module
    docstring: the failure modes partition the responses)."""
    flat = [s for ss in scores for s in ss]
    flat_len = [x for ll in lengths for x in ll]
    row = {
        "n": len(scores),
        "samples": len(scores[0]),
        "accuracy": float(np.mean([s.correct for s in flat])),
        "format_error": float(np.mean([not s.format_ok for s in flat])),
        "unparseable": float(np.mean([s.format_ok and s.parsed_roles is None for s in flat])),
        "wrong_answer": float(np.mean([s.parsed_roles is not None and not s.correct for s in flat])),
        "mean_reward": float(np.mean([s.total for s in flat])),
        "mean_tokens": float(np.mean(flat_len)),
        "truncated": float(np.mean([x >= max_new_tokens for x in flat_len])),
        "max_new_tokens": max_new_tokens,
    }
    if len(scores[0]) > 1:
        row["pass_at_k"] = float(np.mean([any(s.correct for s in ss) for ss in scores]))
    return row


def format_table(report: dict) -> str:
    """The printed table: one row per size, then the mean over sizes."""
    head = f"{'size':>6} {'n':>5} {'accuracy':>9} {'format_err':>10} {'unparse':>8} {'wrong':>7} {'reward':>7} {'tokens':>7} {'trunc':>6}"
    if any("pass_at_k" in v for v in report["per_size"].values()):
        head += f" {'pass@k':>7}"
    lines = [head]

    def row(name, n, v):
        s = (f"{name:>6} {n:>5} {v['accuracy']:>9.3f} {v['format_error']:>10.3f} {v['unparseable']:>8.3f} "
             f"{v['wrong_answer']:>7.3f} {v['mean_reward']:>7.2f} {v['mean_tokens']:>7.1f} {v['truncated']:>6.2f}")
        return s + (f" {v['pass_at_k']:>7.3f}" if "pass_at_k" in v else "")

    for n, v in sorted(report["per_size"].items(), key=lambda kv: int(kv[0])):
        lines.append(row(f"{n}p", v["n"], v))
    lines.append(row("mean", sum(v["n"] for v in report["per_size"].values()), report["overall"]))
    return "\n".join(lines)


def write_eval_json(report: dict, path) -> None:
    """JSON report, written atomically; per-record responses (if kept) go to a JSONL beside it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rep = dict(report)
    responses = rep.pop("responses", None)
    rep["per_size"] = {str(k): v for k, v in rep["per_size"].items()}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(rep, indent=1))
    os.replace(tmp, path)
    if responses is not None:
        rpath = path.with_suffix(".responses.jsonl")
        tmp = rpath.with_name(rpath.name + ".tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in responses))
        os.replace(tmp, rpath)

