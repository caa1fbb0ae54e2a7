"""The decode step of sampling: a fast path, all speed; a learner can skip this file.

It gives the logits the model's forward over the whole sequence would give
(`model(ids).logits[:, -1]`) from a KV cache; `sampling.sample_groups` calls `dec.prefill` /
`dec.step`: read them as "the model's forward". One interface (`make_decoder`; TrainConfig.decoder):

    prefill(ids, mask, positions, G) -> logits [B, V] at each row's last prompt position
    step(tok, pos)                   -> logits [b, V] after tokens tok [b] at positions pos [b]
    keep(rows)                       drop the other rows (the loop's compaction)

HFDecoder: transformers' forward over `KVCache` (decoder="hf"; any model). LeanDecoder
(decoder="lean", "auto" on a CPU; Llama and Qwen2): the same ops in fewer, larger ones (a small
model's transformers step is per-op overhead; benchmarks/sampler_speed.py --profile). All but
attention are transformers' ops in its dtypes (tests/test_decode.py swaps its attention in and
gets its tokens); its bf16 attention rounds the softmax weights and ours does not, so under
autocast a token differs where a logit's last bits decide it (~0.1% on tiny-warm).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import Cache, DynamicCache
from transformers.cache_utils import CacheLayerMixin

from .config import DECODERS   # ("auto", "hf", "lean"); declared where TrainConfig validates it

SUPPORTED = ("LlamaForCausalLM", "Qwen2ForCausalLM")
STATIC_ROPE = ("default", "linear", "llama3", "yarn")


def resolve(decoder: str, device: torch.device) -> str:
    """"auto" is lean on a CPU and hf elsewhere (the lean step is measured on CPUs only)."""
    if decoder not in DECODERS:
        raise ValueError(f"decoder must be one of {DECODERS}, got {decoder!r}")
    return ("lean" if device.type == "cpu" else "hf") if decoder == "auto" else decoder


def make_decoder(decoder: str, model, batch: int, max_len: int):
    """The decode step of ``decoder`` for ``batch`` rows of up to ``max_len`` positions:
    LeanDecoder where lean is asked and it serves the model (`unsupported`), else HFDecoder."""
    device = next(model.parameters()).device
    kv_dtype = autocast_dtype(device)
    if resolve(decoder, device) == "lean" and unsupported(model) is None:
        return LeanDecoder(model, batch, max_len, kv_dtype)
    return HFDecoder(model, max_len, kv_dtype)


def autocast_dtype(device: torch.device):
    """The autocast dtype active for this device type, or None outside autocast."""
    return torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else None


def full_attention(cfg) -> bool:
    """Whether every layer of the model attends to all earlier positions (no sliding window)."""
    if getattr(cfg, "layer_types", None):
        return all(t == "full_attention" for t in cfg.layer_types)
    return getattr(cfg, "sliding_window", None) is None and not getattr(cfg, "use_sliding_window", False)


def unsupported(model) -> str | None:
    """Why the lean step cannot run this model (None: it can)."""
    name, cfg = type(model).__name__, model.config
    if name not in SUPPORTED:
        return f"{name} is not one of {SUPPORTED}"
    if getattr(cfg, "pretraining_tp", 1) != 1 or getattr(cfg, "hidden_act", "silu") != "silu" \
            or not full_attention(cfg) or model.model.rotary_emb.rope_type not in STATIC_ROPE:
        return "tensor-parallel weights, another activation, sliding windows or dynamic rotary scaling"
    projections = [model.lm_head] + [m for n, m in model.model.layers.named_modules() if n.endswith("_proj")]
    if any(type(m) is not torch.nn.Linear for m in projections):
        return "a projection is not a plain nn.Linear (LoRA, quantized)"
    if any(m._forward_hooks or m._forward_pre_hooks for m in model.modules()):
        return "forward hooks"
    return None


# ------------------------------------------------------------------ transformers' forward


class _KVLayer(CacheLayerMixin):
    """One layer of `KVCache`: keys and values [B, kv_heads, max_len, D], n positions filled."""

    is_sliding = False
    # transformers then passes a mask at every step, as for its own preallocated cache
    is_compileable = True

    def __init__(self, max_len: int, dtype: torch.dtype | None):
        super().__init__()
        self.max_len, self.dtype, self.n = max_len, dtype, 0

    def lazy_initialization(self, key_states, value_states):
        def buffer(x):      # [B, kv_heads, max_len, D]
            return x.new_zeros(x.shape[:2] + (self.max_len, x.shape[-1]), dtype=self.dtype or key_states.dtype)
        self.keys, self.values, self.is_initialized = buffer(key_states), buffer(value_states), True

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n, q = self.n, key_states.shape[-2]
        self.keys[:, :, n:n + q] = key_states
        self.values[:, :, n:n + q] = value_states
        self.n += q
        return self.keys[:, :, :self.n], self.values[:, :, :self.n]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.n + query_length, 0

    def get_seq_length(self) -> int:
        return self.n

    def get_max_length(self) -> int:
        return self.max_len


class KVCache(Cache):
    """transformers' cache over preallocated keys and values, attention handed the filled
    prefix only (a DynamicCache re-copies itself each step, a StaticCache hands attention all
    max_len positions); under autocast it stores the autocast dtype, cast once when written."""

    def __init__(self, n_layers: int, max_len: int, dtype: torch.dtype | None = None):
        super().__init__(layers=[_KVLayer(max_len, dtype) for _ in range(n_layers)])


class HFDecoder:
    """transformers' forward over `KVCache` (DynamicCache for sliding windows). A stopped row
    attends to its own tokens until dropped, as in `generate`: only its unused logits see them."""

    def __init__(self, model, max_len: int, kv_dtype: torch.dtype | None):
        cfg = model.config
        self.model, self.max_len = model, max_len
        self.cache = KVCache(cfg.num_hidden_layers, max_len, kv_dtype) if full_attention(cfg) \
            else DynamicCache(config=cfg)

    def prefill(self, ids, mask, positions, group_size: int = 1):
        self.mask = torch.cat([mask, mask.new_ones(mask.shape[0], self.max_len - mask.shape[1])], 1)
        self.n = mask.shape[1]
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                         logits_to_keep=1, cache=self.cache)
        return out.logits[:, -1, :]

    def step(self, tok, pos):
        self.n += 1
        out = self.model(input_ids=tok[:, None], attention_mask=self.mask[:, :self.n],
                         position_ids=pos[:, None], use_cache=True, cache=self.cache)
        return out.logits[:, -1, :]

    def keep(self, rows):
        self.cache.reorder_cache(rows)
        self.mask = self.mask[rows]


# ------------------------------------------------------------------------ the lean step


def _rms_norm(x: torch.Tensor, norm) -> torch.Tensor:     # LlamaRMSNorm's float32 ops: its bits
    return F.rms_norm(x, x.shape[-1:], norm.weight, norm.variance_epsilon)


def _cat_linear(mods, dtype):
    """One (weight, bias) for these nn.Linear layers side by side, in `dtype`."""
    def cat(ts):
        return (ts[0] if len(ts) == 1 else torch.cat(ts)).to(dtype)
    return cat([m.weight for m in mods]), None if mods[0].bias is None else cat([m.bias for m in mods])


class LeanDecoder:
    """The lean decode step: q/k/v and gate/up fused into one matmul each, float32 key/value
    buffers, attention as two batched matmuls, rotary cos/sin from one table. Until the first
    `keep`, a group of G equal prompts keeps its prompt's keys and values once, attended to
    with the G rows as query rows: the prompt, most of what attention reads early on, is read
    once per group. `keep` gives each kept row its own copy, and attention is per row."""

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
        self.L, self.n = max_len, 0                  # positions buffered, filled
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
        # cos/sin of every position by the model's rotary module, the sign of rotate_half in
        # sin: x * cos + rotate_half(x) * sin == x * cos + roll(x, D/2) * sin_signed
        cos, sin = self.base.rotary_emb(emb[:1], position_ids=torch.arange(max_len + 1, device=dev)[None])
        half = self.D // 2
        self.cos, self.sin = cos[0], torch.cat([-sin[0, :, :half], sin[0, :, half:]], -1)
        # additive attention mask (0, or -inf on the prompts' left padding) per (row, kv head)
        self.mask = torch.zeros(batch, self.Hkv, 1, max_len, device=dev)

    def prefill(self, ids, mask, positions, group_size: int = 1):
        """transformers' forward over each group's prompt once (sample_groups' layout): its
        last logits, its keys and values in the compute dtype (what autocast's attention sees)."""
        G, P = group_size, ids.shape[1]
        cache = KVCache(len(self.layers), P, self.cdt)
        out = self.model(input_ids=ids[::G], attention_mask=mask[::G], position_ids=positions[::G],
                         use_cache=True, logits_to_keep=1, cache=cache)
        self.n = P
        self.mask[..., :P].masked_fill_((mask == 0)[:, None, None, :], float("-inf"))
        for buf, layer in zip(self.layers, cache.layers):
            kp, vp = layer.keys.float(), layer.values.float()
            if G > 1:
                buf["kp"], buf["vp"] = kp, vp                            # [groups, kv_heads, P, D]
            else:
                buf["k"][:, :, :P], buf["v"][:, :, :P] = kp, vp
        if G > 1:
            self.G, self.P = G, P
            self.mask_p = self.mask[::G, :, :, :P].reshape(-1, 1, P)     # [groups * kv_heads, 1, P]
        return out.logits[:, -1, :].repeat_interleave(G, 0)

    def keep(self, rows: torch.Tensor) -> None:
        """A fresh buffer of these rows each (in place, dropped rows' pages would stay resident)."""
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
        self.mask = self.mask[rows]
        self.G = self.P = None

    def step(self, tok: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """transformers' ops in its dtypes, but for attention (autocast off: it casts itself)."""
        with torch.autocast(tok.device.type, enabled=False):
            logits = self.forward(tok, pos, self.n)
        self.n += 1
        return logits

    def forward(self, tok: torch.Tensor, pos: torch.Tensor, n: int) -> torch.Tensor:
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
        """`attend` in the group layout: the prompt part from the group's keys and values (G *
        rep query rows per group and kv head), the response part per row, one softmax."""
        G, P, Hkv, rep, D = self.G, self.P, self.Hkv, self.rep, self.D
        ng = q.shape[0] // (Hkv * G)

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
