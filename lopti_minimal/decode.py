"""A lean decode loop for Llama-family models: what `sampling.sample_groups` runs by default
on a CPU (its `decoder` option, TrainConfig.decoder / train.py --decoder; "hf" keeps
transformers' forward and its samples).

Why (benchmarks/sampler_speed.py --profile): a decode iteration of the tiny model (64
rows, 4 layers of width 256) is a few MFLOP, but transformers' forward spends it on per-op
and Python overhead (mask creation, cache classes, rotary recomputation, casts), and its
CPU attention for a single query row (the flash kernel made for long queries) does one
small GEMM call per row and head: over half of the decode time of the RL step. The loop
here does the same arithmetic with fewer, larger operations:

1. The weights of the model's own modules (no copy of the model; under autocast the
   linear weights are cast once per call, as autocast's weight cache does), q/k/v and
   gate/up fused into one matmul each.
2. Preallocated float32 key/value buffers [B, kv_heads, P + R, head_dim] holding the
   values transformers' cache would hand to attention (bf16 values under autocast);
   attention over the filled prefix is two batched matmuls and a softmax in float32, the
   left-padding mask added by the first (no mask is built per step: a row still sampling
   attends to all its own response tokens; rows that have stopped are discarded). Until
   the first compaction the G rows of a group share one copy of their prompt's keys and
   values (LeanDecoder's docstring).
3. Rotary cos/sin looked up in a table made once by the model's own rotary module.
4. A sampling step of few ops: the tempered softmax and exactly the exponential draws
   `torch.multinomial` makes (the same generator stream), without its host-side checks;
   tokens and log-probs written per step into [R, B] buffers, sent to their rows at each
   compaction.
5. The prompts go through transformers' own forward (prefill), once per group of G
   equal prompts; their keys and values are copied into every row of the group.

Exactness: every op but attention is transformers' op in its dtype, the fused projections
being the same products in one matmul (tests/test_decode.py swaps transformers' attention
in and gets its tokens, and its log-probs to bf16 rounding: a CPU's bf16 kernel may round
one fused matmul differently from three). Attention is not bit for bit under bf16 autocast: transformers' CPU kernel rounds the softmax weights to bf16
before multiplying them with the values and sums in another order, so logits agree to
bf16 rounding (float32: ~1e-5). A sampled token differs where the last bits of a logit
decide it (about 0.1% of tokens on checkpoints/tiny-warm); from there that row, and
through compaction the other rows' random draws, go their own way. `decoder="hf"`
(train.py --decoder hf) keeps the old stream: the samples of the shipped runs.

Supported: LlamaForCausalLM and Qwen2ForCausalLM (SmolLM2 is a Llama) with plain
nn.Linear layers, full attention and a static rotary embedding; for anything else (LoRA
wrappers, sliding windows, dynamic rotary scaling, hooks) `sample_groups` returns None and
sampling.py runs transformers' forward.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .config import DECODERS   # ("auto", "hf", "lean"); declared where TrainConfig validates it

SUPPORTED = ("LlamaForCausalLM", "Qwen2ForCausalLM")
STATIC_ROPE = ("default", "linear", "llama3", "yarn")


def resolve(decoder: str, device: torch.device) -> str:
    """The decoder to use: "auto" is lean on a CPU and hf elsewhere (the lean loop is
    measured on CPUs only)."""
    if decoder not in DECODERS:
        raise ValueError(f"decoder must be one of {DECODERS}, got {decoder!r}")
    if decoder == "auto":
        return "lean" if device.type == "cpu" else "hf"
    return decoder


def unsupported(model) -> str | None:
    """Why the lean loop cannot run this model (None: it can)."""
    name = type(model).__name__
    if name not in SUPPORTED:
        return f"{name} is not one of {SUPPORTED}"
    cfg = model.config
    if getattr(cfg, "pretraining_tp", 1) != 1:
        return "pretraining_tp != 1"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"hidden_act {cfg.hidden_act}"
    if any(t != "full_attention" for t in (getattr(cfg, "layer_types", None) or [])):
        return "sliding-window layers"
    if getattr(cfg, "use_sliding_window", False):
        return "sliding window"
    rope = getattr(model.model.rotary_emb, "rope_type", None)
    if rope not in STATIC_ROPE:
        return f"rope type {rope}"
    linears = [model.lm_head]
    for layer in model.model.layers:
        a, m = layer.self_attn, layer.mlp
        linears += [a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj]
    if any(type(m) is not torch.nn.Linear for m in linears):
        return "a projection is not a plain nn.Linear (LoRA, quantized)"
    if any(m._forward_hooks or m._forward_pre_hooks for m in model.modules()):
        return "forward hooks"
    return None


def _rms_norm(x: torch.Tensor, norm) -> torch.Tensor:
    """transformers' LlamaRMSNorm (the same float32 ops, so the same bits)."""
    return F.rms_norm(x, x.shape[-1:], norm.weight, norm.variance_epsilon)


def _cat_linear(mods, dtype):
    """One (weight, bias) for these nn.Linear layers side by side, in `dtype` (no copy for
    one layer already in it)."""
    def cat(ts):
        return (ts[0] if len(ts) == 1 else torch.cat(ts)).to(dtype)
    return cat([m.weight for m in mods]), None if mods[0].bias is None else cat([m.bias for m in mods])


class LeanDecoder:
    """Key/value buffers and the decode step for one batch of rows.

    Use: `prefill` (transformers' forward over the left-padded prompts) once, then `step`
    once per generated token, `keep(rows)` to drop stopped rows. Logits come back as
    transformers would return them ([b, V], in the compute dtype).

    Two cache layouts. While every row is in the batch (until the first `keep`) and the
    rows come in groups of G > 1 equal prompts, a group's prompt keys and values are kept
    once ([groups, kv_heads, P, D]) and attended to by one matmul per group and head, the
    group's G rows as its query rows; only the responses' keys and values are per row. The
    first `keep` copies each kept row's prompt into its own buffer and attention is per
    row from there on (the rows of a group are gone unevenly). The prompt is most of
    what attention reads early in a rollout (and all along for long prompts, e.g.
    SmolLM2's chat template): read once per group instead of once per row."""

    def __init__(self, model, batch: int, max_len: int, cdt: torch.dtype | None):
        cfg = model.config
        self.model, self.base = model, model.model
        emb = self.base.embed_tokens.weight
        dev = emb.device
        self.cdt = cdt or emb.dtype                  # matmuls: autocast's dtype, else the weights'
        self.H, self.Hkv = cfg.num_attention_heads, cfg.num_key_value_heads
        self.D = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.H
        self.rep = self.H // self.Hkv
        self.scale = self.base.layers[0].self_attn.scaling
        self.B, self.L, self.n = batch, max_len, 0   # rows, positions buffered, filled
        self.G = self.P = None                       # group size of the prompt layout (None: per row)
        self.layers = []
        for layer in self.base.layers:
            a, m = layer.self_attn, layer.mlp
            self.layers.append(dict(
                ln1=layer.input_layernorm, ln2=layer.post_attention_layernorm,
                qkv=_cat_linear([a.q_proj, a.k_proj, a.v_proj], self.cdt),
                o=_cat_linear([a.o_proj], self.cdt),
                gu=_cat_linear([m.gate_proj, m.up_proj], self.cdt),
                down=_cat_linear([m.down_proj], self.cdt),
                # float32, holding values of the compute dtype (what attention sees)
                k=torch.empty(batch, self.Hkv, max_len, self.D, device=dev),
                v=torch.empty(batch, self.Hkv, max_len, self.D, device=dev)))
        self.head = _cat_linear([model.lm_head], self.cdt)
        self.norm = self.base.norm
        # cos/sin of every position, by the model's own rotary module (float32 positions,
        # like transformers' per-step call); with the sign of rotate_half folded into sin:
        # x * cos + rotate_half(x) * sin == x * cos + roll(x, D/2) * sin_signed
        cos, sin = self.base.rotary_emb(emb[:1], position_ids=torch.arange(max_len + 1, device=dev)[None])
        half = self.D // 2
        self.cos, self.sin = cos[0], torch.cat([-sin[0, :, :half], sin[0, :, half:]], -1)
        # additive attention mask (0, or -inf on the prompts' left padding) per (row, kv head)
        self.mask = torch.zeros(batch, self.Hkv, 1, max_len, device=dev)

    def prefill(self, ids, mask, positions, cache_kwarg: str, group_size: int = 1):
        """transformers' forward over the prompts: its logits of their last position, its
        keys and values kept. Rows come in groups of `group_size` equal prompts
        (sample_groups' layout): each prompt goes through the model once."""
        from transformers import DynamicCache
        G, cache = group_size, DynamicCache()
        out = self.model(input_ids=ids[::G], attention_mask=mask[::G], position_ids=positions[::G],
                         use_cache=True, logits_to_keep=1, **{cache_kwarg: cache})
        P = self.n = ids.shape[1]
        self.mask[..., :P].masked_fill_((mask == 0)[:, None, None, :], float("-inf"))
        for buf, layer in zip(self.layers, cache.layers):
            # in the compute dtype, as autocast hands them to attention
            kp, vp = layer.keys.to(self.cdt).float(), layer.values.to(self.cdt).float()
            if G > 1:
                buf["kp"], buf["vp"] = kp, vp                            # [groups, kv_heads, P, D]
            else:
                buf["k"][:, :, :P], buf["v"][:, :, :P] = kp, vp
        if G > 1:
            self.G, self.P = G, P
            self.mask_p = self.mask[::G, :, :, :P].reshape(-1, 1, P)     # [groups * kv_heads, 1, P]
        return out.logits[:, -1, :].repeat_interleave(G, 0)

    def keep(self, rows: torch.Tensor) -> None:
        """Keep only these rows (compaction): each buffer is replaced by a fresh one of
        len(rows) rows holding their n filled positions. Why not compact in place: the
        pages of the rows that stopped stay resident, so a long evaluation batch would hold
        every row's cache until its end; a fresh buffer touches only the pages it copies,
        and the old one (above the mmap threshold, host_memory.py) goes back to the kernel.
        One buffer at a time, so the copy adds one layer's K or V at most."""
        b, n, P = len(rows), self.n, self.P
        for buf in self.layers:
            for name in ("k", "v"):
                x, new = buf[name], buf[name].new_empty((b,) + buf[name].shape[1:])
                if self.G:                           # leave the group layout: prompts per row
                    new[:, :, P:n] = x[rows, :, P:n]
                    new[:, :, :P] = buf.pop(name + "p")[rows // self.G]
                else:
                    new[:, :, :n] = x[rows, :, :n]
                buf[name] = new
                del x
        self.B = b
        self.mask = self.mask[rows]
        self.G = self.P = None

    def step(self, tok: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Logits [b, V] of the next token after `tok` [b] at positions `pos` [b]."""
        logits = self.forward(tok, pos, self.n)
        self.n += 1
        return logits

    def forward(self, tok: torch.Tensor, pos: torch.Tensor, n: int) -> torch.Tensor:
        """The decode step with n positions filled: the ops of transformers' forward, in
        its dtypes, but for attention (module docstring)."""
        b, H, Hkv, D, rep, cdt = tok.shape[0], self.H, self.Hkv, self.D, self.rep, self.cdt
        cos, sin = self.cos[pos].unsqueeze(1), self.sin[pos].unsqueeze(1)    # [b, 1, D]
        attend = self.attend_grouped if self.G else self.attend
        mask = self.mask.view(b * Hkv, 1, self.L)[:, :, :n + 1]
        h = F.embedding(tok, self.base.embed_tokens.weight)                 # [b, hidden]
        for buf in self.layers:
            x = _rms_norm(h, buf["ln1"]).to(cdt)
            qkv = F.linear(x, *buf["qkv"])
            qk = qkv[:, :(H + Hkv) * D].view(b, H + Hkv, D)
            qk = (qk * cos + qk.roll(D // 2, -1) * sin).to(cdt)              # rotary
            K, V = buf["k"], buf["v"]
            K[:, :, n] = qk[:, H:]
            V[:, :, n] = qkv[:, (H + Hkv) * D:].view(b, Hkv, D)
            o = attend(qk[:, :H].float().reshape(b * Hkv, rep, D),
                       K.view(b * Hkv, self.L, D)[:, :n + 1], V.view(b * Hkv, self.L, D)[:, :n + 1],
                       mask, buf)
            h = h + F.linear(o.view(b, H * D).to(cdt), *buf["o"])
            x = _rms_norm(h, buf["ln2"]).to(cdt)
            g, u = F.linear(x, *buf["gu"]).chunk(2, -1)
            h = h + F.linear(F.silu(g) * u, *buf["down"])
        return F.linear(_rms_norm(h, self.norm).to(cdt), *self.head)

    def attend(self, q, k, v, mask, buf=None):
        """softmax(q k^T * scale + mask) v in float32, one query row per (row, head):
        q [b * kv_heads, rep, D], k and v [b * kv_heads, n, D], mask [b * kv_heads, 1, n]."""
        return torch.bmm(torch.baddbmm(mask, q, k.transpose(1, 2), alpha=self.scale).softmax(-1), v)

    def attend_grouped(self, q, k, v, mask, buf):
        """`attend` in the group layout: the prompt part from the group's keys and values
        (one matmul per group and kv head, G * rep query rows), the response part (k, v
        from position P on) per row, one softmax over both."""
        G, P, Hkv, rep, D = self.G, self.P, self.Hkv, self.rep, self.D
        ng = self.B // G

        def groups(x):       # [B * Hkv, rep, N] rows <-> [groups * Hkv, G * rep, N] groups
            return x.view(ng, G, Hkv, rep, -1).transpose(1, 2).reshape(ng * Hkv, G * rep, -1)

        def rows(x):
            return x.view(ng, Hkv, G, rep, -1).transpose(1, 2).reshape(ng * G * Hkv, rep, -1)

        q = q * self.scale
        s_p = torch.baddbmm(self.mask_p, groups(q), buf["kp"].view(-1, P, D).transpose(1, 2))
        s_r = torch.bmm(q, k[:, P:].transpose(1, 2))
        w = torch.cat([rows(s_p), s_r], -1).softmax(-1)
        o_p = rows(torch.bmm(groups(w[..., :P]), buf["vp"].view(-1, P, D)))
        return torch.baddbmm(o_p, w[..., P:], v[:, P:])


def _decode(model, ids, mask, group_size, response_ids, old_logprobs, *, eos, temperature,
            top_p, top_k, generator, greedy, check_every, compact) -> int:
    """sample_groups' loop: prefill, then one sampling step and one decode step per token,
    each row's tokens and log-probs written to response_ids / old_logprobs [B, R] (rows
    that stopped keep what they sampled after EOS: the caller masks it; old_logprobs None:
    not computed). Returns the number of steps taken."""
    from .sampling import _autocast_dtype, _cache_kwarg, filter_logits, position_ids_from_mask
    device = ids.device
    (B, P), R = ids.shape, response_ids.shape[1]
    dec = LeanDecoder(model, B, P + R, _autocast_dtype(device))
    positions = position_ids_from_mask(mask)
    logits = dec.prefill(ids, mask, positions, _cache_kwarg(model), group_size)   # caller's autocast
    next_pos = positions[:, -1] + 1                                     # [B]
    # The loop writes step t's tokens and log-probs in batch order (toks[t, :b]); they go to
    # their rows at each compaction and at the end. `rows`: the rows in the batch.
    toks = torch.empty((R, B), dtype=torch.long, device=device)
    logps = torch.empty((R, B), dtype=torch.float32, device=device)
    noise = torch.empty((B, logits.shape[-1]), dtype=torch.float32, device=device)
    rows = torch.arange(B, device=device)
    done = torch.zeros(B, dtype=torch.bool, device=device)
    t0 = steps = 0

    def write_out(t1):           # steps t0 .. t1 - 1 of the rows in the batch, to their rows
        b = len(rows)
        response_ids[rows, t0:t1] = toks[t0:t1, :b].T
        if old_logprobs is not None:
            old_logprobs[rows, t0:t1] = logps[t0:t1, :b].T

    with torch.autocast(device.type, enabled=False):      # the step casts by itself
        for t in range(R):
            b = len(rows)
            logits = logits.float() / temperature
            if greedy:
                tok = logits.argmax(-1)
            else:
                # torch.multinomial(probs, 1) is argmax(probs / q), q ~ Exp(1) drawn from the
                # generator: the same draws, without its checks (each a host sync)
                probs = torch.softmax(filter_logits(logits, top_k, top_p), dim=-1)
                tok = (probs / noise[:b].exponential_(1, generator=generator)).argmax(-1)
            toks[t, :b] = tok
            if old_logprobs is not None:
                # log softmax(z / T)_tok = z_tok / T - logsumexp(z / T), over the full vocabulary
                logps[t, :b] = logits.gather(-1, tok.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, -1)
            done |= torch.isin(tok, eos)
            steps = t + 1
            if steps == R:
                break
            if steps % check_every == 0:
                n_done = int(done.sum())
                if n_done == b:
                    break
                if compact and n_done * 4 >= b:
                    keep = (~done).nonzero().squeeze(-1)
                    write_out(steps)
                    t0 = steps
                    dec.keep(keep)
                    rows, done, tok, next_pos = rows[keep], done[keep], tok[keep], next_pos[keep]
            logits = dec.step(tok, next_pos)
            next_pos = next_pos + 1
    write_out(steps)
    return steps


@torch.no_grad()
def sample_groups(model, prompt_ids, group_size: int, max_new_tokens: int, *, temperature: float,
                  top_p: float, top_k: int, eos_token_id: list[int], pad_token_id: int, generator,
                  greedy: bool, logprobs: bool, check_every: int, compact: bool):
    """`sampling.sample_groups` (its arguments defaulted and checked there) with the lean
    decode step; None when the model is not supported. The same loop: the same random draws
    for the same logits, the same stopping, compaction and trimming, and the same Rollout."""
    from .sampling import Rollout, group_rows
    if unsupported(model):
        return None
    device = next(model.parameters()).device
    eos = torch.as_tensor(eos_token_id, dtype=torch.long, device=device)
    ids, mask = group_rows(prompt_ids, group_size, pad_token_id, device)
    B, P = ids.shape
    R = max_new_tokens

    response_ids = torch.full((B, R), pad_token_id, dtype=torch.long, device=device)
    old_logprobs = torch.zeros((B, R), dtype=torch.float32, device=device) if logprobs else None
    was_training = model.training
    model.eval()
    # inference mode: less per-op bookkeeping than no_grad; what leaves it is written into
    # the two tensors above (made outside it, so training can use them)
    with torch.inference_mode():
        steps = _decode(model, ids, mask, group_size, response_ids, old_logprobs, eos=eos,
                        temperature=temperature, top_p=top_p, top_k=top_k, generator=generator,
                        greedy=greedy, check_every=check_every, compact=compact)
    if was_training:
        model.train()

    # A response ends at its first EOS (kept) or after `steps` tokens; after it: padding.
    is_eos = torch.isin(response_ids[:, :steps], eos)
    length = torch.where(is_eos.any(1), is_eos.int().argmax(1) + 1, steps)
    response_mask = (torch.arange(steps, device=device) < length[:, None]).float()
    width = int(length.max()) if steps else 0
    response_mask = response_mask[:, :width].contiguous()
    response_ids = torch.where(response_mask > 0, response_ids[:, :width], pad_token_id)
    if logprobs:
        old_logprobs = torch.where(response_mask > 0, old_logprobs[:, :width], 0.0)
    return Rollout(input_ids=torch.cat([ids, response_ids], dim=1),
                   attention_mask=torch.cat([mask, response_mask.long()], dim=1),
                   response_ids=response_ids, response_mask=response_mask,
                   old_logprobs=old_logprobs, prompt_len=P, group_size=group_size)
