"""`sim profile check`: a profile's step times against independent references.

The prediction is the simulator's own: Profile.step_time (sim/hardware/profile.py) of one step
with the reference point's chunks, unchunked (the probes were timed as one forward pass
each, so they are priced as one step, whatever the profile's token budget):

  prefill {n, k}            one chunk of n new tokens after k cached: (q, k) = (n, k + n)
  decode {B, ctx}           B chunks (1, ctx)
  mixed {n, k, B, ctx}      the prefill chunk (n, k + n) plus B decode chunks (1, ctx)

The error of a point is (predicted - reference) / reference: + means the profile prices
the step slower than the reference. Per kind (fresh prefill, cached-prefix prefill,
decode by batch size, mixed) it prints the MAPE, the signed mean and the worst point.

References:
- a probe file in the shared format (the shipped sim/hardware/measurements/h100/, h200/): top-level
  `device`, `model`, and `probes`, each {kind: prefill, n, k, median_s, min_s} (n new
  tokens after k cached, one unchunked forward pass), {kind: decode, B, ctx, median_s,
  min_s} (one step of B sequences each over ctx tokens) or {kind: mixed, n, k, B, ctx,
  median_s} (a chunk of n after k cached plus B decodes over ctx each). Judged on median_s.
  This module is the one reader of that format: sim/hardware/roofline.py and calibrate/measured.py
  take their rows from read_probes().
- NVIDIA aiconfigurator's database of kernels measured under vLLM (the optional extra
  `aiconfigurator`: the package aiconfigurator-core, which ships the database; nothing is
  downloaded at run time). The same kinds of point, on the grid AIC_GRID, are estimated
  by its engine for the profile's GPU and model shape (see aiconfigurator_points()).
"""
from __future__ import annotations

import json
import logging
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from agentsim.errors import InputError

KINDS = ("prefill", "decode", "mixed")  # the file's kinds
NEED = {"prefill": ("n", "k", "median_s", "min_s"), "decode": ("B", "ctx", "median_s", "min_s"),
        "mixed": ("n", "k", "B", "ctx", "median_s")}
ZERO_OK = {"k"}  # may be 0: a fresh prefill, a mixed step whose chunk has no cached prefix
STAT = "median_s"
# Decode rows by batch size (label, lowest B, highest B).
DECODE_BUCKETS = (("decode B=1", 1, 1), ("decode B=2-16", 2, 16), ("decode B=17-64", 17, 64),
                  ("decode B=65-256", 65, 256), ("decode B>256", 257, math.inf))
GROUPS = ("fresh prefill", "cached prefill", *(b[0] for b in DECODE_BUCKETS), "mixed")


@dataclass(frozen=True)
class Probe:
    """One reference point: a step of the file's `kind` and its timings by statistic."""
    kind: str  # prefill, decode or mixed
    n: int = 0
    k: int = 0
    B: int = 0
    ctx: int = 0
    seconds: dict = field(default_factory=dict, compare=False)

    @property
    def group(self) -> str:
        """fresh_prefill, cached_prefill, decode or mixed."""
        if self.kind == "prefill":
            return "cached_prefill" if self.k > 0 else "fresh_prefill"
        return self.kind

    def chunks(self) -> list[tuple[int, int]]:
        """The step's (q, k) chunks: q new tokens attending over k (k counts the chunk)."""
        pre = [(self.n, self.k + self.n)] if self.kind in ("prefill", "mixed") else []
        return pre + [(1, self.ctx)] * (self.B if self.kind in ("decode", "mixed") else 0)

    def features(self) -> tuple[int, int, float, float, float, float]:
        """(tokens, seqs, sum q*k, sum k, sum q*(k-q), mixed decodes' sum k): Profile.step_time's arguments."""
        from sim.hardware.profile import step_features

        return step_features(self.chunks())

    def label(self) -> str:
        pre = f"n={self.n}" + (f" k={self.k}" if self.k else "")
        dec = f"B={self.B} ctx={self.ctx}"
        return {"prefill": pre, "decode": dec}.get(self.kind, f"{pre} + {dec}")

    def point(self) -> dict:
        return {"kind": self.kind, **({"n": self.n, "k": self.k} if self.kind != "decode" else {}),
                **({"B": self.B, "ctx": self.ctx} if self.kind != "prefill" else {})}


def check_probes(data, where: str, kinds=KINDS, doc: str = "sim/hardware/check.py") -> None:
    """One-line InputError unless `data` holds a non-empty 'probes' list of `kinds`, each
    with its fields positive numbers (k may be 0)."""
    if not isinstance(data, dict) or not isinstance(data.get("probes"), list) or not data["probes"]:
        raise InputError(f"{where} has no 'probes' list; see {doc} for the format")
    expected = " or ".join(", ".join(repr(k) for k in kinds).rsplit(", ", 1))
    for i, pr in enumerate(data["probes"]):
        kind = pr.get("kind") if isinstance(pr, dict) else None
        if kind not in kinds:
            raise InputError(f"{where}: probe {i} has kind {kind!r}; expected {expected}")
        for key in NEED[kind]:
            v = pr.get(key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or (key not in ZERO_OK and v <= 0) \
                    or not math.isfinite(v):
                raise InputError(f"{where}: probe {i} ({kind}) has {key}={v!r}; "
                                 f"need a positive number{' (k may be 0)' if key in ZERO_OK else ''}")


def read_probes(data: dict, where: str = "probe file", kinds=KINDS) -> list[Probe]:
    """The file's probes in file order (checked first: one-line InputError)."""
    check_probes(data, where, kinds)
    out = []
    for pr in data["probes"]:
        ints = {f: int(pr[f]) for f in ("n", "k", "B", "ctx") if f in NEED[pr["kind"]]}
        stats = {s: float(pr[s]) for s in ("median_s", "min_s") if isinstance(pr.get(s), (int, float))}
        out.append(Probe(pr["kind"], seconds=stats, **ints))
    return out


def load_probe_file(path: str | Path, kinds=KINDS, doc: str = "sim/hardware/check.py") -> dict:
    """The file's JSON, its probes checked and a 'device' name present (one-line InputError)."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"probe file {str(p)!r} not found; give the path of a measurement JSON "
                         "(e.g. sim/hardware/measurements/h100/llama3.1-8b-shape-torch-probes.json)")
    try:
        data = json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"probe file {str(p)!r} is not valid JSON ({e}); fix or re-export it".replace("\n", " ")) from None
    check_probes(data, f"probe file {str(p)!r}", kinds, doc)
    if not isinstance(data.get("device"), str):
        raise InputError(f"probe file {str(p)!r} has no 'device' name; see {doc} for the format")
    return data


# ---- what GPU and model a profile or a file is about -----------------------------------------

# Chip families as device strings name them, longest first (GB200 before B200, L40S before L40).
_FAMILIES = ("GB300", "GB200", "B300", "B200", "H200", "H100", "H20", "A100", "A30", "A10G", "A10", "L40S", "L40",
             "L4", "RTX PRO 6000", "RTX 6000 ADA", "RTX 5090")
# aiconfigurator's system names by family (its systems/*.yaml); H100 PCIe is its own system.
AIC_SYSTEMS = {"H100": "h100_sxm", "H100 PCIe": "h100_pcie", "H200": "h200_sxm", "A100": "a100_sxm",
               "B200": "b200_sxm", "B300": "b300_sxm", "GB200": "gb200", "GB300": "gb300", "L40S": "l40s",
               "L4": "l4", "A30": "a30", "RTX PRO 6000": "rtx_pro_6000_server"}
SHAPE_KEYS = ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "head_dim", "intermediate_size",
              "vocab_size")


def gpu_family(device: str) -> str | None:
    """'H100', 'H100 PCIe', 'H200', ... from a device string; None for no known GPU (a CPU)."""
    text = re.sub(r"[\s_-]+", " ", str(device).upper())
    for fam in _FAMILIES:
        if re.search(rf"(?<![A-Z0-9]){fam}(?![A-Z0-9])", text):
            return "H100 PCIe" if fam == "H100" and "PCIE" in text else fam
    return None


def _spec_shape(name: str) -> dict | None:
    """The shape of a model sim/hardware/specs/models.json knows, by a name that starts with its key or an alias."""
    from sim.hardware.spec_tables import spec_key, spec_table

    want = spec_key(name)
    for canon, spec in spec_table("models.json")["models"].items():
        if any(want.startswith(spec_key(a)) for a in (canon, *spec.get("aliases", ()))):
            return {k: spec[k] for k in SHAPE_KEYS if k in spec}
    return None


def model_shape(model: dict) -> dict:
    """A profile's model shape: its own fields, completed from sim/hardware/specs/models.json by name."""
    shape = {k: model[k] for k in SHAPE_KEYS if isinstance(model.get(k), int) and not isinstance(model.get(k), bool)}
    known = _spec_shape(str(model.get("name", ""))) or {}
    if known and all(known.get(k) == v for k, v in shape.items()):
        shape = {**known, **shape}
    return shape


def _shape_text(shape: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in shape.items())


def _same_shape(a: dict, b: dict) -> list[str]:
    """The shape keys both give that differ ([] = same model shape); a needs the first four."""
    if not all(k in a and k in b for k in SHAPE_KEYS[:4]):
        return [k for k in SHAPE_KEYS[:4] if k not in a or k not in b] or ["?"]
    return [k for k in SHAPE_KEYS if k in a and k in b and a[k] != b[k]]


# ---- the check ---------------------------------------------------------------------------------

def errors(profile, probes: list[Probe], stat: str = STAT) -> list[dict]:
    """One row per probe: its point, the reference and predicted seconds, the error in percent."""
    return error_rows([profile.step_time(*p.features()) for p in probes], probes, stat)


def error_rows(predicted: list[float], probes: list[Probe], stat: str = STAT) -> list[dict]:
    """errors() for seconds predicted by anything (one per probe)."""
    out = []
    for pred, p in zip(predicted, probes, strict=True):
        ref = p.seconds[stat]
        out.append({**p.point(), "group": _group(p), "label": p.label(), "reference_s": ref, "predicted_s": pred,
                    "error_pct": (pred - ref) / ref * 100})
    return out


def _group(p: Probe) -> str:
    if p.kind == "decode":
        return next(name for name, lo, hi in DECODE_BUCKETS if lo <= p.B <= hi)
    return {"fresh_prefill": "fresh prefill", "cached_prefill": "cached prefill"}.get(p.group, p.group)


def summary(rows: list[dict]) -> list[dict]:
    """Per group (GROUPS order) and over all: points, MAPE, signed mean error, worst point."""
    out = []
    for g in (*GROUPS, "all"):
        sel = [r for r in rows if g == "all" or r["group"] == g]
        if not sel:
            continue
        worst = max(sel, key=lambda r: abs(r["error_pct"]))
        out.append({"kind": g, "points": len(sel), "mape_pct": sum(abs(r["error_pct"]) for r in sel) / len(sel),
                    "mean_error_pct": sum(r["error_pct"] for r in sel) / len(sel),
                    "worst": {"point": worst["label"], "error_pct": worst["error_pct"]}})
    return out


def probe_reference(profile, path: str | Path) -> dict:
    """The profile against a probe file of its GPU and model (else one-line InputError)."""
    data = load_probe_file(path)
    where = f"probe file {str(path)!r}"
    dev = str(profile.raw.get("device", ""))
    fam, file_fam = gpu_family(dev), gpu_family(data["device"])
    if file_fam is None or fam != file_fam:
        raise InputError(f"{where} was measured on {data['device']!r} ({file_fam or 'no GPU sim knows'}), "
                         f"profile {profile.name!r} is for {dev or 'an unnamed device'!r} ({fam or 'no GPU sim knows'}); "
                         "give a probe file of the profile's GPU")
    fmodel = data.get("model")
    if not isinstance(fmodel, str):
        raise InputError(f"{where} has no 'model' name; it is needed to check the probes are of the profile's model")
    fshape = _spec_shape(fmodel)
    if fshape is None:
        raise InputError(f"{where} is of model {fmodel!r}, which sim/hardware/specs/models.json does not know; "
                         "its shape cannot be compared with the profile's")
    pshape = model_shape(profile.model)
    diff = _same_shape(fshape, pshape)
    if diff:
        raise InputError(f"{where} is of model {fmodel!r} ({_shape_text(fshape)}), profile {profile.name!r} of "
                         f"{profile.model.get('name')!r} ({_shape_text(pshape) or 'no shape'}): {', '.join(diff)} differ; "
                         "give a probe file of the profile's model")
    rows = errors(profile, read_probes(data, where))
    return {"reference": "probes", "source": str(path), "device": data["device"], "model": fmodel, "stat": STAT,
            "summary": summary(rows), "rows": rows}


# ---- aiconfigurator ------------------------------------------------------------------------------

AIC_PACKAGE = "aiconfigurator-core"
AIC_VERSION = "0.12.0"  # pinned by the extra `aiconfigurator` (pyproject.toml)
AIC_BACKEND = "vllm"


def _aic_grid() -> list[Probe]:
    """The points aiconfigurator is asked for: the shapes of the shared H100/H200 probe files
    (fresh and cached prefill, decode B 1-256 over 512-32K) and mixed steps (a 512 or 2048
    chunk, fresh or after 8K cached, beside 32-256 decodes over 2K or 8K)."""
    pts = [Probe("prefill", n=n) for n in (256, 1000, 2000, 4000, 8000, 16000, 32000)]
    pts += [Probe("prefill", n=n, k=k) for n, k in ((512, 4000), (512, 16000), (512, 32000), (2000, 8000),
                                                     (2000, 30000), (4000, 12000), (1000, 60000), (8000, 24000))]
    pts += [Probe("decode", B=b, ctx=c) for b in (1, 4, 16, 32, 64, 128, 256) for c in (512, 2048, 8192, 32768)
            if b * c <= 256 * 8192]
    pts += [Probe("mixed", n=n, k=k, B=b, ctx=c) for n, k in ((512, 0), (2048, 0), (512, 8000))
            for b in (32, 64, 128, 256) for c in (2048, 8192)]
    return pts


AIC_GRID = _aic_grid()


def aic_system(device: str) -> str:
    fam = gpu_family(device)
    if fam is None or fam not in AIC_SYSTEMS:
        raise InputError(f"aiconfigurator: the profile's device {device!r} is not a GPU it has a system for "
                         f"({', '.join(sorted(AIC_SYSTEMS))}); no reference for it")
    return AIC_SYSTEMS[fam]


def _aic():
    """The installed aiconfigurator-core (one-line InputError when the extra is not installed)."""
    try:
        import aiconfigurator_core  # noqa: F401
        from aiconfigurator_core.sdk import engine, perf_database, utils
    except ImportError:
        raise InputError(f"--aiconfigurator needs the optional extra: pip install '{AIC_PACKAGE}=={AIC_VERSION}' "
                         "(or `pip install -e '.[aiconfigurator]'`)") from None
    return engine, perf_database, utils


def aic_model(model: dict, utils) -> str:
    """The Hugging Face id of a model config aiconfigurator ships (so nothing is fetched)
    with the profile model's shape and weights: the profile's own checkpoint (its name)
    where aiconfigurator ships it, else a bf16 checkpoint, or for FP8 weights (dtype_bytes 1)
    a block-FP8 one (quantization_config quant_method fp8)."""
    from aiconfigurator_core.sdk import common

    want = model_shape(model)
    quant = "fp8" if model.get("dtype_bytes", 2) == 1 else None
    names = {"num_hidden_layers": "num_layers", "hidden_size": "hidden_size", "num_attention_heads": "num_attention_heads",
             "num_key_value_heads": "num_kv_heads", "head_dim": "head_dim", "intermediate_size": "intermediate_size",
             "vocab_size": "vocab_size"}

    def shape_of(cfg: dict) -> dict:
        shape = {ours: cfg[theirs] for theirs, ours in names.items() if isinstance(cfg.get(theirs), int)}
        if "head_dim" not in shape and shape.get("num_attention_heads"):
            shape["head_dim"] = cfg.get("hidden_size", 0) // shape["num_attention_heads"]
        return shape

    def config(hf_id: str) -> tuple[dict | None, dict | None]:
        """(config.json, hf_quant_config.json's quantization section) as aiconfigurator ships them."""
        path = utils._get_model_config_path() / f"{hf_id.replace('/', '--')}_config.json"
        qpath = path.parent / f"{hf_id.replace('/', '--')}_hf_quant_config.json"
        try:
            cfg = json.loads(path.read_text()) if path.is_file() else None
            hq = json.loads(qpath.read_text()).get("quantization") if qpath.is_file() else None
        except (OSError, ValueError, AttributeError):
            return None, None
        return cfg, hq

    own = str(model.get("name", ""))
    match = {h.lower(): h for h in common.DefaultHFModels}.get(own.lower())
    if match:
        cfg, hq = config(match)
        # a ModelOpt checkpoint (hf_quant_config.json) states its weights' format there
        fmt = str((hq or {}).get("quant_algo", "")).lower() or ((cfg or {}).get("quantization_config") or {}).get("quant_method")
        if cfg and not _same_shape(want, shape_of(cfg)) and (fmt or None) == quant:
            return match
    for hf_id in sorted(common.DefaultHFModels):
        cfg, hq = config(hf_id)
        if cfg is None or hq is not None:
            continue  # a ModelOpt checkpoint stands only for itself (its name), above
        if not _same_shape(want, shape_of(cfg)) and (cfg.get("quantization_config") or {}).get("quant_method") == quant:
            return hf_id
    written = _zoo_config(model, want, quant, common)
    if written:
        return written
    raise InputError(f"aiconfigurator {AIC_VERSION} ships no {quant or 'bf16'} model config of the profile's shape "
                     f"({model.get('name')!r}: {_shape_text(want) or 'no shape'}); no reference for it")


def _zoo_spec(name: str) -> dict | None:
    from sim.hardware.spec_tables import spec_key, spec_table

    want = spec_key(name)
    for canon, spec in spec_table("models.json")["models"].items():
        if any(want.startswith(spec_key(a)) for a in (canon, *spec.get("aliases", ()))):
            return spec
    return None


def _zoo_config(model: dict, want: dict, quant: str | None, common) -> str | None:
    """For a dense bf16 zoo model whose checkpoint aiconfigurator does not ship but whose
    architecture its engine models as a plain transformer (LlamaForCausalLM, Qwen2ForCausalLM),
    a directory holding a config.json written from the zoo's shape (aiconfigurator reads a
    local config directory the same way; its kernels are looked up by shape), else None."""
    import tempfile

    spec = _zoo_spec(str(model.get("name", "")))
    if quant or spec is None or spec.get("moe") or spec.get("sliding_window") or \
            common.ARCHITECTURE_TO_MODEL_FAMILY.get(spec.get("architecture")) != "LLAMA" or \
            _same_shape(want, {k: spec[k] for k in SHAPE_KEYS if k in spec}):
        return None
    cfg = {"architectures": [spec["architecture"]], "model_type": "llama", "num_hidden_layers": spec["num_layers"],
           "hidden_size": spec["hidden_size"], "num_attention_heads": spec["num_attention_heads"],
           "num_key_value_heads": spec["num_kv_heads"], "head_dim": spec["head_dim"],
           "intermediate_size": spec["intermediate_size"], "vocab_size": spec["vocab_size"],
           "max_position_embeddings": spec["max_position_embeddings"],
           "tie_word_embeddings": bool(spec.get("tie_word_embeddings")), "torch_dtype": "bfloat16"}
    out = Path(tempfile.gettempdir()) / "agentsim-aiconfigurator" / spec["hf_repo"].replace("/", "--")
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg))
    return str(out)


# aiconfigurator 0.12.0's context attention (its Rust ContextAttentionOp.query, mirroring operations/attention.py)
# adds vLLM's rotary embedding and KV-cache write, which its measured attention kernel leaves out, through its
# analytic memory-op formula (bytes / (mem_bw x mem_bw_empirical_scaling_factor) + a constant, times 1.1), but
# with one token's bytes (q and k for the rotary, read and written; k and v for the write) whatever the step's
# token count: they come out a constant 13.2 us a layer on H100 (its per-op breakdown at 1K-8K tokens).
AIC_EXTRAS_FACTOR = 1.1  # its "correction factor for the fused extras"


def aic_mem_bw(system: str) -> float:
    """aiconfigurator's effective memory bandwidth (bytes/s) for its memory-op formula: its system file's
    mem_bw x mem_bw_empirical_scaling_factor."""
    import yaml
    import aiconfigurator_core

    gpu = yaml.safe_load((Path(aiconfigurator_core.__file__).parent / "systems" / f"{system}.yaml").read_text())["gpu"]
    return float(gpu["mem_bw"]) * float(gpu["mem_bw_empirical_scaling_factor"])


def aic_token_extras_s(shape: dict, tp: int, tokens: int, mem_bw: float) -> float:
    """Seconds of a step's rotary embedding and KV-cache write that aiconfigurator leaves out: its own byte
    counts for the other tokens - 1 of the step (it prices one), on every layer, at its effective bandwidth
    mem_bw (aic_mem_bw). shape: model_shape's keys; tp: the GPUs the heads are split over (KV heads
    replicated below one a GPU)."""
    hd = shape["head_dim"]
    q = shape["num_attention_heads"] // tp * hd
    kv = max(shape["num_kv_heads"] // tp, 1) * hd
    per_token = 2 * (q + kv) * 2 + 2 * kv * 2  # rotary: bf16 q and k, read and written; write: bf16 k and v
    return AIC_EXTRAS_FACTOR * shape["num_layers"] * max(tokens - 1, 0) * per_token / mem_bw


def aic_decode_attention_remap(system: str, version: str, shape: dict, tp: int, kv: int):
    """(what it did, ms(B, ctx)) where the model's decode attention has more KV heads per GPU than
    aiconfigurator's decode-attention table measured (its vLLM rows stop at 8): it then scales
    the largest rows linearly in the heads, pricing an under-filled kernel f times
    (Llama-2-7B at tp 1, B=1 over 700 tokens: 48 us a layer, 0.24 TB/s). The same launch is
    in the table: the kernel runs one thread block per (sequence, KV head) and split, so H
    heads over B sequences are the grid and bytes of H/f heads over f*B sequences (the heads
    per KV head kept). Returns the step's change, ms, of pricing it so (every layer), or
    None where the heads fit the table or do not divide."""
    import aiconfigurator_core
    import pyarrow.parquet as pq
    from aiconfigurator_core.sdk import common, operations, perf_database

    table = (Path(aiconfigurator_core.__file__).parent / "systems" / "data" / system / "attention" / AIC_BACKEND / version
             / "generation_attention_perf.parquet")
    if not table.exists():
        return None
    measured = max(pq.read_table(table, columns=["num_key_value_heads"]).column(0).to_pylist())
    heads, kv_heads = shape["num_attention_heads"] // tp, max(1, shape["num_kv_heads"] // tp)
    if kv_heads <= measured or kv_heads % measured or heads % (kv_heads // measured):
        return None
    f = kv_heads // measured
    db = perf_database.get_database(system, AIC_BACKEND, version)
    mode = common.KVCacheQuantMode.fp8 if kv == 1 else common.KVCacheQuantMode.bfloat16

    def one(n: int, n_kv: int, b: int, ctx: int) -> float:
        op = operations.GenerationAttention("generation_attention", 1, n, n_kv, mode, head_size=shape["head_dim"])
        return float(op._engine_query(db, batch_size=b, s=ctx))

    said = f"{kv_heads} KV heads per GPU priced as {measured} over {f}x the sequences (its table's largest)"
    return said, lambda B, ctx: shape["num_layers"] * (one(heads // f, measured, B * f, ctx) - one(heads, kv_heads, B, ctx))


def aiconfigurator_points(profile, points: list[Probe] | None = None) -> tuple[list[Probe], dict]:
    """The points (AIC_GRID by default, those beyond the profile's max_model_len left out),
    their seconds estimated by aiconfigurator for the profile's GPU and model under vLLM, and
    what was used, on the profile's tensor-parallel size (its model's tensor_parallel_size;
    experts split the same way). prefill: predict_prefill_latency(1, n + k, prefix=k); decode:
    predict_decode_latency(B, ctx, osl=2), one decode step; mixed: its engine's mixed-step
    parts, the shared GEMMs of n + B tokens and the chunk's attention at (isl n + k, prefix
    k, times ceil((n + k) / n): its engine spreads a prefill's attention over its chunks),
    plus the decode attention of B sequences at isl ctx (its mixed step takes one isl).
    A step with prefill tokens also pays the rotary and KV-cache write of all its tokens (n, plus B in a
    mixed step), which aiconfigurator prices for one (aic_token_extras_s); decode steps as it prices them,
    except a decode attention of more KV heads per GPU than its table measured, priced on the table's
    rows of the same launch (aic_decode_attention_remap).
    Every caller (the check, the measured-kernel derive, the docs' tables) prices steps this one way."""
    device = str(profile.raw.get("device", ""))
    system = aic_system(device)
    engine, perf_database, utils = _aic()
    supported = perf_database.get_supported_databases()
    if AIC_BACKEND not in supported.get(system, {}):
        have = sorted(s for s, b in supported.items() if AIC_BACKEND in b)
        raise InputError(f"aiconfigurator {AIC_VERSION} has no {AIC_BACKEND} kernel data for {system} "
                         f"(the profile's {device!r}); it has: {', '.join(have)}")
    if profile.model.get("dtype_bytes", 2) not in (1, 2):
        raise InputError(f"aiconfigurator reference: profile {profile.name!r} has dtype_bytes="
                         f"{profile.model.get('dtype_bytes')}; only bf16 (2) and FP8 (1) models are compared")
    kv = profile.model.get("kv_dtype_bytes", 2)
    if kv not in (1, 2):
        raise InputError(f"aiconfigurator reference: profile {profile.name!r} has kv_dtype_bytes={kv}; "
                         "only a bf16 (2) or FP8 (1) KV cache is compared")
    tp, ep = (int(profile.model.get(k) or 1) for k in ("tensor_parallel_size", "expert_parallel_size"))
    if ep > 1:
        raise InputError(f"aiconfigurator reference: profile {profile.name!r} is expert-parallel (ep {ep}, data-parallel "
                         "attention), whose steps are not compared; check the tensor-parallel profile of the model")
    hf_id = aic_model(profile.model, utils)
    limit = profile.engine.max_model_len
    pts = [p for p in (AIC_GRID if points is None else points) if max(p.n + p.k, p.ctx) <= limit]
    shape = model_shape(profile.model)  # aic_model found its first four keys
    shape.setdefault("head_dim", shape["hidden_size"] // shape["num_attention_heads"])  # as aiconfigurator reads a config
    bw = aic_mem_bw(system)
    log = logging.getLogger("aiconfigurator_core")
    level = log.level
    log.setLevel(logging.ERROR)  # its database warns of fallback rows for ops this model does not use
    try:
        version = perf_database.get_latest_database_version(system, AIC_BACKEND)
        # the KV cache as the profile keeps it (bf16: vLLM's kv-cache-dtype auto; FP8: --kv-cache-dtype
        # fp8, whose vLLM attention kernels the database measures with bf16 math on FP8 KV);
        # aiconfigurator's default for an FP8 checkpoint is an FP8 KV cache, so it is always told. The
        # GEMMs' mode is the checkpoint's (fp8_block for block-FP8, fp8_static for ModelOpt's per-tensor FP8).
        h = engine.EngineHandle.compile(hf_id, system, AIC_BACKEND, backend_version=version, tp_size=tp, moe_tp_size=tp,
                                        kvcache_quant_mode="fp8" if kv == 1 else "bfloat16", fmha_quant_mode="bfloat16")
        remap = aic_decode_attention_remap(system, version, shape, tp, kv)
        out = []
        for p in pts:
            if p.kind == "prefill":
                ms = h.predict_prefill_latency(1, p.n + p.k, p.k)
            elif p.kind == "decode":
                ms = h.predict_decode_latency(p.B, p.ctx, 2) + (remap[1](p.B, p.ctx) if remap else 0.0)
            else:
                _, shared, ctx_attn, _ = h.mixed_step_breakdown(p.n, p.B, p.n + p.k, 2, p.k)
                dec_attn = h.mixed_step_breakdown(min(p.n, p.ctx), p.B, p.ctx, 2, 0)[3]
                # its context attention arrives divided by ceil(isl / chunk), the chunks of a whole
                # prefill of isl: times that, it is this chunk's (n new over n + k keys)
                ms = shared + ctx_attn * math.ceil((p.n + p.k) / p.n) + dec_attn + (remap[1](p.B, p.ctx) if remap else 0.0)
            sec = ms / 1e3
            if p.kind != "decode":
                sec += aic_token_extras_s(shape, tp, p.n + (p.B if p.kind == "mixed" else 0), bw)
            out.append(Probe(p.kind, p.n, p.k, p.B, p.ctx, seconds={STAT: sec}))
    except (ValueError, RuntimeError, KeyError) as e:
        raise InputError(f"aiconfigurator {AIC_VERSION} could not estimate {system} / {hf_id} under {AIC_BACKEND}: "
                         f"{e}".replace("\n", " ")) from None
    finally:
        log.setLevel(level)
    if Path(hf_id).is_dir():  # a config written from the zoo's shape (_zoo_config)
        hf_id = f"{Path(hf_id).name.replace('--', '/', 1)} (config.json from the zoo's shape)"
    used = {"system": system, "backend": f"{AIC_BACKEND} {version}", "model": hf_id, "tp": tp,
            "package": f"{AIC_PACKAGE} {AIC_VERSION}"}
    if remap:
        used["decode_attention"] = remap[0]
    return out, used


def aiconfigurator_reference(profile) -> dict:
    pts, used = aiconfigurator_points(profile)
    rows = errors(profile, pts)
    return {"reference": "aiconfigurator", "source": f"{used['package']}: {used['system']}, {used['backend']}, "
                                                     f"{used['model']}" + (f", tp {used['tp']}" if used["tp"] > 1 else ""),
            **used, "stat": "estimate",
            "summary": summary(rows), "rows": rows}


def check(profile, probe_files=(), aiconfigurator: bool = False) -> list[dict]:
    """Every reference asked for, each checked before anything is printed."""
    if not probe_files and not aiconfigurator:
        raise InputError("give a reference: --probes FILE (a probe file of the profile's GPU and model) "
                         "and/or --aiconfigurator")
    refs = [probe_reference(profile, f) for f in probe_files]
    if aiconfigurator:
        refs.append(aiconfigurator_reference(profile))
    return refs


def format_table(profile, ref: dict) -> str:
    what = (f"probes {ref['source']} ({ref['device']}, {ref['model']}), judged on {ref['stat']}"
            if ref["reference"] == "probes" else f"aiconfigurator ({ref['source']}), kernel-time estimates "
            "plus every prompt token's rotary and KV-cache write")
    lines = [f"profile {profile.name} vs {what}",
             f"  {'kind':<18}{'points':>7}{'MAPE':>9}{'mean':>9}   worst point"]
    for s in ref["summary"]:
        lines.append(f"  {s['kind']:<18}{s['points']:>7}{s['mape_pct']:>8.1f}%{s['mean_error_pct']:>+8.1f}%   "
                     f"{s['worst']['point']}: {s['worst']['error_pct']:+.1f}%")
    return "\n".join(lines)
