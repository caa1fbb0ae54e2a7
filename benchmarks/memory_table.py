"""Print the README's GPU memory table: trainer.memory_estimate_gb for each Qwen2.5 preset.

An estimate from model size (no GPU needed): bf16 weights, gradients, optimizer state,
the frozen reference copy, the KV cache of one rollout chunk and the float32 logits of one
micro-batch. The architecture numbers are those of the Qwen2.5-Instruct configs
(parameters, layers, KV heads, head dim; vocabulary 151,936).

    python benchmarks/memory_table.py
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from lopti_minimal.trainer import PRESETS, memory_estimate_gb  # noqa: E402

QWEN = {  # preset: (parameters, layers, kv heads, head dim)
    "qwen2.5-0.5b": (494e6, 24, 2, 64),
    "qwen2.5-1.5b": (1.54e9, 28, 2, 128),
    "qwen2.5-3b": (3.09e9, 36, 2, 128),
}


def main() -> None:
    print("| preset | optimizer | weights | grads | optimizer state | reference | KV cache | logits | peak |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, (n, layers, kv, hd) in QWEN.items():
        p = PRESETS[name]
        seq = p["max_prompt_len"] + p["max_new_tokens"]
        m = memory_estimate_gb(n, layers, kv, hd, 151_936, rows=p["rollout_chunk"] * p["group_size"],
                               seq=seq, micro_batch=p["micro_batch_size"],
                               optimizer=p.get("optimizer", "adamw"))
        cells = " | ".join(f"{m[k]:.1f}" for k in ("weights", "grads", "optimizer", "reference",
                                                     "kv_cache", "logits", "peak"))
        print(f"| {name} | {p.get('optimizer', 'adamw')} | {cells} |")


if __name__ == "__main__":
    main()
