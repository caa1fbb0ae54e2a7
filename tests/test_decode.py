"""The lean decode step (decode.py): its logits equal transformers' forward (float32, left
padding, GQA, biases, Qwen2), under bf16 autocast it is transformers' rollout (the same
tokens, log-probs to bf16 rounding) once transformers' attention is swapped in, its
samples keep the properties sample_groups promises, and models it does not serve fall
back to transformers' forward. The sampling loop looks whether rows are done every 2 tokens
here (`check_every_2`), so that rows stop and are compacted away in short rollouts."""
import gc
import weakref

import pytest
import torch
import torch.nn.functional as F

from conftest import BOS, EOS, PAD, ROOT
from conftest import tiny_llama as _tiny_llama
from lopti_minimal import decode, sampling
from lopti_minimal.batch import left_pad, position_ids_from_mask
from lopti_minimal.sampling import sample_groups

PROMPTS = [[BOS, 5, 6, 7], [BOS, 9], [BOS, 10, 11, 12, 13]]   # unequal: left padding


@pytest.fixture(autouse=True)
def check_every_2(monkeypatch):
    monkeypatch.setattr(sampling, "CHECK_EVERY", 2)


def tiny_llama(seed=0, init=0.4):
    return _tiny_llama(seed, init).eval()


def small_model(kind: str, seed=0):
    """Random small models of the supported families: a Llama with MHA, biases, tied
    embeddings and llama3 rotary scaling (SmolLM2's family), and a Qwen2 (q/k/v bias, GQA)."""
    torch.manual_seed(seed)
    common = dict(vocab_size=64, hidden_size=64, intermediate_size=80, num_hidden_layers=2,
                  max_position_embeddings=256, bos_token_id=BOS, eos_token_id=EOS,
                  pad_token_id=PAD, initializer_range=0.3)
    if kind == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM
        cfg = LlamaConfig(num_attention_heads=2, num_key_value_heads=2, attention_bias=True,
                          mlp_bias=True, tie_word_embeddings=True,
                          rope_parameters=dict(rope_type="llama3", rope_theta=5e4, factor=8.0,
                                               low_freq_factor=1.0, high_freq_factor=4.0,
                                               original_max_position_embeddings=64), **common)
        return LlamaForCausalLM(cfg).eval()
    from transformers import Qwen2Config, Qwen2ForCausalLM
    cfg = Qwen2Config(num_attention_heads=4, num_key_value_heads=1, **common)
    return Qwen2ForCausalLM(cfg).eval()


def hf_logits(model, ids, mask):
    """transformers' teacher-forced forward: the logits at every position, as float32."""
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask,
                     position_ids=position_ids_from_mask(mask)).logits.float()


def lean_logits(model, prompt_ids, response, group_size=1, autocast_dtype=None):
    """The lean decoder fed `response` [B, R] after the left-padded prompts (one row per
    prompt and group member): the logits before each response token, [B, R, V]."""
    ids, mask = left_pad(prompt_ids, PAD)
    ids, mask = ids.repeat_interleave(group_size, 0), mask.repeat_interleave(group_size, 0)
    B, P = ids.shape
    R = response.shape[1]
    with torch.no_grad():
        dec = decode.LeanDecoder(model, B, P + R, autocast_dtype)
        pos = position_ids_from_mask(mask)
        out = [dec.prefill(ids, mask, pos, group_size)]
        nxt = pos[:, -1] + 1
        with torch.autocast("cpu", enabled=False):
            for t in range(R - 1):
                out.append(dec.step(response[:, t], nxt + t))
    return ids, mask, torch.stack(out, 1).float()


@pytest.mark.parametrize("kind", ["tiny", "llama", "qwen2"])
def test_lean_logits_equal_transformers_forward(kind):
    """float32: every decode step's logits equal transformers' teacher-forced forward over
    the whole sequence, with left-padded prompts of unequal length, groups of equal prompts
    and GQA (tiny, qwen2), biases (llama, qwen2), tied embeddings and llama3 rotary scaling
    (llama)."""
    model = tiny_llama() if kind == "tiny" else small_model(kind)
    assert decode.unsupported(model) is None
    G, R = 2, 12
    response = torch.randint(3, 64, (len(PROMPTS) * G, R), generator=torch.Generator().manual_seed(0))
    ids, mask, lean = lean_logits(model, PROMPTS, response, group_size=G)
    P = ids.shape[1]
    full = hf_logits(model, torch.cat([ids, response], 1),
                     torch.cat([mask, torch.ones_like(response)], 1))[:, P - 1:P + R - 1]
    assert (lean - full).abs().max() < 1e-4


def sdpa_attend(self, q, k, v, mask, buf=None):
    """transformers' attention on the lean decoder's inputs: its SDPA call in the compute
    dtype with a boolean mask (q [b * kv_heads, rep, D] -> [b * kv_heads, rep, D])."""
    bh, rep, D = q.shape
    b = bh // self.Hkv
    o = F.scaled_dot_product_attention(
        q.to(self.cdt).view(b, self.H, 1, D), k.to(self.cdt).view(b, self.Hkv, -1, D),
        v.to(self.cdt).view(b, self.Hkv, -1, D), attn_mask=(mask == 0).view(b, self.Hkv, 1, -1)[:, :1],
        scale=self.scale, enable_gqa=self.rep > 1)
    return o.float().view(bh, rep, D)


def sdpa_attend_grouped(self, q, k, v, mask, buf):
    """The same in the group layout: each row's prompt keys and values from its group's."""
    kp, vp = (buf[x].repeat_interleave(self.G, 0).flatten(0, 1) for x in ("kp", "vp"))
    return sdpa_attend(self, q, torch.cat([kp, k[:, self.P:]], 1), torch.cat([vp, v[:, self.P:]], 1), mask)


def swap_in_transformers_attention(monkeypatch):
    monkeypatch.setattr(decode.LeanDecoder, "attend", sdpa_attend)
    monkeypatch.setattr(decode.LeanDecoder, "attend_grouped", sdpa_attend_grouped)


def _rollout(model, prompts, decoder, seed=3, **kw):
    args = dict(group_size=4, max_new_tokens=24, temperature=0.7, eos_token_id=EOS,
                pad_token_id=PAD, generator=torch.Generator().manual_seed(seed))
    args.update(kw)
    return sample_groups(model, prompts, decoder=decoder, **args)


ROLLOUT_FIELDS = ("input_ids", "attention_mask", "response_ids", "response_mask", "old_logprobs")


@pytest.mark.parametrize("greedy", [False, True])
def test_lean_is_transformers_rollout_but_for_attention(monkeypatch, greedy):
    """Under bf16 autocast, with transformers' attention kernel swapped into the lean
    decoder, its rollout is transformers' (decoder="hf"): the same tokens and masks, rows
    stopping at EOS and compacted away, and log-probs to bf16 rounding. Every other op
    (rotary table, norms, prefill once per group, the group layout of the prompts' keys and
    values and the switch to rows at the first compaction, the sampling step and its random
    draws) is transformers' op; the fused q/k/v and gate/up projections are the same
    products in one bf16 matmul, which a CPU's kernel may round differently from three
    (assert_same_rollout_to_bf16_rounding below says what is guaranteed)."""
    model = tiny_llama()
    with torch.no_grad():
        model.lm_head.weight[EOS] += 0.5 * model.lm_head.weight[40]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        hf = _rollout(model, PROMPTS, "hf", greedy=greedy)
        swap_in_transformers_attention(monkeypatch)
        lean = _rollout(model, PROMPTS, "lean", greedy=greedy)
        z = hf_logits(model, hf.input_ids, hf.attention_mask)[:, hf.prompt_len - 1:-1]
    lengths = hf.response_mask.sum(1)
    assert lengths.min() < lengths.max()                  # rows stopped at different steps
    assert_same_rollout_to_bf16_rounding(hf, lean, z, temperature=0.7)


def test_shipped_checkpoint_with_transformers_attention(monkeypatch):
    """The same on checkpoints/tiny-warm and a real K&K prompt (one group of 8 rows), a
    model wide enough (256) that the bf16 kernels of the fused and the separate projections
    need not round alike: the same tokens, log-probs to bf16 rounding (below)."""
    from lopti_minimal.models import encode_prompts, load_model_and_tokenizer
    from lopti_minimal.task import kk
    model, tok = load_model_and_tokenizer(str(ROOT / "checkpoints" / "tiny-warm"),
                                          dtype=torch.float32, device="cpu")
    _, prompts = encode_prompts(kk.load_official([3])[:1], tok, "auto", 512)
    kw = dict(group_size=8, max_new_tokens=32, eos_token_id=tok.eos_token_id,
              pad_token_id=tok.pad_token_id)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        hf = _rollout(model, prompts, "hf", **kw)
        swap_in_transformers_attention(monkeypatch)
        lean = _rollout(model, prompts, "lean", **kw)
        z = hf_logits(model, hf.input_ids, hf.attention_mask)[:, hf.prompt_len - 1:-1]
    assert_same_rollout_to_bf16_rounding(hf, lean, z, temperature=0.7)


def bf16_ulp(x: torch.Tensor) -> torch.Tensor:
    """The spacing of bfloat16 numbers at |x| (8 significant bits: 2^(floor(log2|x|) - 7))."""
    return torch.exp2(torch.floor(torch.log2(x.abs().clamp_min(2.0 ** -126))) - 7)


def assert_same_rollout_to_bf16_rounding(hf, lean, logits, temperature):
    """What holds on any CPU between transformers' rollout and the lean one when their
    bf16 matmuls are different BLAS calls: the lean decoder fuses q/k/v and gate/up into
    one matmul each, and a bf16 kernel may pick its blocking (so its summation order) by
    shape and by CPU (equal on the AMD EPYC machines, not on an Intel Xeon with AMX).
    - Tokens and masks: equal on every row. A bf16 rounding step in a logit changes a
      sampled token only where the uniform draw falls within that step of a boundary of
      the cumulative distribution (of order 1e-3 per token here); the test's fixed seed
      avoids those, and any CPU's rounding that moved one would be visible here.
    - log pi_old: each logit z may end one bf16 rounding step apart, so
      |d log softmax(z / T)_o| <= 2 max_v |dz_v| / T <= 2 ulp_bf16(max_v |z_v|) / T
      per position (the chosen token's logit and the log-sum-exp each move by at most
      max |dz| / T)."""
    for name in ROLLOUT_FIELDS[:4]:
        assert torch.equal(getattr(hf, name), getattr(lean, name)), name
    m = hf.response_mask > 0
    bound = 2 * bf16_ulp(logits.abs().amax(-1)) / temperature
    diff = (hf.old_logprobs - lean.old_logprobs).abs()
    assert (diff[m] <= bound[m]).all(), (diff[m] - bound[m]).max()
    assert (diff[~m] == 0).all()


def test_lean_float32_rollout_equals_hf():
    """float32: the logits agree to ~1e-5, too little to change a sampled token here, so
    the lean rollout is transformers' one (same tokens for the same generator, compaction
    included), its log-probs to float tolerance (test_sampling's)."""
    model = tiny_llama()
    with torch.no_grad():
        model.lm_head.weight[EOS] += 0.5 * model.lm_head.weight[40]
    for seed in range(3):
        hf = _rollout(model, PROMPTS, "hf", seed=seed)
        lean = _rollout(model, PROMPTS, "lean", seed=seed)
        for name in ROLLOUT_FIELDS[:4]:
            assert torch.equal(getattr(hf, name), getattr(lean, name)), (seed, name)
        assert (hf.old_logprobs - lean.old_logprobs).abs().max() < 1e-4


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_lean_logprobs_equal_teacher_forced_forward(kind):
    """The recorded log pi_old(o_t) at temperature T equal a fresh teacher-forced forward
    (test_sampling's tolerance), for the other supported families and top-k/top-p."""
    model = small_model(kind)
    for kw in (dict(temperature=0.7), dict(temperature=1.3, top_p=0.8, top_k=10)):
        r = _rollout(model, PROMPTS, "lean", **kw)
        P, R = r.prompt_len, r.response_ids.shape[1]
        lp = torch.log_softmax(hf_logits(model, r.input_ids, r.attention_mask)[:, P - 1:P + R - 1]
                               / kw["temperature"], -1)
        tf = lp.gather(-1, r.response_ids.unsqueeze(-1)).squeeze(-1)
        m = r.response_mask > 0
        assert (tf[m] - r.old_logprobs[m]).abs().max() < 1e-4
        assert (r.old_logprobs[~m] == 0).all() and (r.response_ids[~m] == PAD).all()


def test_bf16_weights_without_autocast():
    """A model in bf16 (no autocast): the lean decoder computes in the weights' dtype like
    transformers; logits agree to bf16 rounding."""
    model = tiny_llama().to(torch.bfloat16)
    response = torch.randint(3, 64, (len(PROMPTS), 8), generator=torch.Generator().manual_seed(0))
    ids, mask, lean = lean_logits(model, PROMPTS, response)
    P = ids.shape[1]
    full = hf_logits(model, torch.cat([ids, response], 1),
                     torch.cat([mask, torch.ones_like(response)], 1))[:, P - 1:P + 7]
    scale = full.abs().max()
    assert (lean - full).abs().max() < 0.05 * scale


def test_unsupported_models_fall_back_to_transformers(monkeypatch):
    """Models the lean loop does not serve (a forward hook, dynamic rotary scaling, another
    architecture) are sampled by transformers' forward: the rollout equals decoder="hf"."""
    built = []
    init = decode.LeanDecoder.__init__
    monkeypatch.setattr(decode.LeanDecoder, "__init__",
                        lambda self, *a, **k: (built.append(1), init(self, *a, **k))[1])
    hooked = tiny_llama()
    hooked.lm_head.register_forward_hook(lambda m, i, o: o)
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=2, n_positions=64,
                                      bos_token_id=BOS, eos_token_id=EOS)).eval()
    dynamic = tiny_llama()
    dynamic.model.rotary_emb.rope_type = "dynamic"
    for model in (hooked, gpt2, dynamic):
        assert decode.unsupported(model)
        a = _rollout(model, PROMPTS, "hf", max_new_tokens=8)
        b = _rollout(model, PROMPTS, "auto", max_new_tokens=8)
        for name in ROLLOUT_FIELDS:
            assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert not built
    _rollout(tiny_llama(), PROMPTS, "auto", max_new_tokens=4)
    assert built                                       # and a supported one runs lean


def test_decoder_option():
    """auto is lean on a CPU and hf elsewhere; a wrong name is an error in sample_groups and
    in TrainConfig (the trainer passes cfg.decoder, train.py --decoder sets it); a run saved
    before the option existed reads back as hf, the decoder it sampled with."""
    from lopti_minimal.config import TrainError, make_config
    from lopti_minimal.runs import config_from_json, config_to_json
    cpu = torch.device("cpu")
    assert decode.resolve("auto", cpu) == "lean" and decode.resolve("hf", cpu) == "hf"
    assert decode.resolve("auto", torch.device("cuda")) == "hf"
    with pytest.raises(ValueError, match="decoder must be one of"):
        _rollout(tiny_llama(), PROMPTS, "fast")
    with pytest.raises(TrainError, match="unknown decoder 'fast'"):
        make_config("ci", decoder="fast")
    assert make_config("ci").decoder == "auto"
    saved = config_to_json(make_config("ci", decoder="lean"))
    assert config_from_json(saved).decoder == "lean"
    del saved["decoder"]
    assert config_from_json(saved).decoder == "hf"
    import train
    assert train.build_config(train.parse_args(["--preset", "ci", "--decoder", "hf"])).decoder == "hf"


def test_trainer_rollout_uses_the_config_decoder(monkeypatch):
    """trainer.rollout samples with cfg.decoder: hf reproduces sample_groups(decoder="hf")."""
    from lopti_minimal import trainer
    from lopti_minimal.config import make_config
    seen = []
    monkeypatch.setattr(decode, "resolve", lambda d, dev, _r=decode.resolve: (seen.append(d), _r(d, dev))[1])
    cfg = make_config("ci", decoder="hf", autocast_bf16=False, group_size=4, max_new_tokens=24,
                      temperature=0.7, recompute_old_logprobs=False)

    class Tok:
        eos_token_id, pad_token_id = EOS, PAD
    ro = trainer.rollout(tiny_llama(), Tok(), PROMPTS, cfg, torch.Generator().manual_seed(3))
    ref = _rollout(tiny_llama(), PROMPTS, "hf")
    assert seen[0] == "hf"
    for name in ROLLOUT_FIELDS:
        assert torch.equal(getattr(ro, name), getattr(ref, name)), name


def test_lean_without_logprobs_samples_the_same_tokens():
    """logprobs=False (the trainer's default: pi_old by a teacher-forced forward) skips the
    log-probs, not a random draw: the same tokens and masks."""
    model = tiny_llama()
    with torch.no_grad():
        model.lm_head.weight[EOS] += 0.5 * model.lm_head.weight[40]
    a = _rollout(model, PROMPTS, "lean")
    b = _rollout(model, PROMPTS, "lean", logprobs=False)
    assert b.old_logprobs is None
    for name in ROLLOUT_FIELDS[:4]:
        assert torch.equal(getattr(a, name), getattr(b, name)), name


def test_greedy_lean_equals_generate_with_eos():
    """Greedy decoding with the lean loop is transformers' generate, rows stopping at EOS."""
    model = tiny_llama(init=0.1)
    with torch.no_grad():
        model.lm_head.weight[EOS] = model.lm_head.weight[40] * 1.05
    r = sample_groups(model, PROMPTS, group_size=1, max_new_tokens=12, eos_token_id=EOS,
                      pad_token_id=PAD, greedy=True, decoder="lean")
    stopped = (r.response_ids == EOS).any(1)
    assert stopped.any() and not stopped.all()
    P = r.prompt_len
    gen = model.generate(input_ids=r.input_ids[:, :P], attention_mask=r.attention_mask[:, :P],
                         do_sample=False, max_new_tokens=12, eos_token_id=EOS, pad_token_id=PAD)
    assert torch.equal(gen[:, P:], r.response_ids)


def test_buffers_are_freed_on_return(monkeypatch):
    """The decoder's key/value buffers do not outlive sample_groups (no reference cycle:
    with the cycle collector off, the decoder is gone on return)."""
    refs = []
    init = decode.LeanDecoder.__init__
    monkeypatch.setattr(decode.LeanDecoder, "__init__",
                        lambda self, *a, **k: (refs.append(weakref.ref(self)), init(self, *a, **k))[1])
    model = tiny_llama()
    gc.disable()
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _rollout(model, PROMPTS, "lean")
        assert refs and all(r() is None for r in refs)
    finally:
        gc.enable()


@pytest.mark.parametrize("group_size", [1, 2])
def test_compaction_moves_kept_rows_to_smaller_buffers(group_size):
    """keep() hands the kept rows' filled keys and values to fresh buffers of only those
    rows (so the pages of rows that stopped can go back to the kernel; in place, they stayed
    resident), and decoding goes on as if no row had stopped: the kept rows' next logits
    equal an uncompacted decoder's."""
    model = tiny_llama()
    ids, mask = left_pad(PROMPTS, PAD)
    ids, mask = ids.repeat_interleave(group_size, 0), mask.repeat_interleave(group_size, 0)
    B, P = ids.shape
    pos = position_ids_from_mask(mask)
    steps = torch.tensor([[20, 21], [22, 23], [24, 25], [26, 27], [28, 29], [30, 31]])[:B]

    def run(compact_to=None):
        with torch.no_grad():
            dec = decode.LeanDecoder(model, B, P + 4, None)
            dec.prefill(ids, mask, pos, group_size)
            dec.step(steps[:, 0], pos[:, -1] + 1)
            rows = torch.arange(B)
            if compact_to is not None:
                rows = compact_to
                dec.keep(rows)
            return dec, dec.step(steps[rows, 1], pos[rows, -1] + 2)

    keep = torch.tensor([B - 1, 0])
    full, logits_full = run()
    small, logits_small = run(keep)
    n = P + 1                                  # filled before the compaction: prompt, one step
    for big, buf in zip(full.layers, small.layers):
        for name in ("k", "v"):
            x = buf[name]
            assert x.shape[0] == 2 and x.untyped_storage().nbytes() == x.numel() * x.element_size()
            prompt = big[name + "p"][keep // group_size] if group_size > 1 else big[name][keep, :, :P]
            assert torch.equal(x[:, :, :P], prompt)
            assert torch.equal(x[:, :, P:n], big[name][keep, :, P:n])
    # The kept rows' logits come from the same ops on fewer rows: a matmul of 2 rows and one
    # of B rows are different BLAS calls, whose blocking (and so float32 summation order) a
    # library may pick by shape and CPU. Equal to float32 rounding, torch's float32 defaults
    # (rtol 1.3e-6, atol 1e-5: a few units in the last place of logits of order 1).
    torch.testing.assert_close(logits_small, logits_full[keep])
