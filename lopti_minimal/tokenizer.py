"""The tiny model's tokenizer: a byte-level BPE trained here on generated K&K text.

Design choices:

1. Our own tokenizer: a pretrained tokenizer has ~50k entries, and for a model of a few
   million parameters the embedding table alone would dwarf the transformer. K&K text uses
   a few hundred distinct words (51 names, "knight", "knave", the speech templates, the
   explanation's words), so a BPE of under 1,000 entries covers it with whole-word tokens
   (asked for up to DEFAULT_VOCAB_SIZE, it stops where no pair is worth merging: 771
   entries for the shipped tokenizer, models.py).
2. Byte-level: the 256 byte symbols are always in the vocabulary, so any string encodes
   without an unknown token and decodes back exactly (decode(encode(x)) == x), including
   quotes, newlines and text the model invents during RL.
3. bos/eos/pad (``<|bos|>``, ``<|eos|>``, ``<|pad|>``) are *special*: skipped by
   ``decode(..., skip_special_tokens=True)``. pad is distinct from eos so that a padding
   mask can never hide the sampled end-of-sequence token, which is trained on (a known
   pitfall of GRPO implementations: pad == eos masking the sampled EOS).
4. The four tags ``<think> </think> <answer> </answer>`` are ordinary added tokens: always
   one token each (the reward looks for them, and the policy should emit a tag in one
   step), and never stripped by decode.
5. The result is a ``transformers.PreTrainedTokenizerFast``, so it is saved with
   ``save_pretrained`` and loaded with ``AutoTokenizer.from_pretrained`` like any other.
"""
from __future__ import annotations

from typing import Iterable, Iterator

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
SPECIAL_TOKENS = [PAD, BOS, EOS]          # ids 0, 1, 2 (trainer adds them first, in order)
TAGS = ["<think>", "</think>", "<answer>", "</answer>"]
DEFAULT_VOCAB_SIZE = 1024


def build_tokenizer(texts: Iterable[str], vocab_size: int = DEFAULT_VOCAB_SIZE) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on ``texts`` and wrap it as a transformers tokenizer.

    ``vocab_size`` counts everything (256 bytes, merges, specials, tags); the trainer stops
    earlier when the corpus has no more pairs worth merging.
    """
    tok = Tokenizer(models.BPE())
    # GPT-2 style: split on spaces/punctuation with the leading space kept on the word, so
    # " Amelia" and " knight" become single tokens.  add_prefix_space=False keeps the
    # round trip exact (no space is invented at the start).
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(TAGS),
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes: no unknowns
        show_progress=False,
    )
    tok.train_from_iterator(_strip_tags(texts), trainer=trainer)
    # Tags are matched before pre-tokenization, so "<think>" is one token wherever it occurs.
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in TAGS])
    # bos in front of every encoded text (tokenizer(prompt)); add_special_tokens=False for
    # a response that continues a prompt.  The model always sees bos at position 0.
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, tok.token_to_id(BOS))])
    return wrap(tok)


def wrap(tok: Tokenizer) -> PreTrainedTokenizerFast:
    """Wrap a raw ``tokenizers.Tokenizer`` as a transformers fast tokenizer with our specials."""
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD,
        clean_up_tokenization_spaces=False,  # cleanup would change " ," and break round trips
        # Left padding: prompts are left-padded so every response starts at the same
        # column (docs/ARCHITECTURE.md, sequence layout); saved with the tokenizer.
        padding_side="left",
    )
    return fast


def _strip_tags(texts: Iterable[str]) -> Iterator[str]:
    # The tags become added tokens after training; keeping them out of the BPE corpus stops
    # the trainer from spending merges on "<th", "ink>" and the like.
    for t in texts:
        for tag in TAGS:
            t = t.replace(tag, " ")
        yield t


def kk_corpus(n_per_size: int = 200, sizes=range(2, 9), seed: int = 1234) -> Iterator[str]:
    """Generated K&K text to train the tokenizer on: compact prompts, both explanation
    styles and the answers (the official-style quiz text is inside the prompts).

    Imported lazily so that tokenizer.py itself depends only on `tokenizers`.
    """
    from .task import dataset, prompts
    for n in sizes:
        count = min(n_per_size, 100) if n == 2 else n_per_size   # ~180 distinct 2-person puzzles
        for rec in dataset.generate_records(n, count, seed=seed + n):
            yield prompts.compact_prompt(rec["quiz"])
            for style in ("compact", "backtracking"):
                yield prompts.target_response(rec, style)


def build_kk_tokenizer(vocab_size: int = DEFAULT_VOCAB_SIZE, n_per_size: int = 200, seed: int = 1234):
    """The tokenizer of the shipped tiny model: ``build_tokenizer`` on ``kk_corpus``."""
    return build_tokenizer(kk_corpus(n_per_size=n_per_size, seed=seed), vocab_size=vocab_size)
