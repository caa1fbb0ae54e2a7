"""A small randomly initialised Llama shared by the RL-core tests (GRPO, AR, Lopti).

Token ids: PAD 0, EOS 1, BOS 2; vocabulary 64.  `init` (the weights' std) is large enough
that the sampled tokens spread over all probability bins.
"""
import torch
from transformers import LlamaConfig, LlamaForCausalLM

EOS, PAD, BOS = 1, 0, 2


def tiny_llama(seed=0, init=0.4):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=64, hidden_size=48, intermediate_size=96,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=128, bos_token_id=BOS, eos_token_id=EOS,
                      pad_token_id=PAD, initializer_range=init, tie_word_embeddings=False)
    return LlamaForCausalLM(cfg)
