"""Grouped sampling: greedy equals transformers `generate`,
sampled log-probs equal a fresh teacher-forced forward, EOS / padding masks, layout, and
decode.KVCache (transformers' forward, decoder="hf") against transformers' own DynamicCache
and teacher forcing. The tests where the device matters (the generator, the KV cache,
compaction's indexing, autocast's device type) run on every device of conftest.DEVICES."""
import pytest
import torch

from conftest import BOS, CUDA_F32_LOGPROB_TOL, DEVICES, EOS, PAD, generator
from conftest import tiny_llama as _tiny_llama
from lopti_minimal import decode, sampling
from lopti_minimal.batch import left_pad, position_ids_from_mask
from lopti_minimal.sampling import sample_groups

PROMPTS = [[BOS, 5, 6, 7], [BOS, 9], [BOS, 10, 11, 12, 13]]   # unequal: left padding


def tiny_llama(seed=0, init=0.4, device="cpu"):
    """conftest.tiny_llama in eval mode."""
    return _tiny_llama(seed, init, device).eval()


def teacher_forced_logprobs(model, r, temperature):
    with torch.no_grad():
        logits = model(input_ids=r.input_ids, attention_mask=r.attention_mask,
                       position_ids=position_ids_from_mask(r.attention_mask)).logits
    P, R = r.prompt_len, r.response_ids.shape[1]
    lp = torch.log_softmax(logits[:, P - 1:P + R - 1].float() / temperature, -1)
    return lp.gather(-1, r.response_ids.unsqueeze(-1)).squeeze(-1)


def _sample(model, seed=0, **kw):
    args = dict(group_size=4, max_new_tokens=16, temperature=0.7, eos_token_id=EOS,
                pad_token_id=PAD, generator=generator(model.device, seed))
    args.update(kw)
    return sample_groups(model, PROMPTS, **args)


def test_greedy_equals_transformers_generate():
    model = tiny_llama(init=0.1)
    r = sample_groups(model, PROMPTS, group_size=1, max_new_tokens=20, eos_token_id=EOS,
                      pad_token_id=PAD, greedy=True)
    P = r.prompt_len
    ids, am = r.input_ids[:, :P], r.attention_mask[:, :P]
    gen = model.generate(input_ids=ids, attention_mask=am, do_sample=False,
                         max_new_tokens=20, eos_token_id=EOS, pad_token_id=PAD)
    assert torch.equal(gen[:, P:], r.response_ids)


def test_greedy_stops_at_eos_like_generate():
    # Give EOS a slightly scaled copy of token 40's output row, so EOS wins wherever 40
    # would be the greedy choice: some rows stop early, others run to the limit, and the
    # "stop at EOS, pad the rest" path is compared with generate too.
    model = tiny_llama(init=0.1)
    with torch.no_grad():
        model.lm_head.weight[EOS] = model.lm_head.weight[40] * 1.05
    r = sample_groups(model, PROMPTS, group_size=1, max_new_tokens=12, eos_token_id=EOS,
                      pad_token_id=PAD, greedy=True)
    stopped = (r.response_ids == EOS).any(1)
    assert stopped.any() and not stopped.all(), r.response_ids
    P = r.prompt_len
    gen = model.generate(input_ids=r.input_ids[:, :P], attention_mask=r.attention_mask[:, :P],
                         do_sample=False, max_new_tokens=12, eos_token_id=EOS, pad_token_id=PAD)
    assert torch.equal(gen[:, P:], r.response_ids)


@pytest.mark.parametrize("device", DEVICES)
def test_sampled_logprobs_equal_teacher_forced_forward(device):
    model = tiny_llama(device=device)
    for kw in (dict(temperature=0.7), dict(temperature=1.3, top_p=0.8, top_k=10)):
        r = _sample(model, **kw)
        tf = teacher_forced_logprobs(model, r, kw["temperature"])
        m = r.response_mask > 0
        assert (tf[m] - r.old_logprobs[m]).abs().max() < (1e-4 if device == "cpu" else CUDA_F32_LOGPROB_TOL)
        assert (r.old_logprobs[~m] == 0).all()


def test_greedy_logprobs_use_temperature_one_unless_given():
    model = tiny_llama()
    r1 = _sample(model, greedy=True, temperature=None, group_size=1)
    tf = teacher_forced_logprobs(model, r1, 1.0)
    m = r1.response_mask > 0
    assert (tf[m] - r1.old_logprobs[m]).abs().max() < 1e-4
    r2 = _sample(model, greedy=True, temperature=0.5, group_size=1)
    assert torch.equal(r1.response_ids, r2.response_ids)             # argmax unchanged
    assert (teacher_forced_logprobs(model, r2, 0.5)[m] - r2.old_logprobs[m]).abs().max() < 1e-4


def _check_masks(r):
    """Mask is 1 up to and including the first EOS, 0 after; attention mask agrees."""
    R = r.response_ids.shape[1]
    stopped = 0
    for row in range(r.response_ids.shape[0]):
        ids = r.response_ids[row].tolist()
        n = ids.index(EOS) + 1 if EOS in ids else R
        stopped += EOS in ids
        expect = torch.tensor([1.0] * n + [0.0] * (R - n), device=r.response_mask.device)
        assert torch.equal(r.response_mask[row], expect), row
        assert torch.equal(r.attention_mask[row, r.prompt_len:].float(), expect)
    return stopped


@pytest.mark.parametrize("device", DEVICES)
def test_eos_in_mask_padding_out(device):
    model = tiny_llama(device=device)
    r = _sample(model)
    stopped = _check_masks(r)
    assert 0 < stopped < r.response_ids.shape[0]      # some rows stopped early, some not
    assert (r.response_ids[r.response_mask == 0] == PAD).all()


def test_pad_equal_to_eos_keeps_eos_in_mask():
    model = tiny_llama()
    r = _sample(model, pad_token_id=EOS)
    stopped = _check_masks(r)       # the first EOS is masked in although it equals pad
    assert stopped > 0
    assert (r.response_ids[r.response_mask == 0] == EOS).all()
    # Same samples as with a distinct pad id: pad only affects filled positions.
    r0 = _sample(model)
    assert torch.equal(r.response_mask, r0.response_mask)
    assert torch.equal(r.old_logprobs, r0.old_logprobs)


@pytest.mark.parametrize("device", DEVICES)
def test_group_major_layout_and_determinism(device):
    model = tiny_llama(device=device)
    r = _sample(model)
    G, P = 4, r.prompt_len
    assert r.input_ids.shape[0] == len(PROMPTS) * G
    assert r.input_ids.device == r.old_logprobs.device == model.device
    for g, p in enumerate(PROMPTS):
        rows = r.input_ids[g * G:(g + 1) * G, :P]
        assert (rows[:, P - len(p):] == torch.tensor(p, device=device)).all()       # left padded
        assert (rows[:, :P - len(p)] == PAD).all()
        assert (r.attention_mask[g * G:(g + 1) * G, :P].sum(1) == len(p)).all()
    assert len({tuple(x) for x in r.response_ids.tolist()}) > len(PROMPTS)   # diverse
    again = _sample(model)
    assert torch.equal(again.response_ids, r.response_ids)
    assert torch.equal(again.old_logprobs, r.old_logprobs)
    other = _sample(model, seed=1)
    assert not torch.equal(other.response_ids, r.response_ids)


def test_top_k_one_is_greedy():
    model = tiny_llama()
    a = _sample(model, top_k=1, group_size=2)
    b = _sample(model, greedy=True, temperature=0.7, group_size=2)
    assert torch.equal(a.response_ids, b.response_ids)
    assert torch.allclose(a.old_logprobs, b.old_logprobs)


def plain_cache(monkeypatch):
    """decoder="hf" on transformers' own DynamicCache instead of decode.KVCache (the cache
    HFDecoder takes for a model with sliding-window layers)."""
    monkeypatch.setattr(decode, "full_attention", lambda cfg: False)


def test_kv_cache_decodes_as_transformers_dynamic_cache(monkeypatch):
    """decode.KVCache (preallocated, attention handed the filled prefix) against
    transformers' DynamicCache: the same tokens and masks, greedy and sampled, with rows
    stopping early and compacted away, log-probs to float32 rounding; and attention was
    handed the prompt's P keys, then one more per step, not all P + R."""
    model = tiny_llama()
    with torch.no_grad():
        model.lm_head.weight[EOS] += 0.5 * model.lm_head.weight[40]
    monkeypatch.setattr(sampling, "CHECK_EVERY", 2)
    seen, update = [], decode._KVLayer.update

    def update_and_record(layer, k, v, *a, **kw):     # how many key positions attention is handed
        keys, values = update(layer, k, v, *a, **kw)
        seen.append(keys.shape[-2])
        return keys, values
    monkeypatch.setattr(decode._KVLayer, "update", update_and_record)
    R = 24
    for greedy in (True, False):
        a = _sample(model, max_new_tokens=R, greedy=greedy, decoder="hf")
        with monkeypatch.context() as m:
            plain_cache(m)
            b = _sample(model, max_new_tokens=R, greedy=greedy, decoder="hf")
        lengths = a.response_mask.sum(1)
        assert lengths.min() < lengths.max()
        for name in ("response_ids", "response_mask", "attention_mask"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name
        assert torch.allclose(a.old_logprobs, b.old_logprobs, atol=1e-5)
    P, n_layers = max(len(p) for p in PROMPTS), model.config.num_hidden_layers
    assert seen[::n_layers][:3] == [P, P + 1, P + 2]


def _decode_and_teacher_force(shift: int = 0):
    """HFDecoder fed a fixed response token by token (float32, positions moved by ``shift``),
    rows dropped half way (keep), beside transformers' teacher-forced forward over the whole
    sequence: [(decoded logits, teacher-forced logits)] per step."""
    model = tiny_llama()
    ids, mask = left_pad(PROMPTS, PAD)
    B, P, R = len(PROMPTS), ids.shape[1], 8
    response = torch.randint(3, 64, (B, R), generator=torch.Generator().manual_seed(0))
    full_mask = torch.cat([mask, torch.ones_like(response)], 1)
    kept = torch.tensor([2, 0])
    with torch.no_grad():
        tf = model(input_ids=torch.cat([ids, response], 1), attention_mask=full_mask,
                   position_ids=position_ids_from_mask(full_mask)).logits[:, P - 1:P + R - 1]
        dec = decode.HFDecoder(model, P + R, None)
        pos = position_ids_from_mask(mask)
        got, rows = [dec.prefill(ids, mask, pos)], torch.arange(B)
        for t in range(R - 1):
            if t == R // 2:                      # the loop's compaction
                rows = kept
                dec.keep(rows)
            got.append(dec.step(response[rows, t], pos[rows, -1] + 1 + t + shift))
    return [(logits, tf[torch.arange(B) if t <= R // 2 else kept, t]) for t, logits in enumerate(got)]


def test_kv_cache_decoding_equals_teacher_forcing():
    """Every decoded step's logits equal the teacher-forced forward's. To 1e-4, not float32's
    default 1e-5: one position at a time and the whole sequence at once are different matrix
    shapes, whose kernels sum in different orders (up to 2.9e-5 apart on a 2-core AMD EPYC
    under torch 2.14.1); a position off by one moves them by far more (next test)."""
    for logits, expected in _decode_and_teacher_force():
        torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)


def test_decoding_at_a_wrong_position_is_caught():
    """The tolerance above still sees a decoder one position off: its logits move by more
    than 100x it."""
    worst = max(float((a - b).abs().max()) for a, b in _decode_and_teacher_force(shift=1)[1:])
    assert worst > 1e-2, worst


@pytest.mark.parametrize("device", DEVICES)
def test_compaction_of_stopped_rows_changes_nothing_greedy(device, monkeypatch):
    """Dropping stopped rows from the batch and the KV cache (the loop's compaction) gives
    exactly the rollout of a loop that never drops one, with both decode steps, and the
    decode steps agree. On CUDA too: greedy tokens are argmaxes, which rounding moves only
    at a near-tie (none here: the test would fail, deterministically, if one appeared);
    log-probs to float32 rounding."""
    model = tiny_llama(init=0.1, device=device)
    with torch.no_grad():
        model.lm_head.weight[EOS] = model.lm_head.weight[40] * 1.05
    prompts = PROMPTS + [[BOS, 20 + i, 30 + i] for i in range(5)]
    kw = dict(group_size=1, max_new_tokens=24, eos_token_id=EOS, pad_token_id=PAD, greedy=True)
    for decoder in ("hf", "lean"):
        monkeypatch.setattr(sampling, "CHECK_EVERY", 2)
        a = sample_groups(model, prompts, decoder=decoder, **kw)
        monkeypatch.setattr(sampling, "CHECK_EVERY", 10 ** 6)     # never looks: no compaction
        b = sample_groups(model, prompts, decoder=decoder, **kw)
        hf = a if decoder == "hf" else hf
        lengths = a.response_mask.sum(1)
        assert lengths.min() < lengths.max()          # rows stopped at different steps
        for name in ("input_ids", "attention_mask", "response_ids", "response_mask"):
            assert torch.equal(getattr(a, name), getattr(b, name)), (decoder, name)
            assert torch.equal(getattr(a, name), getattr(hf, name)), (decoder, name)
        # compaction changes the batch's shape, so on CUDA the kernels (conftest)
        assert torch.allclose(a.old_logprobs, b.old_logprobs,
                              atol=1e-5 if device == "cpu" else CUDA_F32_LOGPROB_TOL)


def test_compacted_sampling_keeps_logprobs_exact(monkeypatch):
    """Sampled with compaction: every recorded log-prob is still the teacher-forced one."""
    monkeypatch.setattr(sampling, "CHECK_EVERY", 2)
    model = tiny_llama()
    with torch.no_grad():
        model.lm_head.weight[EOS] += 0.5 * model.lm_head.weight[40]
    r = _sample(model, max_new_tokens=24)
    lengths = r.response_mask.sum(1)
    assert lengths.min() < lengths.max()
    tf = teacher_forced_logprobs(model, r, 0.7)
    m = r.response_mask > 0
    assert (tf[m] - r.old_logprobs[m]).abs().max() < 1e-4
    # masks are prefixes: once a row stops it stays stopped
    assert (r.response_mask[:, 1:] <= r.response_mask[:, :-1]).all()


@pytest.mark.parametrize("device", DEVICES)
def test_bf16_kv_cache_under_autocast_is_bit_identical(device, monkeypatch):
    """Under bf16 autocast (CPU or CUDA: the device's own autocast) decode.KVCache stores
    keys and values in bf16 (so attention does not re-cast a float32 key cache at every
    step), and samples exactly what a float32 cache samples: the same tokens and the same
    log-probs, bit for bit (autocast hands attention bf16 either way). The float32 cache is
    what the keys' own dtype would give (the rotary embedding's output is float32)."""
    model = tiny_llama(device=device)
    caches, init = [], decode.HFDecoder.__init__
    monkeypatch.setattr(decode.HFDecoder, "__init__",
                        lambda self, *a, **k: (init(self, *a, **k), caches.append(self.cache))[0])
    with torch.autocast(device, dtype=torch.bfloat16):
        a = _sample(model, decoder="hf")
        monkeypatch.setattr(decode, "autocast_dtype", lambda dev: torch.float32)
        b = _sample(model, decoder="hf")
    assert [layer.keys.dtype for layer in caches[0].layers] == [torch.bfloat16] * 2
    assert caches[1].layers[0].keys.dtype == torch.float32
    assert torch.equal(a.response_ids, b.response_ids)
    assert torch.equal(a.old_logprobs, b.old_logprobs)


@pytest.mark.parametrize("decoder", ["hf", "lean"])
def test_kv_cache_is_freed_on_return(decoder, monkeypatch):
    """The decode step and its KV cache do not keep themselves alive in a reference cycle:
    with the cycle collector off, none outlives sample_groups."""
    import gc
    import weakref
    refs, make = [], decode.make_decoder
    monkeypatch.setattr(sampling, "make_decoder",
                        lambda *a: (lambda d: (refs.append(weakref.ref(d)), d)[1])(make(*a)))
    model = tiny_llama()
    gc.disable()
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _sample(model, decoder=decoder)
        assert refs and all(r() is None for r in refs)
    finally:
        gc.enable()
