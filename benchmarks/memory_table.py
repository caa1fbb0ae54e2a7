"""Print the GPU memory table of docs/GPU.md: gpu_memory.memory_estimate_gb for each Qwen2.5 preset
under its precision policy (precision.py), against the GPU it is sized for.

An estimate from model size (no GPU needed): the trained weights and their gradients
(float32 master weights, or bf16 with stochastic rounding), the optimizer state, the
frozen bf16 reference copy, the KV cache of one rollout chunk and the float32 logits of
one micro-batch's response positions. The architecture numbers are those of the
Qwen2.5-Instruct configs (parameters, layers, KV heads, head dim; vocabulary 151,936).
The last rows: a preset with LoRA adapters (`--lora-rank`, lora.py) instead of all
weights. `scripts/gpu_check.py` measures the real peak on a GPU.

    python benchmarks/memory_table.py
"""
import os
import sys
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from lopti_minimal.config import GPU_MEMORY_GB, make_config  # noqa: E402
from lopti_minimal.lora import adapter_parameters  # noqa: E402
from lopti_minimal.models import QWEN2_SHAPES  # noqa: E402
from lopti_minimal.gpu_memory import memory_estimate_gb, optimizer_states  # noqa: E402

QWEN = {  # preset: (parameters, layers, kv heads, head dim)
    "qwen2.5-0.5b": (494e6, 24, 2, 64),
    "qwen2.5-1.5b": (1.54e9, 28, 2, 128),
    "qwen2.5-3b": (3.09e9, 36, 2, 128),
}
# (preset, LoRA rank, the GPU memory in GB asked about): is LoRA what fits the 3B preset
# into 24 GB?
LORA = (("qwen2.5-3b", 16, 24),)


def estimate(name: str, c, lora_rank: int = 0) -> dict:
    """gpu_memory.memory_estimate_gb of preset ``name`` (config ``c``) at its own sizes."""
    n, layers, kv, hd = QWEN[name]
    lora = adapter_parameters(SimpleNamespace(**QWEN2_SHAPES[name]), lora_rank) if lora_rank else 0
    return memory_estimate_gb(n, layers, kv, hd, 151_936, rows=c.rollout_chunk * c.group_size,
                              seq=c.max_prompt_len + c.max_new_tokens, micro_batch=c.micro_batch_size,
                              optimizer=c.optimizer, weights=c.dtype, ref=c.ref_dtype,
                              new_tokens=c.max_new_tokens, lora_params=lora,
                              optimizer_states=optimizer_states(c))


def rows():
    """(preset, config, estimate) for each Qwen preset."""
    for name in QWEN:
        c = make_config(name)
        yield name, c, estimate(name, c)


def lora_rows():
    """(preset, rank, config, estimate, GPU GB) for each LORA row."""
    for name, rank, gpu in LORA:
        c = make_config(name)
        yield name, rank, c, estimate(name, c, rank), gpu


def main() -> None:
    print("| preset | weights | optimizer | weights | grads | optimizer state | reference | KV cache | "
          "logits | peak | GPU |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    cols = ("weights", "grads", "optimizer", "reference", "kv_cache", "logits", "peak")
    table = [(name, "", c, m, GPU_MEMORY_GB[name]) for name, c, m in rows()]
    table += [(name, f" + LoRA r{rank}", c, m, gpu) for name, rank, c, m, gpu in lora_rows()]
    for name, lora, c, m, gpu in table:
        cells = " | ".join(f"{m[k]:.1f}" for k in cols)
        print(f"| {name}{lora} | {c.dtype} | {c.optimizer} | {cells} | {gpu} GB"
              f"{'' if m['peak'] + 1 <= gpu else ' (does not fit)'} |")


if __name__ == "__main__":
    main()
