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


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description="Greedy / sampled K&K evaluation.",
                                 formatter_class=HelpFormatter)
    ap.add_argument("--model", required=True, help="run directory, HF folder, hub id or .gguf file")
    ap.add_argument("--data", nargs="+", help="K&K JSON Lines files (default: the official 3..7-person sets)")
    ap.add_argument("--sizes", type=int, nargs="+", default=[3, 4, 5, 6, 7], help="official sets to use")
    ap.add_argument("--per-size", type=int, default=100, help="first N puzzles of each official set")
    ap.add_argument("--samples", type=int, default=1, help="responses per puzzle (1 = greedy)")
    ap.add_argument("--temperature", type=float, default=0.7, help="with --samples > 1")
    ap.add_argument("--max-new-tokens", type=int, help="one response budget for every size")
    ap.add_argument("--batch-size", type=int, default=50,
                    help="responses decoded together (memory only; a run's evaluation: 50)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--response-prefix", default="",
                    help=r"force every response to start with this text, e.g. '\n ' (a newline and a "
                         "space: the tiny warm start's derivations) -- escapes \n are read")
    ap.add_argument("--out", help="report path (JSON)")
    ap.add_argument("--save-responses", action="store_true", help="also write every response (JSONL)")
    ap.add_argument("--threads", type=int, help="torch CPU threads")
    ap.add_argument("--device", help="cpu, cuda ... (default: cuda if available)")
    ap.add_argument("--decoder", choices=("auto", "hf", "lean"),
                    help="decode step (TrainConfig.decoder; default: a run's own, else auto)")
    ap.add_argument("--no-bf16", action="store_true",
                    help="decode in the weights' dtype (default: bf16 autocast, the training numerics)")
    ap.add_argument("--mmap-threshold-mb", type=int, default=host_memory.MMAP_THRESHOLD >> 20,
                    help="glibc malloc: blocks of this many MiB or more go back to the kernel when "
                         "freed (TrainConfig.mmap_threshold_mb; 0 = glibc's dynamic default)")
    ap.add_argument("--no-progress", action="store_true")
    ap.error = one_line_error
    return ap.parse_args(argv)


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
    from lopti_minimal.runs import RUNS_ROOT, resolve_model_source
    from lopti_minimal.task.evaluate import DEFAULT_MAX_NEW_TOKENS, evaluate_records, format_table, write_eval_json
    try:
        if a.samples < 1:
            raise ValueError(f"--samples must be >= 1, got {a.samples}")
        if a.samples > 1 and a.temperature <= 0:
            raise ValueError("--temperature must be > 0 for sampled evaluation")
        if a.threads:
            torch.set_num_threads(a.threads)
        if a.mmap_threshold_mb < 0:
            raise ValueError(f"--mmap-threshold-mb must be >= 0, got {a.mmap_threshold_mb}")
        # freed KV caches go back to the kernel, oneDNN keeps a bounded number of kernels
        host_memory.bound_process_memory(a.mmap_threshold_mb)
        records, tag = load_data(a)
        source, run_cfg = resolve_model_source(a.model)
        model, tok = load_model_and_tokenizer(source, device=a.device)
        attention_kernels(next(model.parameters()).device)    # no cuDNN attention on CUDA
    except (ValueError, ModelLoadError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    budget = a.max_new_tokens or (
        {int(k): v for k, v in run_cfg["eval_max_new_tokens"].items()} if run_cfg else DEFAULT_MAX_NEW_TOKENS)
    style = run_cfg["prompt_style"] if run_cfg else "auto"
    decoder = a.decoder or (run_cfg.get("decoder", "hf") if run_cfg else "auto")   # old runs: hf
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
