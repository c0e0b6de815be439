"""A model's parameters, weight bytes and KV bytes per GPU, from its shape
(sim/hardware/specs/models.json): what the roofline prices and the KV pool sizes."""
from __future__ import annotations


ACT_BYTES = 2  # activations, collectives' payloads, and every non-linear weight: bf16
LAYOUTS = ("tp", "ep")


def lm_head_params(model: dict) -> int:
    return model["vocab_size"] * model["hidden_size"]


def param_counts(model: dict) -> dict:
    """Parameters counted from the shapes (the spec's num_params must equal `total`):
    layer_total / layer_active = all but embeddings, LM head and final norm (active: top-k
    + shared experts of each MoE layer); linear_* = the GEMM weights (attention projections,
    MLPs, experts), what FP8 quantizes; routed = all routed experts."""
    H, L, q, kv, hd = (model[k] for k in ("hidden_size", "num_layers", "num_attention_heads", "num_kv_heads", "head_dim"))
    attn_lin = H * (q + 2 * kv) * hd + q * hd * H
    other = ((q + 2 * kv) * hd if model.get("attention_bias") else 0) + (2 * hd if model.get("qk_norm") else 0) \
        + model.get("norms_per_layer", 2) * H
    moe = model.get("moe")
    n_moe = L - moe["first_dense_layers"] if moe else 0
    dense_mlp = 3 * H * model["intermediate_size"]
    expert = 3 * H * moe["moe_intermediate_size"] if moe else 0
    E, k, S = (moe["num_experts"], moe["experts_per_token"], moe["num_shared_experts"]) if moe else (0, 0, 0)
    router = E * H + (E if moe and moe.get("router_bias") else 0)
    lin_common = L * attn_lin + (L - n_moe) * dense_mlp
    linear_total = lin_common + n_moe * (E + S) * expert
    linear_active = lin_common + n_moe * (k + S) * expert
    rest = L * other + n_moe * router
    embed = lm_head_params(model) * (1 if model["tie_word_embeddings"] else 2)
    return {"total": linear_total + rest + embed + H, "layer_total": linear_total + rest, "layer_active": linear_active + rest,
            "linear_total": linear_total, "linear_active": linear_active, "routed": n_moe * E * expert, "moe_layers": n_moe}


def layer_params(model: dict) -> int:
    """Params in the per-token GEMMs: all but the embedding table, the LM head and the final norm
    (of an MoE, the active ones: top-k and shared experts)."""
    return param_counts(model)["layer_active"]


def _bytes(model: dict, params: int, linear: int) -> float:
    """Bytes of `params` weights of which `linear` are GEMM weights (FP8-quantizable)."""
    return linear * model["dtype_bytes"] + (params - linear) * ACT_BYTES


def weight_bytes_total(model: dict) -> float:
    """Bytes loaded on the GPUs: every parameter, plus memory-only ones (a vision tower)."""
    pc = param_counts(model)
    return _bytes(model, model["num_params"], pc["linear_total"]) + model.get("memory_only_params", 0) * ACT_BYTES


def weight_bytes_streamed(model: dict) -> float:
    """Bytes read per step: everything but the embedding table (only looked up), unless tied,
    and memory-only parameters."""
    skip = 0 if model["tie_word_embeddings"] else lm_head_params(model)
    return _bytes(model, model["num_params"] - skip, param_counts(model)["linear_total"])


def per_gpu(model: dict, total: float, layout: str, n: int) -> float:
    """Bytes of `total` on one GPU: split n ways (tp), or everything but the routed experts
    replicated and the routed experts split n ways (ep)."""
    if layout == "tp" or n == 1:
        return total / n
    routed = param_counts(model)["routed"] * model["dtype_bytes"]
    return total - routed + routed / n


def kv_dtype_bytes(model: dict) -> int:
    return model.get("kv_dtype_bytes", model["dtype_bytes"])


def attention_layers(model: dict) -> tuple[int, int]:
    """(full-attention layers, sliding-window layers): Gemma-3's pattern is 5 local then 1 global."""
    L, pat = model["num_layers"], model.get("sliding_window_pattern")
    if not model.get("sliding_window") or not pat:
        return L, 0
    glob = L // pat
    return glob, L - glob


def kv_heads_per_gpu(model: dict, tp: int) -> int:
    return max(1, model["num_kv_heads"] // tp)  # fewer KV heads than ranks: vLLM replicates them


def kv_bytes_per_token(model: dict, tp: int = 1) -> int:
    """KV of one token in every layer, per GPU (a sliding-window model's local layers included)."""
    return 2 * model["num_layers"] * kv_heads_per_gpu(model, tp) * model["head_dim"] * kv_dtype_bytes(model)


# Gemma-3's local layers hold at most `sliding_window` tokens of a sequence; the block pool
# counts blocks of one size per token, so their KV is charged as if every sequence were this
# long (see kv_layers_charged and docs/profiles.md).
KV_REFERENCE_TOKENS = 32768


def kv_layers_charged(model: dict, context: int = KV_REFERENCE_TOKENS) -> float:
    """Layers' worth of KV one token of a `context`-token sequence holds: all of them, or for
    sliding-window models the global layers + local layers x window / context."""
    glob, local = attention_layers(model)
    return glob + local * min(1.0, model.get("sliding_window", 0) / context) if local else float(glob)


def kv_bytes_per_token_charged(model: dict, heads: float) -> float:
    """Per-token KV the profile charges (kv_bytes_per_block / block_size) for `heads` KV heads."""
    return 2 * kv_layers_charged(model) * heads * model["head_dim"] * kv_dtype_bytes(model)
