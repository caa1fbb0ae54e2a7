"""Evaluate a policy on Knights & Knaves, as the paper does.

    python eval.py --model runs/<run>                  # a run: its final policy
    python eval.py --model checkpoints/tiny-warm       # the warm start (the "before")
    python eval.py --model models/smollm2-135m-instruct --sizes 3 --per-size 20 --max-new-tokens 512
    python eval.py --model M --data my_puzzles.jsonl   # any K&K JSON Lines file
    python eval.py --model M --samples 8               # 8 sampled responses per puzzle

Design choices:

1. Greedy by default: the paper's accuracy is the share of puzzles whose greedy response
   scores 3 under the Logic-RL reward, per size on the official 3..7-person sets (100
   each), and their mean. --samples K decodes K responses at --temperature instead and
   reports their mean accuracy (avg@K) and pass@K.
2. The failure modes are reported next to accuracy (format errors, unparseable answers,
   wrong answers, truncations), because for a small model they explain most changes.
3. The prompt follows the model: a chat template (the paper's Qwen system prompt) when the
   tokenizer has one, the compact prompt of the tiny model otherwise.
4. Decoding is the rollout sampler (sampling.sample_groups) in greedy mode, batched by
   size, with a KV cache. Decoding runs under bf16 autocast, the training numerics, on a
   CPU or a GPU (--no-bf16 for the weights' own dtype).
5. The per-size response budget defaults to the run's (or the tiny model's) settings;
   --max-new-tokens N sets one budget for every size.
6. The options that are settings of a run (sizes, puzzles per size, batch, temperature,
   seed, decoder, the mmap threshold) take their defaults, choices and ranges from
   TrainConfig (config.RANGES), so eval.py evaluates as a run's evaluation does; a run
   directory's prompt style, budget and decoder are its own (runs.config_from_json, old
   runs too).

Writes a JSON report (default: RUN_DIR/eval-<data>.json for a run, else
runs/eval/<model>-<time>.json) and prints a table. Bad input: one line, exit code 2.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from lopti_minimal import host_memory
from lopti_minimal.cli import HelpFormatter, one_line_error
from lopti_minimal.config import DECODERS, RANGES, TrainConfig as C, check_range, int_range

# Each numeric option's range is its TrainConfig field's (config.RANGES: written once);
# --samples is eval.py's own.
OPTION_FIELDS = {"per_size": "eval_per_size", "temperature": "temperature", "max_new_tokens": "max_new_tokens",
                 "batch_size": "eval_batch_size", "seed": "seed", "threads": "threads",
                 "mmap_threshold_mb": "mmap_threshold_mb"}
SAMPLES = int_range(1, why="1 = greedy")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description="Greedy / sampled K&K evaluation.",
                                 formatter_class=HelpFormatter)
    ap.add_argument("--model", required=True, help="run directory, HF folder, hub id or .gguf file")
    ap.add_argument("--data", nargs="+", help="K&K JSON Lines files (default: the official 3..7-person sets)")
    ap.add_argument("--sizes", type=int, nargs="+", default=list(C.eval_sizes), help="official sets to use")
    ap.add_argument("--per-size", type=int, default=C.eval_per_size, help="first N puzzles of each official set")
    ap.add_argument("--samples", type=int, default=1, help="responses per puzzle (1 = greedy)")
    ap.add_argument("--temperature", type=float, default=C.temperature, help="with --samples > 1")
    ap.add_argument("--max-new-tokens", type=int, help="one response budget for every size")
    ap.add_argument("--batch-size", type=int, default=C.eval_batch_size,
                    help="responses decoded together (memory only; a run's evaluation decodes as many)")
    ap.add_argument("--seed", type=int, default=C.seed)
    ap.add_argument("--response-prefix", default="",
                    help=r"force every response to start with this text, e.g. '\n ' (a newline and a "
                         "space: the tiny warm start's derivations) -- escapes \n are read")
    ap.add_argument("--out", help="report path (JSON)")
    ap.add_argument("--save-responses", action="store_true", help="also write every response (JSONL)")
    ap.add_argument("--threads", type=int, help="torch CPU threads")
    ap.add_argument("--device", help="cpu, cuda ... (default: cuda if available)")
    ap.add_argument("--decoder", choices=DECODERS,
                    help=f"decode step (TrainConfig.decoder; default: a run's own, else {C.decoder})")
    ap.add_argument("--no-bf16", action="store_true",
                    help="decode in the weights' dtype (default: bf16 autocast, the training numerics)")
    ap.add_argument("--mmap-threshold-mb", type=int, default=C.mmap_threshold_mb,
                    help="glibc malloc: blocks of this many MiB or more go back to the kernel when "
                         "freed (TrainConfig.mmap_threshold_mb; 0 = glibc's dynamic default)")
    ap.add_argument("--no-progress", action="store_true")
    ap.error = one_line_error
    return ap.parse_args(argv)


def check_options(a) -> None:
    """A TrainError (one line: the option, the value, the range) for a number out of range."""
    for dest, field in OPTION_FIELDS.items():
        check_range("--" + dest.replace("_", "-"), getattr(a, dest), RANGES[field])
    check_range("--samples", a.samples, SAMPLES)


def load_data(a) -> tuple[list[dict], str]:
    from lopti_minimal.task import kk
    from lopti_minimal.task.evaluate import read_records
    if a.data:
        records = [r for f in a.data for r in read_records(f)]
        return records, "+".join(Path(f).stem for f in a.data)
    bad = [n for n in a.sizes if n not in range(3, 8)]
    if bad:
        raise ValueError(f"official sets exist for 3..7 people, not {bad}")
    records = [r for n in a.sizes for r in kk.load_official([n])[:a.per_size]]
    return records, "official"


def main(argv=None) -> int:
    a = parse_args(argv)
    import torch
    from lopti_minimal.models import ModelLoadError, load_model_and_tokenizer
    from lopti_minimal.precision import attention_kernels
    from lopti_minimal.runs import RUNS_ROOT, config_from_json, resolve_model_source
    from lopti_minimal.task.evaluate import evaluate_records, format_table, write_eval_json
    try:
        check_options(a)                  # its TrainError is a ValueError
        if a.threads:
            torch.set_num_threads(a.threads)
        # freed KV caches go back to the kernel, oneDNN keeps a bounded number of kernels
        host_memory.bound_process_memory(a.mmap_threshold_mb)
        records, tag = load_data(a)
        source, run_cfg = resolve_model_source(a.model)
        model, tok = load_model_and_tokenizer(source, device=a.device)
        attention_kernels(next(model.parameters()).device)    # no cuDNN attention on CUDA
    except (ValueError, ModelLoadError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    run = config_from_json(run_cfg) if run_cfg else C()        # a run's settings, else the defaults
    budget = a.max_new_tokens or run.eval_max_new_tokens
    style, decoder = run.prompt_style, a.decoder or run.decoder
    print(f"[eval] {source} on {len(records)} puzzles ({tag}), "
          f"{'greedy' if a.samples == 1 else f'{a.samples} samples at T={a.temperature}'}")
    prefix = a.response_prefix.replace("\\n", "\n")              # the shell passes "\n" literally
    report = evaluate_records(model, tok, records, max_new_tokens=budget, batch_size=a.batch_size,
                              samples=a.samples, temperature=a.temperature, seed=a.seed,
                              prompt_style=style, autocast_bf16=not a.no_bf16,
                              progress=not a.no_progress, keep_responses=a.save_responses,
                              response_prefix=prefix, decoder=decoder)
    report["model"] = source
    report["decoder"] = decoder
    report["data"] = a.data or f"official sizes {a.sizes}, first {a.per_size} each"
    report["response_prefix"] = prefix
    if a.out:
        out = Path(a.out)
    elif run_cfg is not None:
        out = Path(a.model) / f"eval-{tag}{'' if a.samples == 1 else f'-k{a.samples}'}.json"
    else:
        name = Path(source.rstrip("/")).name.replace(".gguf", "")
        out = RUNS_ROOT / "eval" / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    write_eval_json(report, out)
    print(format_table(report))
    print(f"[eval] {report['seconds']} s, peak resident memory {host_memory.peak_rss_gb():.2f} GB; report: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
