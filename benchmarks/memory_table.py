"""Print the GPU memory table of docs/GPU.md: plumbing.memory_estimate_gb for each Qwen2.5 preset
under its precision policy (precision.py), against the GPU it is sized for.

An estimate from model size (no GPU needed): the trained weights and their gradients
(float32 master weights, or bf16 with stochastic rounding), the optimizer state, the
frozen bf16 reference copy, the KV cache of one rollout chunk and the float32 logits of
one micro-batch. The architecture numbers are those of the Qwen2.5-Instruct configs
(parameters, layers, KV heads, head dim; vocabulary 151,936). `scripts/gpu_check.py`
measures the real peak on a GPU.

    python benchmarks/memory_table.py
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from lopti_minimal.config import GPU_MEMORY_GB, make_config  # noqa: E402
from lopti_minimal.plumbing import memory_estimate_gb  # noqa: E402

QWEN = {  # preset: (parameters, layers, kv heads, head dim)
    "qwen2.5-0.5b": (494e6, 24, 2, 64),
    "qwen2.5-1.5b": (1.54e9, 28, 2, 128),
    "qwen2.5-3b": (3.09e9, 36, 2, 128),
}


def rows():
    """(preset, config, estimate) for each Qwen preset."""
    for name, (n, layers, kv, hd) in QWEN.items():
        c = make_config(name)
        m = memory_estimate_gb(n, layers, kv, hd, 151_936, rows=c.rollout_chunk * c.group_size,
                               seq=c.max_prompt_len + c.max_new_tokens, micro_batch=c.micro_batch_size,
                               optimizer=c.optimizer, weights=c.dtype, ref=c.ref_dtype)
        yield name, c, m


def main() -> None:
    print("| preset | weights | optimizer | weights | grads | optimizer state | reference | KV cache | "
          "logits | peak | GPU |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, c, m in rows():
        cells = " | ".join(f"{m[k]:.1f}" for k in ("weights", "grads", "optimizer", "reference",
                                                     "kv_cache", "logits", "peak"))
        gpu = GPU_MEMORY_GB[name]
        print(f"| {name} | {c.dtype} | {c.optimizer} | {cells} | {gpu} GB"
              f"{'' if m['peak'] + 1 <= gpu else ' (does not fit)'} |")


if __name__ == "__main__":
    main()
