"""Import the real vLLM 0.15.1 H100 server runs of inference-sim/training default_args into
benchmarks/data/server_runs.json (runs of source `inference-sim-training`, workload kind `stages`), and with
--campaign the same campaign's other runs (source `inference-sim-campaign`: H100, A100-80GB, L40S).

    python benchmarks/server_runs_inference_perf.py --src DIR [--peers GITDIR [--campaign]] [--data FILE]

DIR is a checkout of https://github.com/inference-sim/training at COMMIT or its git directory
(read with `git show COMMIT:path`). Taken per run of default_args/: the engine settings its
exp-config.yaml states; the client's data and load spec as inference-perf resolved it
(results/config.yaml: the `shared_prefix` groups, prompts per group, system prompt, question and
output lengths; the constant-rate stages); per stage the reported prompt-length statistics and the
measured client statistics of results/stage_N_lifecycle_metrics.json (TTFT, request latency,
inference-perf's TPOT and ITL: mean and p99; the re-tokenized output length). The three runs the
source excludes as overloaded (more than 10% of requests failed: split.py EXCLUDED_OVERLOAD) are
left out by the same rule. The requests themselves are not published: benchmarks/server_runs_table.py
synthesizes them from this spec (seeded). The source has no licence file: only statistics and the
stated settings are stored, with the URL at the commit.

--campaign (with --peers) also imports the study's runs that default_args has no folder for, from the same
campaign (inference-sim/tektonc-data-collection's blis-campaign): their per-stage actuals (mean, p90, p99 of E2E
and TTFT) from its CSV, the settings its columns state, the workload spec of the campaign's workloads.yaml by
workload name (SPECS; general-lite: general's data at 2.5 then 6 req/s; reasoning-lite: reasoning's at 1 req/s). A run both hold must have the same
actuals (checked), and default_args' profile.yaml must equal the spec of its name (checked). Runs whose model the
zoo lacks are listed as not judged.

--peers GITDIR (the git directory of inference-sim/sim-to-real-accuracy-validation) adds, per run and
stage, other simulators' published signed errors of mean E2E and mean TTFT (their CSVs' `mpe`, as
published, PEER_FILES at their commits; a later file's row wins over an earlier one's for the same
simulator, run and stage). That study renames the runs ("2-codellama-34b-tp2-codegen"): a row is
matched to a run and stage here by its `actual` mean E2E, equal to ours within 0.01 ms at the same
stage index (-1: the whole run).
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agentsim.errors import InputError  # noqa: E402
from benchmarks.server_runs_ground_truth import compact  # noqa: E402

DATA = ROOT / "benchmarks" / "data" / "server_runs.json"
SOURCE = "inference-sim-training"
COMMIT = "ed5c1d26900e6909758d5e1641a18edaf56a1caf"
BASE = f"https://github.com/inference-sim/training/tree/{COMMIT}/default_args"
MODELS = {"meta-llama/Llama-2-7b-hf": "llama2-7b", "meta-llama/Llama-2-70b-hf": "llama2-70b",
          "mistralai/Mixtral-8x7B-v0.1": "mixtral-8x7b", "codellama/CodeLlama-34b-Instruct-hf": "codellama-34b"}
OVERLOAD = 0.10  # the source's rule (split.py): a run with more than this share of failed requests is left out
IP = "https://github.com/kubernetes-sigs/inference-perf/blob/3b6f82a03d75212b06c5e0bdef7710b04c033300/inference_perf"
CLIENT = ("inference-perf as of 3b6f82a (2025-11-07; the resolved results/config.yaml has exactly its config fields: a load "
          "section without `trace`, a shared_prefix section without the multi-turn flag or the profile's aliases, which it "
          f"therefore ignored: 10 groups x 10 prompts), completions API, streaming, ignore_eos, max_tokens = output_len. "
          f"Prompts ({IP}/datagen/shared_prefix_datagen.py#L87-L103): per group a system prompt of system_prompt_len random "
          "token ids, decoded, then per prompt the same for a question, joined by a space, all prompts shuffled; request n of "
          f"a stage sends prompt n mod their number ({IP}/datagen/shared_prefix_datagen.py#L59-L61, "
          f"{IP}/loadgen/load_generator.py#L221-L229), so every prompt recurs whole. Constant load "
          f"({IP}/loadgen/load_timer.py#L34-L63): rate x duration requests at exponential gaps rescaled to sum to the "
          "duration (not evenly spaced)")
PROMPT_STATS = ("min", "p0.1", "p1", "p5", "p10", "p25", "median", "p75", "p90", "p95", "p99", "p99.9", "max", "mean")
SETTINGS_URL = ("https://github.com/inference-sim/sim-to-real-accuracy-validation/blob/dcec3fd4711c761ac16557db720d1856b604579c/"
                "docs/plans/2026-03-04-sim-to-real-accuracy-validation-design.md")
SOURCE_ENTRY = {
    "what": "inference-sim/training default_args: real vLLM v0.15.1 servers on H100 80GB SXM (BF16/FP16 weights), Llama-2-7B at "
            "TP1, Llama-2-70B at TP4, Mixtral-8x7B at TP2 and CodeLlama-34B at TP2, each loaded by inference-perf (streaming "
            "completions, ignore_eos) with its shared_prefix data at constant-rate stages; per stage the client's lifecycle "
            "statistics. Taken (benchmarks/server_runs_inference_perf.py): exp-config.yaml's engine settings, results/config.yaml's "
            "resolved data and load spec, and per stage the prompt-length and latency statistics; the 3 runs the source excludes "
            "as overloaded (over 10% failed requests) left out",
    "licence": "no licence file in inference-sim/training: only statistics and stated settings are stored, nothing copied",
    "settings": "exp-config.yaml: max_model_len 4096, max_num_batched_tokens 2048, max_num_seqs 128; the companion study's design "
                "(inference-sim/sim-to-real-accuracy-validation docs/plans/2026-03-04-sim-to-real-accuracy-validation-design.md:27): "
                "vLLM v0.15.1, H100, prefix caching on, chunked prefill on, fp16, KV cache CPU offloading 8 GiB (OffloadingConnector, "
                "recompute on failure); gpu_memory_utilization 0.9 (its result CSVs' gpu_mem_util); asynchronous scheduling vLLM's "
                "default at 0.15.1; no vllm.log published: num_gpu_blocks derived (sim/hardware/kv_pool.py)",
    "client_url": f"{BASE}/20260217-155451-llama-2-7b-tp1-codegen/results/config.yaml".replace("/tree/", "/blob/"),
    "settings_url": SETTINGS_URL,
}


PEER_REPO = "https://github.com/inference-sim/sim-to-real-accuracy-validation/blob"
# (commit, path): results_iter16 as last published before its removal (0205ebd), then the files at the study's head
PEER_FILES = (("b70edb9a13e729acc61515338b40ad8f381867cd", "results_iter16/error_records.csv"),
              ("dcec3fd4711c761ac16557db720d1856b604579c", "results_trainval/error_records.csv"),
              ("dcec3fd4711c761ac16557db720d1856b604579c", "results/llmservingsim_error_records_matched.csv"))


def read_csv(gitdir: Path, commit: str, rel: str) -> list[dict]:
    import csv
    import io

    r = subprocess.run(["git", "--git-dir", str(gitdir), "show", f"{commit}:{rel}"], capture_output=True, text=True)
    if r.returncode:
        raise InputError(f"--peers {gitdir}: no {rel} at {commit[:12]}; give the git directory of "
                         "inference-sim/sim-to-real-accuracy-validation")
    return list(csv.DictReader(io.StringIO(r.stdout)))


def peer_errors(gitdir: Path, totals: dict) -> dict:
    """{run id: [{stage, simulator, e2e_mean_pct, ttft_mean_pct, their_run, file}]}; totals: run id ->
    {stage: real mean E2E (ms)}, stage -1 the whole run."""
    rows = {}
    for commit, rel in PEER_FILES:
        for x in read_csv(gitdir, commit, rel):
            if x["metric_name"] not in ("e2e_mean", "ttft_mean") or x["hardware"] not in ("H100", "A100-80GB", "L40S"):
                continue
            key = (x["simulator"], x["experiment_folder"].rsplit("/", 1)[-1], int(x["stage_index"]))
            rows.setdefault(key, {})[x["metric_name"]] = (float(x["mpe"]), float(x["actual"]), f"{PEER_REPO}/{commit}/{rel}")
    out = {}
    for (sim, their, stage), m in rows.items():
        if "e2e_mean" not in m:
            continue
        actual = m["e2e_mean"][1]
        hit = [rid for rid, by in totals.items() if stage in by and abs(by[stage] - actual) < 0.01]
        if len(hit) != 1:
            continue
        out.setdefault(hit[0], []).append({"stage": stage, "simulator": sim, "their_run": their, "file": m["e2e_mean"][2],
                                           "e2e_mean_pct": round(m["e2e_mean"][0], 2),
                                           "ttft_mean_pct": round(m["ttft_mean"][0], 2) if "ttft_mean" in m else None})
    for v in out.values():
        v.sort(key=lambda x: (x["stage"], x["simulator"]))
    return out


class Source:
    """The source as a git directory (read at COMMIT) or a checkout."""

    def __init__(self, path: Path):
        self.path = path
        self.git = (path / "HEAD").is_file() and (path / "objects").is_dir()

    def read(self, rel: str) -> str:
        if self.git:
            r = subprocess.run(["git", "--git-dir", str(self.path), "show", f"{COMMIT}:{rel}"], capture_output=True, text=True)
            if r.returncode:
                raise InputError(f"--src {self.path}: no {rel} at {COMMIT[:12]} ({r.stderr.strip().splitlines()[-1] if r.stderr.strip() else 'git failed'})")
            return r.stdout
        f = self.path / rel
        if not f.is_file():
            raise InputError(f"--src {self.path}: no {rel}; give a checkout of inference-sim/training at {COMMIT[:12]} or its git directory")
        return f.read_text()

    def runs(self) -> list[str]:
        if self.git:
            r = subprocess.run(["git", "--git-dir", str(self.path), "ls-tree", "--name-only", f"{COMMIT}:default_args"],
                               capture_output=True, text=True)
            names = r.stdout.split() if r.returncode == 0 else []
        else:
            names = sorted(p.name for p in (self.path / "default_args").iterdir() if p.is_dir()) \
                if (self.path / "default_args").is_dir() else []
        if not names:
            raise InputError(f"--src {self.path}: no default_args/ runs; give a checkout of inference-sim/training or its git directory")
        return sorted(names)


def _ms(d: dict, keys=("mean", "p99")) -> dict:
    return {k: round(float(d[k]) * 1e3, 3) for k in keys}


def stage_stats(m: dict, where: str) -> dict:
    """One stage's client statistics (ms) and request counts."""
    try:
        s, lat = m["successes"], m["successes"]["latency"]
        return {"requests": int(s["count"]), "failures": int(m["failures"]["count"]),
                "achieved_rate": round(float(m["load_summary"]["achieved_rate"]), 4),
                "client": {"ttft_ms": _ms(lat["time_to_first_token"]), "e2el_ms": _ms(lat["request_latency"]),
                           "tpot_ms": _ms(lat["time_per_output_token"]), "itl_ms": _ms(lat["inter_token_latency"], ("mean",))},
                "prompt_len": {k: float(s["prompt_len"][k]) for k in PROMPT_STATS},
                "output_len": {k: float(s["output_len"][k]) for k in ("mean", "median", "min")}}
    except (KeyError, TypeError) as e:
        raise InputError(f"{where}: not an inference-perf lifecycle metrics file (no {e})") from None


def import_run(src: Source, name: str) -> tuple[dict | None, str]:
    """(the run's entry or None where it is left out, why)."""
    import yaml

    rel = f"default_args/{name}"
    exp = yaml.safe_load(src.read(f"{rel}/exp-config.yaml"))
    cfg = yaml.safe_load(src.read(f"{rel}/results/config.yaml"))
    if exp.get("model") not in MODELS:
        raise InputError(f"{rel}/exp-config.yaml: model {exp.get('model')!r} is not one of {sorted(MODELS)}")
    summ = json.loads(src.read(f"{rel}/results/summary_lifecycle_metrics.json"))
    ok, failed = int(summ["successes"]["count"]), int(summ["failures"]["count"])
    if failed / (ok + failed) > OVERLOAD:
        return None, f"{name}: {failed} of {ok + failed} requests failed ({failed / (ok + failed):.0%}; overloaded, left out as the source does)"
    data, load = cfg["data"], cfg["load"]
    if data.get("type") != "shared_prefix" or load.get("type") != "constant":
        raise InputError(f"{rel}/results/config.yaml: data {data.get('type')!r} / load {load.get('type')!r}; "
                         "only shared_prefix data at constant-rate stages are imported")
    sp = data["shared_prefix"]
    stages = []
    for i, st in enumerate(load["stages"]):
        m = stage_stats(json.loads(src.read(f"{rel}/results/stage_{i}_lifecycle_metrics.json")), f"{rel}/results/stage_{i}")
        stages.append({"rate": float(st["rate"]), "duration": float(st["duration"]), **m})
    model, tp = MODELS[exp["model"]], int(exp["tensor_parallelism"])
    profile = re.sub(r".*-tp\d+-", "", name)
    run = {"id": f"ip-h100-tp{tp}-{model}-{profile}", "source": SOURCE, "url": f"{BASE}/{name}", "gpu": "H100", "tp": tp,
           "model": model, "served_model": exp["model"], "vllm_version": "0.15.1",
           "engine": {"max_num_seqs": int(exp["max_num_seqs"]), "max_num_batched_tokens": int(exp["max_num_batched_tokens"]),
                      "max_model_len": int(exp["max_model_len"]), "gpu_memory_utilization": 0.9, "num_gpu_blocks": None,
                      "kv_cache_dtype": "auto", "async_scheduling": True, "prefix_caching": True, "enable_chunked_prefill": True,
                      "cpu_offload": "8 GiB OffloadingConnector (not modelled)",
                      "settings_from": f"{BASE.replace('/tree/', '/blob/')}/{name}/exp-config.yaml"},
           "workload": {"kind": "stages", "label": profile,
                        "client": CLIENT,
                        "num_groups": int(sp["num_groups"]), "num_prompts_per_group": int(sp["num_prompts_per_group"]),
                        "system_prompt_len": int(sp["system_prompt_len"]), "question_len": int(sp["question_len"]),
                        "output_len": int(sp["output_len"]), "seed": 0,
                        "stages": [{k: s[k] for k in ("rate", "duration", "prompt_len")} for s in stages]},
           "measured": {"stages": [{k: s[k] for k in ("requests", "failures", "achieved_rate", "client", "output_len")} for s in stages]},
           "measured_stats": "client (inference-perf, reportgen/base.py#L151-L166 and apis/completion.py#L47-L64 at 3b6f82a): "
                             "TTFT = first streamed message - send; request latency = last - send; TPOT = (last message - "
                             "first) / (messages - 1), messages counted, not tokens (here about 2 per token: it is half of "
                             "(E2E - TTFT) / (output_len - 1)); output_len re-tokenized from the text, not the engine's count"}
    return run, ""


CAMPAIGN = "inference-sim-campaign"
STUDY = "https://github.com/inference-sim/sim-to-real-accuracy-validation/blob"
# the study's per-stage actuals: the file PEER_FILES[0] names (its results_iter29/iter36 files hold the same actuals)
ACTUALS = PEER_FILES[0]
TEKTON = "https://github.com/inference-sim/tektonc-data-collection/blob"
SPEC_URL = f"{TEKTON}/5c7475b8bae936c24f2ab89708f63744ef90af1d/workloads.yaml"
CLIENT_PIN = f"{TEKTON}/5ced0c46c4d9d9983fe85cb04c71dc1e302eb1a0/tekton/tasks/install-inference-perf-blis.yaml"
# The campaign's workload specs (workloads.yaml at SPEC_URL, which its blis-campaign/generate.py reads into each run's
# profile): the shared_prefix lengths and the constant-rate stages (rate, duration). general-lite is general's data
# at lower rates. The four full workloads equal default_args' profile.yaml of the same name (checked on import).
SPECS = {"general": ((100, 447, 248), ((8.0, 600.0), (20.0, 600.0))),
         "codegen": ((100, 466, 247), ((5.0, 600.0), (10.0, 600.0))),
         "roleplay": ((150, 600, 251), ((6.0, 1200.0),)),
         "reasoning": ((100, 934, 1448), ((4.0, 1200.0),)),
         "general-lite": ((100, 447, 248), ((2.5, 600.0), (6.0, 600.0))),
         "reasoning-lite": ((100, 934, 1448), ((1.0, 1200.0),))}
DATA_OF = {"general-lite": "general", "reasoning-lite": "reasoning"}  # the workload whose data section a workload shares
CAMPAIGN_GPUS = {"H100": "H100", "A100-80GB": "A100-80GB", "L40S": "L40S"}
METRICS = {"e2e": "e2el_ms", "ttft": "ttft_ms"}
CAMPAIGN_ENTRY = {
    "what": "inference-sim/sim-to-real-accuracy-validation: per-stage client statistics (its CSVs' `actual`: mean, p90 and p99 of "
            "E2E and TTFT, ms) of real vLLM v0.15.1 servers of the same campaign as inference-sim/training default_args, for the "
            "runs that have no default_args folder: Llama-3.1-8B-Instruct on H100 at TP1 (three workloads; general at "
            "max_num_batched_tokens 1024 and 8192, with KV CPU offloading, at gpu_memory_utilization 0.95) and TP2, and "
            "Llama-3.1-8B, CodeLlama-34B and Llama-2-70B on A100-80GB and L40S and Mixtral-8x7B variants on H100, loaded by "
            "inference-perf. Taken (benchmarks/server_runs_inference_perf.py --campaign): per run the hardware, tp, "
            "gpu_mem_util, max_num_batched_tokens and cpu_offload its CSV rows state, per stage the actuals",
    "licence": "no licence file in inference-sim/sim-to-real-accuracy-validation nor in inference-sim/tektonc-data-collection: only "
               "statistics and stated settings are stored, nothing copied",
    "settings": "per run from the CSV's columns; max_num_seqs 128 and max_model_len 4096 as the campaign's generated values.yaml "
                "and default_args' exp-config.yaml state; prefix caching and chunked prefill on, asynchronous scheduling "
                "(vLLM v0.15.1's defaults, the design doc); no vllm.log published: num_gpu_blocks derived",
    "workload": f"the campaign's workloads.yaml ({SPEC_URL}; the same at 2a7cbcd4): stages and lengths per workload name; "
                "general-lite is general's data at 2.5 then 6 req/s (600 s each). The client is the one pinned for the "
                f"campaign (inference-perf e8e0aa99, {CLIENT_PIN}), the one default_args ran: its resolved config ignores the "
                "profile's aliases (10 groups x 10 prompts, single-turn), taken the same here",
    "actuals_url": f"{PEER_REPO}/{ACTUALS[0]}/{ACTUALS[1]}",
}


def study_runs(rows: list[dict]) -> dict:
    """{their run name: {"meta": one row's settings, "stages": {stage: {metric: actual}}}} from an error_records CSV
    (one simulator's rows: the actuals repeat per simulator)."""
    out = {}
    for x in rows:
        if x["simulator"] != "blis-roofline":
            continue
        name = x["experiment_folder"].rsplit("/", 1)[-1]
        e = out.setdefault(name, {"meta": x, "stages": {}})
        e["stages"].setdefault(int(x["stage_index"]), {})[x["metric_name"]] = float(x["actual"])
    return out


def check_same(name: str, stages: dict, run: dict, whole: dict | None) -> float:
    """The largest difference (ms) between the study's actuals of `name` and our stored statistics of `run` (mean and
    p99 of E2E and TTFT per stage; whole: the run's summary statistics, stage -1); ours are rounded to 0.001 ms."""
    worst = 0.0
    for i, m in stages.items():
        ours = run["measured"]["stages"][i]["client"] if i >= 0 else whole
        if ours is None:
            continue
        for metric, key in METRICS.items():
            for st in ("mean", "p99"):
                a = m.get(f"{metric}_{st}")
                if a is not None and st in ours.get(key, {}):
                    worst = max(worst, abs(ours[key][st] - a))
    return worst


def nominal_lengths(sys_len: int, q_len: int) -> dict:
    return {k: float(sys_len + q_len) for k in PROMPT_STATS}


def campaign_runs(rows: list[dict], ours: list[dict], wholes: dict | None = None) -> tuple[list[dict], list[str], dict]:
    """The study's runs that default_args does not hold, as `stages` runs: (runs, left out with why, {their name: our
    run id and the largest difference of the actuals, ms}) for the runs both hold (matched by stage 0's mean E2E; a
    match that differs by more than 0.001 ms, our rounding, in any statistic is refused). ours: the imported default_args runs; wholes:
    run id -> its summary statistics (stage -1)."""
    from sim.hardware.roofline import find_model

    study = study_runs(rows)
    by_e2e = {round(r["measured"]["stages"][0]["client"]["e2el_ms"]["mean"], 2): r for r in ours}
    same, runs, left = {}, [], []
    for name, e in sorted(study.items(), key=lambda kv: int(re.match(r"\d*", kv[0]).group() or 0)):
        m0 = e["stages"].get(0, {}).get("e2e_mean")
        mine = by_e2e.get(round(m0, 2)) if m0 is not None else None
        if mine is not None:
            worst = check_same(name, e["stages"], mine, (wholes or {}).get(mine["id"]))
            if worst > 0.001:
                raise InputError(f"--peers: {name}'s actuals differ from {mine['id']}'s by {worst:.4f} ms (same run by its mean E2E)")
            same[name] = {"run": mine["id"], "max_abs_diff_ms": worst}
            continue
        meta, label = e["meta"], e["meta"]["workload"]
        num = int(meta["exp_id"].split(".")[0])
        try:
            model = find_model(meta["model"])[0]
        except Exception:  # noqa: BLE001 - the zoo's lookup refuses an unknown name
            left.append(f"{name}: {meta['model']} is not in the model zoo")
            continue
        if label not in SPECS:
            left.append(f"{name}: no published spec for workload {label!r}")
            continue
        if meta["hardware"] not in CAMPAIGN_GPUS:
            left.append(f"{name}: GPU {meta['hardware']!r} is not in the zoo")
            continue
        (sys_len, q_len, out_len), stages = SPECS[label]
        if sorted(e["stages"]) != sorted({-1, *range(len(stages))}):
            raise InputError(f"--peers: {name} has stages {sorted(e['stages'])}, its workload {label} {len(stages)}")
        gpu, tp = CAMPAIGN_GPUS[meta["hardware"]], int(float(meta["tp"]))
        # prompt lengths: the client re-tokenizes decoded random ids; a default_args run of the same model and data reports
        # them, else the spec's token counts
        data = DATA_OF.get(label, label)
        twin = next((r for r in ours if r["model"] == model and r["workload"]["label"] == data), None)
        plen = twin["workload"]["stages"][0]["prompt_len"] if twin else nominal_lengths(sys_len, q_len)
        offload = meta["cpu_offload"] == "True"
        ms = lambda m, metric: {st: round(m[f"{metric}_{st}"], 3) for st in ("mean", "p90", "p99")}  # noqa: E731
        measured = [{"requests": int(rate * dur), "failures": None,
                     "client": {"ttft_ms": ms(e["stages"][i], "ttft"), "e2el_ms": ms(e["stages"][i], "e2e"),
                                "itl_ms": {"mean": round(e["stages"][i]["itl_mean"], 3)}}}
                    for i, (rate, dur) in enumerate(stages)]
        runs.append({
            "id": f"ip-{gpu.lower()}-tp{tp}-{model}-{label}-e{num}", "source": CAMPAIGN, "experiment": name,
            "url": f"{PEER_REPO}/{ACTUALS[0]}/{ACTUALS[1]}", "gpu": gpu, "tp": tp, "model": model, "served_model": meta["model"],
            "vllm_version": "0.15.1",
            "engine": {"max_num_seqs": 128, "max_num_batched_tokens": int(float(meta["max_num_batched_tokens"])), "max_model_len": 4096,
                       "gpu_memory_utilization": float(meta["gpu_mem_util"]), "num_gpu_blocks": None, "kv_cache_dtype": "auto",
                       "async_scheduling": True, "prefix_caching": True, "enable_chunked_prefill": True,
                       "cpu_offload": "8 GiB OffloadingConnector (not modelled)" if offload else None,
                       "settings_from": f"{PEER_REPO}/{ACTUALS[0]}/{ACTUALS[1]} (columns hardware, tp, gpu_mem_util, "
                                        "max_num_batched_tokens, cpu_offload); max_num_seqs, max_model_len as default_args"},
            "workload": {"kind": "stages", "label": label, "client": CLIENT, "num_groups": 10, "num_prompts_per_group": 10,
                         "system_prompt_len": sys_len, "question_len": q_len, "output_len": out_len, "seed": 0,
                         "spec_from": SPEC_URL + ("" if label in ("general-lite",) else " (equal to default_args' profile.yaml "
                                                  f"of {label})"),
                         "prompt_len_from": (f"the client's report of {twin['id']} (same model and data)" if twin else
                                             "the spec's token counts (system + question): no run of this tokenizer reports "
                                             "the client's re-tokenized lengths"),
                         "stages": [{"rate": rate, "duration": dur, "prompt_len": plen} for rate, dur in stages]},
            "measured": {"stages": measured},
            "measured_whole_run": {"ttft_ms": ms(e["stages"][-1], "ttft"), "e2el_ms": ms(e["stages"][-1], "e2e")},
            "measured_stats": "client (inference-perf), as the study publishes them (its `actual`); requests: rate x duration "
                              "sent (failures not published)"})
    return runs, left, same


def check_profiles(src: "Source", names: list[str]) -> list[str]:
    """default_args' profile.yaml (the profile the campaign generated) against SPECS, per workload name: the
    names checked; a difference is refused."""
    import yaml

    seen = set()
    for name in names:
        label = re.sub(r".*-tp\d+-", "", name)
        p = yaml.safe_load(src.read(f"default_args/{name}/profile.yaml"))
        sp = p["data"]["shared_prefix"]
        got = ((sp["system_prompt_len"], sp["question_len"], sp["output_len"]),
               tuple((float(x["rate"]), float(x["duration"])) for x in p["load"]["stages"]))
        if label not in SPECS or got != SPECS[label]:
            raise InputError(f"default_args/{name}/profile.yaml: {got} is not the campaign's {label} spec {SPECS.get(label)}")
        seen.add(label)
    return sorted(seen)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", required=True, help="a checkout of inference-sim/training or its git directory")
    ap.add_argument("--peers", help="the git directory of inference-sim/sim-to-real-accuracy-validation: add its published errors")
    ap.add_argument("--campaign", action="store_true",
                    help="also import the study's runs that default_args lacks, their actuals from its CSV (needs --peers)")
    ap.add_argument("--data", default=str(DATA), help="the runs file to update (default benchmarks/data/server_runs.json)")
    args = ap.parse_args(argv)
    try:
        if args.campaign and not args.peers:
            raise InputError("--campaign reads the study's CSV: give --peers GITDIR (inference-sim/sim-to-real-accuracy-validation)")
        src = Source(Path(args.src))
        out, left = [], []
        for name in src.runs():
            run, why = import_run(src, name)
            (out.append(run) if run else left.append(why))
        if args.peers:
            totals = {}
            for r in out:
                st = r["measured"]["stages"]
                by = {i: s["client"]["e2el_ms"]["mean"] for i, s in enumerate(st)}
                totals[r["id"]] = by
            summ = {r["id"]: json.loads(src.read(r["url"].split(f"{COMMIT}/", 1)[1] + "/results/summary_lifecycle_metrics.json"))
                    for r in out}
            for rid, s in summ.items():
                totals[rid][-1] = s["successes"]["latency"]["request_latency"]["mean"] * 1e3
            camp, camp_left, checked = [], [], ""
            if args.campaign:
                wholes = {rid: {"ttft_ms": _ms(s["successes"]["latency"]["time_to_first_token"]),
                                "e2el_ms": _ms(s["successes"]["latency"]["request_latency"])} for rid, s in summ.items()}
                camp, camp_left, same = campaign_runs(read_csv(Path(args.peers), *ACTUALS), out, wholes)
                labels = check_profiles(src, [r["url"].rsplit("/", 1)[1] for r in out])
                checked = (f"the study's actuals of {len(same)} runs default_args also holds ("
                           + ", ".join(f"{k} = {v['run']}" for k, v in same.items())
                           + f") equal our stored mean and p99 of E2E and TTFT per stage and whole run (largest "
                           f"difference {max([v['max_abs_diff_ms'] for v in same.values()] or [0]):.4f} ms, our rounding to "
                           "0.001 ms); default_args' "
                           f"profile.yaml of {', '.join(labels)} equals the campaign's spec of that name")
                for r in camp:
                    totals[r["id"]] = {i: s["client"]["e2el_ms"]["mean"] for i, s in enumerate(r["measured"]["stages"])}
                    totals[r["id"]][-1] = r["measured_whole_run"]["e2el_ms"]["mean"]
            found = peer_errors(Path(args.peers), totals)
            for r in out + camp:
                r["peers"] = found.get(r["id"], [])
        path = Path(args.data)
        try:
            d = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise InputError(f"--data {path}: cannot read the runs file ({e})") from None
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    campaign = bool(args.campaign)
    d["runs"] = [r for r in d["runs"] if r.get("source") != SOURCE and not (campaign and r.get("source") == CAMPAIGN)] + out
    if campaign:
        d["runs"] += camp
        d["sources"][CAMPAIGN] = {**CAMPAIGN_ENTRY, "checked": checked}
        d["not_judged"] = [x for x in d["not_judged"] if x["url"] != CAMPAIGN_ENTRY["actuals_url"]]
        if camp_left:
            d["not_judged"].append({"what": "inference-sim/sim-to-real-accuracy-validation: " + "; ".join(camp_left),
                                    "url": CAMPAIGN_ENTRY["actuals_url"],
                                    "why": "the model (or GPU, or workload spec) is not one the simulator has"})
    d["sources"][SOURCE] = SOURCE_ENTRY
    if args.peers:
        d["sources"][SOURCE]["peers"] = [f"{PEER_REPO}/{c}/{p}" for c, p in PEER_FILES]
    d["not_judged"] = [x for x in d["not_judged"] if "inference-sim/training" not in x["url"]] + [
        {"what": "inference-sim/training default_args: " + "; ".join(left), "url": BASE,
         "why": "overloaded (the source's own exclusion): most requests time out, no steady state to judge"}]
    path.write_text(compact(json.dumps(d, indent=1) + "\n"))  # the layout server_runs_ground_truth.py writes
    print(f"{len(out)} runs imported, {len(left)} left out: " + "; ".join(left))
    if campaign:
        print(f"{len(camp)} campaign runs imported, {len(camp_left)} left out: " + "; ".join(camp_left))
    return 0


if __name__ == "__main__":
    sys.exit(main())
