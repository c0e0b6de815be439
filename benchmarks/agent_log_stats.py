"""Tool times and turn structure measured in public agent logs, and the shipped workload specs.

    python benchmarks/agent_log_stats.py [--logs DIR] [--mini-swe DIR]
                                         [--write-docs [PAGE]] [--write-specs DIR]

Reads the logs in place (never copies them): AgentCgroup's Claude Code sessions (the
derived per-call CSVs of its three sets: GLM-4.7-Flash on a local llama-server, Claude 3.5
Haiku, Claude Haiku 4.5; GPL-2.0) and TraceLab's Claude Code and Codex sessions
(CC BY 4.0), from --logs (default $AGENTSIM_EXTERNAL_TRACES). Prints two
Markdown tables: per agent, sessions, LLM calls per session, new tokens per call by the
context before it, output tokens and the reasoning share; per agent and tool, the tool's
wall time (count, mean, p50, p90, p99, max in seconds). Only statistics leave the logs.

--write-docs puts them into docs/reference/traces.md (or PAGE) between `<!-- agent_log_stats: FLAGS -->`
and `<!-- end agent_log_stats -->`. --write-specs writes the measured specs
(traces/data/specs/): claude-code (AgentCgroup GLM-local main chains), codex (TraceLab's
one Codex session) and, with --mini-swe, mini-swe-agent, each with the context carry-over its
logs show (glm_carry, codex_carry, mini_swe_carry: how much of a call's reasoning the next
prompt's growth holds); where the next prompts drop the reasoning, a call's new input is
the growth beyond the prompt and the output less its reasoning.

--mini-swe DIR: the 500 mini-swe-agent trajectories of the SWE-bench bash-only run with
Gemini 3 Pro (MINI_SWE_REPO; `git clone` it and give the `trajs` folder): prints (and writes
under its own marker) their turns, tokens, reasoning share and command mix. They log
completions' `created` in whole seconds, not tool time, so the mini-swe-agent spec's tool
durations come from published statistics (MINI_SWE) applied to the measured command mix.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.docs_tables import DOCS, external_logs, write_block  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_LOGS = "$AGENTSIM_EXTERNAL_TRACES"  # a folder with agentcgroup/ and tracelab/ (their repositories' data)
PAGE = DOCS / "reference" / "traces.md"
AGENTCGROUP = {"repo": "https://github.com/eunomia-bpf/agentcgroup", "commit": "5af9e7b8f37a93513206c331c7ec0ff149e89f27",
               "licence": "GPL-2.0"}
TRACELAB = {"repo": "https://github.com/uw-syfi/TraceLab", "commit": "0b8a262ba69602869133b65972d51a388bde45e1",
            "licence": "CC BY 4.0 (data), Apache-2.0 (code); TraceLab (SyFI Lab, University of Washington)"}
SETS = {  # AgentCgroup set -> (agent label, output tokens usable)
    "all_images_local": ("Claude Code + GLM-4.7-Flash (local)", True),
    "all_images_haiku": ("Claude Code + Claude 3.5 Haiku", False),
    "batch_swebench_18tasks": ("Claude Code + Claude Haiku 4.5", False),
}
DROPS_REASONING = ("all_images_local",)  # sets whose next prompts drop the thinking (glm_carry); the others show none
CONTEXT_WINDOW = 128_000  # llama-server -c 128000 in AgentCgroup's GLM runs: no program's context exceeds it
CONTEXT_BANDS = (0, 32_000, 64_000)
MIN_TOOL_CALLS = 20  # tools with fewer calls are pooled as "other" in the tool table
# mini-swe-agent: no public trajectory reachable here logs tool time (the leaderboard's are on S3;
# the v1.x trajectories in git log only `created`, whole seconds, per completion). Published:
# AgentServeSim (arXiv 2606.09613) on SWE-bench leaderboard mini-swe-agent trajectories: pip
# mean 19.9 s, sed 0.12 s; gap between calls mean 0.87 s, sd 4.1 s. Calls per instance: 40.3
# (mini-swe-agent v1.15 + Gemini 3 Pro on SWE-bench Verified, bash-only leaderboard).
MINI_SWE = {"pip_mean": 19.9, "sed_mean": 0.12, "gap_mean": 0.87, "gap_sd": 4.1, "turns_mean": 40.3,
            "pip_share": 0.01, "sed_share": 0.10, "sigma_pip": 1.0, "sigma_sed": 0.6}
# The trajectories of that leaderboard run, committed to git by a fork of mini-swe-agent (MIT):
# turns, tokens, reasoning and the command mix are measured there; they log no tool time.
MINI_SWE_REPO = {"repo": "https://github.com/gruckion/mini-swe-agent", "commit": "d12a71affd95403b036b2bdbd827349b77bfffb9",
                 "licence": "MIT (the repository's LICENSE.md)",
                 "files": "swebench_results/20251118_gemini-3-pro-74pct/trajs/*/*.traj.json (500 trajectories, mini-swe-agent "
                          "1.15.0, google/gemini-3-pro-preview via OpenRouter)"}
MINI_SWE_MIN_CALLS = 100  # commands with fewer calls are the tool `other` in the spec


def agentcgroup_calls(logs: Path, name: str) -> pd.DataFrame:
    d = pd.read_csv(logs / "agentcgroup" / "derived" / f"{name}.calls.csv")
    return d[d["model"] != "<synthetic>"]


def tool_walls(d: pd.DataFrame) -> pd.DataFrame:
    """One row per tool call: (tool, seconds), from the `;`-separated columns."""
    rows = []
    for names, walls in zip(d["tool_names"].fillna(""), d["tool_wall_ms"].fillna("")):
        for n, w in zip(str(names).split(";"), str(walls).split(";")):
            if n and w:
                rows.append((n, float(w) / 1000))
    return pd.DataFrame(rows, columns=["tool", "s"])


def agentcgroup_trace(d: pd.DataFrame, estimate_output: bool, dropped_share: float = 0.0) -> pd.DataFrame:
    """The main chains as a trace: a call's tool is its slowest tool (what the agent waited
    for), its tool time the gap to the next call; new input = prompt growth beyond the
    previous prompt and the part of its output the next prompt carries (clipped at 0): all
    of it, less round(dropped_share x output) where the next prompts drop the reasoning
    (the GLM-local sessions: glm_carry)."""
    m = d[d["chain"] == "main"].sort_values(["session_id", "call_idx"])
    out = m["output_tokens_reported"].to_numpy(float)
    if estimate_output:
        out = np.maximum(np.rint(m["output_chars"].to_numpy(float) / 3.9), 1)
    prompt = m["input_tokens"].to_numpy(float)
    sid = m["session_id"].to_numpy()
    first = np.r_[True, sid[1:] != sid[:-1]]
    last = np.r_[sid[1:] != sid[:-1], True]
    carried = out - np.rint(dropped_share * out)
    prev = np.r_[0, prompt[:-1] + carried[:-1]]
    new = np.where(first, prompt, np.maximum(prompt - prev, 0))
    tools = []
    for names, walls in zip(m["tool_names"].fillna(""), m["tool_wall_ms"].fillna("")):
        pairs = [(float(w), n) for n, w in zip(str(names).split(";"), str(walls).split(";")) if n and w]
        tools.append(max(pairs)[1] if pairs else None)
    turn = np.concatenate([np.arange(k) for k in pd.Series(sid).groupby(sid, sort=False).size()])
    return pd.DataFrame({"program_id": sid, "turn": turn, "new_input_tokens": new.astype(np.int64),
                         "output_tokens": np.maximum(out, 1).astype(np.int64),
                         "tool": pd.Series(tools, dtype=object).where(~last, None).to_numpy(),
                         "tool_duration_s": np.where(last, np.nan, m["gap_to_next_ms"].to_numpy(float) / 1000)})


def thinking_share(logs: Path, name: str) -> tuple[float, int] | None:
    """Share of the main chains' generated characters (thinking + text + tool input JSON) that
    is thinking, over the set's raw sessions in the folder (8 per set; None: none there)."""
    files = sorted((logs / "agentcgroup" / "experiments" / name).glob("*/attempt_1/trace.jsonl"))
    if not files:
        return None
    think = other = 0
    for f in files:
        for line in f.read_text().splitlines():
            r = json.loads(line)
            if r.get("type") != "assistant" or r.get("isSidechain"):
                continue
            for b in r["message"].get("content") or []:
                if isinstance(b, dict) and b.get("type") == "thinking":
                    think += len(b.get("thinking", ""))
                elif isinstance(b, dict) and b.get("type") == "text":
                    other += len(b.get("text", ""))
                elif isinstance(b, dict) and b.get("type") == "tool_use":
                    other += len(json.dumps(b.get("input", {})))
    return think / (think + other), len(files)


GLM_CHARS_PER_TOKEN = 3.9  # the GLM-local set's median characters per completion token (its logged counts)


CARRY_FIT_CHARS = 300  # _growth_fit: pairs with fewer new characters than this between the calls


def _growth_fit(rows) -> dict:
    """Least squares of the next prompt's growth over a call's prompt on [1, the call's output
    less its reasoning, its reasoning, the characters that arrive before the next call], over
    the pairs with under CARRY_FIT_CHARS new characters (a long tool result's tokens per
    character vary by content and swamp the reasoning: mini-swe-agent's all-pairs fit gives
    0.96, its short-input fit 0.02): a reasoning coefficient near 1 means the next prompt holds
    the reasoning, near 0 that it drops it (the visible part's near 1 checks the fit)."""
    a = np.asarray(rows, float)
    a = a[a[:, 3] < CARRY_FIT_CHARS]
    growth, out, reason, chars = a.T
    x = np.c_[np.ones(len(a)), out - reason, reason, chars]
    c = np.linalg.lstsq(x, growth, rcond=None)[0]
    return {"pairs": len(a), "reasoning_pairs": int((reason > 0).sum()), "visible": round(float(c[1]), 2),
            "reasoning": round(float(c[2]), 2)}


def glm_carry(logs: Path) -> dict:
    """What the raw GLM-local sessions' main chains show of carry-over: _growth_fit over
    consecutive calls (thinking tokens = thinking characters / GLM_CHARS_PER_TOKEN; the
    characters of the tool results and user text between), and the share of calls that think."""
    files = sorted((logs / "agentcgroup" / "experiments" / "all_images_local").glob("*/attempt_1/trace.jsonl"))
    rows, thinking = [], []
    for f in files:
        calls, chars = [], 0
        for line in f.read_text().splitlines():
            r = json.loads(line)
            if r.get("isSidechain") or r.get("type") not in ("user", "assistant"):
                continue
            m = r["message"]
            if r["type"] == "user":
                for b in [m["content"]] if isinstance(m.get("content"), str) else m.get("content") or []:
                    c = b if isinstance(b, str) else b.get("content") if b.get("type") == "tool_result" else b.get("text", "")
                    chars += len(c if isinstance(c, str) else json.dumps(c))
                continue
            if m.get("model") == "<synthetic>":
                continue
            if not calls or calls[-1]["id"] != m["id"]:
                u = m["usage"]
                calls.append({"id": m["id"], "prompt": u["input_tokens"] + u.get("cache_creation_input_tokens", 0)
                              + u.get("cache_read_input_tokens", 0), "out": u["output_tokens"], "think": 0, "before": chars})
                chars = 0
            for b in m.get("content") or []:
                if isinstance(b, dict) and b.get("type") == "thinking":
                    calls[-1]["think"] += len(b.get("thinking", ""))
        thinking += [c["think"] > 0 for c in calls]
        rows += [(b["prompt"] - a["prompt"], a["out"], a["think"] / GLM_CHARS_PER_TOKEN, b["before"]) for a, b in zip(calls, calls[1:])]
    return {**_growth_fit(rows), "sessions": len(files), "thinking_calls": round(float(np.mean(thinking)), 4)}


def mini_swe_carry(folder: Path) -> dict:
    """_growth_fit over the trajectories' consecutive completions (usage of each; the
    characters of the messages between), and the share of completions that reason."""
    rows, reasoning = [], []
    for f in sorted(folder.rglob("*.traj.json")):
        chars, prev = 0, None
        for m in json.loads(f.read_text())["messages"]:
            if m.get("role") != "assistant":
                chars += len(m.get("content") or "")
                continue
            u = m["extra"]["response"]["usage"]
            cur = (u["prompt_tokens"], u["completion_tokens"], (u.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0)
            reasoning.append(cur[2] > 0)
            if prev is not None:
                rows.append((cur[0] - prev[0], prev[1], prev[2], chars))
            prev, chars = cur, 0
    return {**_growth_fit(rows), "reasoning_calls": round(float(np.mean(reasoning)), 4)}


def codex_carry(rounds: list[dict]) -> dict:
    """The Codex session's prompt growth at its tool gaps and at its user turns: at a tool gap
    the next prompt grows by the call's output (reasoning kept) or output less reasoning
    (dropped), plus the tool results; what remains (median, tokens) is the template's
    overhead under each reading. At a user turn, the growth less the call's output, against
    the reasoning of the calls since the previous user turn."""
    tool, user = [], []
    since = 0
    for a, b in zip(rounds, rounds[1:]):
        r = a.get("reasoning_output_tokens") or 0
        since = r if a["current_user_message_count"] else since + r
        grow = b["input_tokens_total"] - a["input_tokens_total"]
        if b["current_user_message_count"]:
            user.append((grow - a["output_tokens"], since))
        else:
            rest = grow - a["output_tokens"] - b["current_input_chars"] / 4
            tool.append((rest, rest + r))
    t = np.asarray(tool, float)
    return {"tool_gaps": len(t), "kept_overhead": round(float(np.median(t[:, 0]))), "dropped_overhead": round(float(np.median(t[:, 1]))),
            "user_turns": [(int(g), int(s)) for g, s in user]}


def tracelab_rounds(logs: Path) -> list[dict]:
    path = logs / "tracelab" / "example_sessions" / "derived" / "round_trace.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def mini_swe_trace(folder: Path) -> pd.DataFrame:
    """The trajectories as a trace: an assistant message is a call (usage from its raw
    response); its tool is the command it runs (traces.toolparse); new input = prompt growth
    beyond the previous prompt and output less its reasoning (dropped: mini_swe_carry); tool_duration_s = the interval to the next
    completion's `created` (whole seconds, LLM time included): a placeholder, never shipped."""
    from traces.toolparse import parse_tool

    rows = []
    files = sorted(folder.rglob("*.traj.json"))
    if not files:
        raise SystemExit(f"error: --mini-swe {str(folder)!r}: no *.traj.json under it")
    for f in files:
        calls = [m for m in json.loads(f.read_text())["messages"] if m.get("role") == "assistant"]
        prev = 0.0
        for i, c in enumerate(calls):
            r = c["extra"]["response"]
            u = r["usage"]
            prompt, out = float(u["prompt_tokens"]), float(u["completion_tokens"])
            reason = float((u.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0)
            last = i == len(calls) - 1
            rows.append({"program_id": f.name.removesuffix(".traj.json"), "turn": i,
                         "new_input_tokens": int(prompt if i == 0 else max(prompt - prev, 0)), "output_tokens": int(max(out, 1)),
                         "tool": None if last else parse_tool(c.get("content")),
                         "tool_duration_s": np.nan if last else float(calls[i + 1]["extra"]["response"]["created"] - r["created"]),
                         "reasoning_tokens": reason})
            prev = prompt + out - reason  # the next prompt drops the reasoning (mini_swe_carry)
    return pd.DataFrame(rows)


def mini_swe_stats(folder: Path) -> str:
    t = mini_swe_trace(folder)
    ctx, new = _context_new(t)
    n = t.groupby("program_id").size()
    share = t["reasoning_tokens"].sum() / t["output_tokens"].sum()
    row = session_row("mini-swe-agent 1.15 + Gemini 3 Pro", len(n), n, ctx, new, t["output_tokens"].to_numpy(),
                      f"{share:.1%} of output")
    tools = t[t["tool_duration_s"].notna()]
    counts = tools["tool"].fillna("(none)").value_counts()
    trows = [f"| {k} | {v:,} | {v / len(tools):.1%} | {_s(tools.loc[tools['tool'].fillna('(none)') == k, 'tool_duration_s'].median())} |"
             for k, v in counts.head(12).items()]
    return ("Table: mini-swe-agent 1.15 + Gemini 3 Pro on SWE-bench Verified (bash-only leaderboard, 500 trajectories, "
            "gruckion/mini-swe-agent @ d12a71a, MIT). Columns as above.\n\n"
            "| agent | sessions | calls | calls per session mean / p50 / max | new tokens per call "
            f"({' / '.join(f'{lo // 1000}K+' for lo in CONTEXT_BANDS)}) | output tokens | reasoning |\n|---|---|---|---|---|---|---|\n"
            + row + "\n\nTable: its commands (first word of the bash block; `(none)`: none parsed): calls, share, and the median "
            "interval to the next completion in whole seconds, which holds the next call's LLM time: not a tool time.\n\n"
            "| command | calls | share | interval p50 (s) |\n|---|---|---|---|\n" + "\n".join(trows))


def _q(x, p):
    return float(np.quantile(x, p)) if len(x) else float("nan")


def _s(v: float) -> str:
    if not np.isfinite(v):
        return "-"
    return f"{v:,.0f}" if v >= 100 else f"{v:.1f}" if v >= 1 else f"{v:.2f}" if v >= 0.01 else f"{v:.3f}"


def _t(v: float) -> str:
    return "-" if not np.isfinite(v) else f"{v:,.0f}"


def session_row(label, sessions, calls_per, ctx_before, new, out, reasoning) -> str:
    cp = np.asarray(calls_per, float)
    bands = []
    for i, lo in enumerate(CONTEXT_BANDS):
        hi = CONTEXT_BANDS[i + 1] if i + 1 < len(CONTEXT_BANDS) else np.inf
        sel = (ctx_before >= lo) & (ctx_before < hi)
        bands.append(_t(np.median(new[sel])) if sel.sum() >= 5 else "-")
    o = "placeholder counts" if out is None else f"{_t(np.mean(out))} / {_t(np.median(out))}"
    return (f"| {label} | {sessions} | {cp.sum():,.0f} | {cp.mean():.1f} / {np.median(cp):.0f} / {cp.max():.0f} | "
            f"{' / '.join(bands)} | {o} | {reasoning} |")


def _context_new(t: pd.DataFrame):
    later = t["turn"].to_numpy() > 0
    tot = (t["new_input_tokens"] + t["output_tokens"]).to_numpy(float)
    before = t.assign(x=tot).groupby("program_id", sort=False)["x"].cumsum().to_numpy() - tot
    return before[later], t["new_input_tokens"].to_numpy(float)[later]


def stats(logs: Path) -> str:
    srows, trows = [], []
    for name, (label, real_out) in SETS.items():
        d = agentcgroup_calls(logs, name)
        th = thinking_share(logs, name)
        t = agentcgroup_trace(d, False, th[0] if th is not None and name in DROPS_REASONING else 0.0)
        ctx, new = _context_new(t)
        n = t.groupby("program_id").size()
        srows.append(session_row(label, len(n), n, ctx, new, t["output_tokens"].to_numpy() if real_out else None,
                                 "not logged" if th is None else f"{th[0]:.0%} of output chars ({th[1]} raw sessions)"))
        trows += tool_rows(label, tool_walls(d[d["chain"] == "main"]))
    rounds = tracelab_rounds(logs)
    for prov, label in (("claude", "Claude Code + Opus (TraceLab)"), ("codex", "Codex CLI + gpt-5.4 (TraceLab)")):
        r = [x for x in rounds if x["provider"] == prov]
        sessions = pd.Series([x["session_id"] for x in r]).value_counts()
        inp = np.array([x["input_tokens_total"] for x in r], float)
        out = np.array([x["output_tokens"] for x in r], float)
        rs = [x.get("reasoning_output_tokens") for x in r]
        reasoning = (f"{sum(v for v in rs if v) / out.sum():.0%} of output" if any(rs) else "not logged")
        ctx_before = inp[1:]
        new = np.maximum(inp[1:] - inp[:-1] - out[:-1], 0)
        srows.append(session_row(label, len(sessions), sessions, ctx_before, new, out, reasoning))
        walls = pd.DataFrame([(tl["tool_name"], tl["tool_wall_latency_ms"] / 1000) for x in r for tl in x.get("tools", [])
                              if tl.get("tool_wall_latency_ms") is not None], columns=["tool", "s"])
        trows += tool_rows(label, walls)
    band = " / ".join(f"{lo // 1000}K+" for lo in CONTEXT_BANDS)
    head = ("Table: agent sessions (main chains; TraceLab: whole sessions). New tokens per call: median by the context "
            f"before the call ({band}); output tokens: mean / median.\n\n"
            f"| agent | sessions | calls | calls per session mean / p50 / max | new tokens per call ({band}) | "
            "output tokens | reasoning |\n|---|---|---|---|---|---|---|\n" + "\n".join(srows))
    tools = ("Table: tool wall time in seconds per agent and tool (main chains; tools with fewer than "
             f"{MIN_TOOL_CALLS} calls pooled as `other`; TraceLab: every tool).\n\n"
             "| agent | tool | calls | mean | p50 | p90 | p99 | max |\n|---|---|---|---|---|---|---|---|\n" + "\n".join(trows))
    return head + "\n\n" + tools


def tool_rows(label: str, w: pd.DataFrame) -> list[str]:
    if w.empty:
        return []
    min_calls = MIN_TOOL_CALLS if len(w) >= 200 else 1
    counts = w["tool"].value_counts()
    keep = list(counts[counts >= min_calls].index)
    groups = [(k, w.loc[w["tool"] == k, "s"].to_numpy()) for k in keep]
    rest = w.loc[~w["tool"].isin(keep), "s"].to_numpy()
    if len(rest):
        groups.append(("other", rest))
    groups.append(("**all**", w["s"].to_numpy()))
    return [f"| {label} | {k} | {len(x):,} | {_s(x.mean())} | {_s(_q(x, .5))} | {_s(_q(x, .9))} | {_s(_q(x, .99))} | "
            f"{_s(x.max())} |" for k, x in groups]


# --- shipped specs -------------------------------------------------------------------------

def claude_code_spec(logs: Path):
    d = agentcgroup_calls(logs, "all_images_local")
    t = agentcgroup_trace(d, False, thinking_share(logs, "all_images_local")[0])
    first = t["turn"] == 0
    # the GLM sessions log no cache use: the shared prefix is the Haiku sessions' cached share of the
    # first prompt (Claude Code's system prompt and tool schemas) applied to the GLM first prompts
    h = agentcgroup_calls(logs, "all_images_haiku")
    hm = h[(h["chain"] == "main")].sort_values(["session_id", "call_idx"]).groupby("session_id").head(1)
    share = float(np.median(hm["cache_read_tokens"].dropna()) / np.median(hm["input_tokens"]))
    shared = int(share * np.median(t.loc[first, "new_input_tokens"]))
    t["shared_prefix_tokens"] = np.minimum(shared, t.loc[first].set_index("program_id")["new_input_tokens"]
                                           .reindex(t["program_id"]).to_numpy())
    prov = {"sources": [{"name": "AgentCgroup all_images_local (Claude Code 2.0.0 + GLM-4.7-Flash Q4_K_M on llama-server)",
                         "url": AGENTCGROUP["repo"], "commit": AGENTCGROUP["commit"], "licence": AGENTCGROUP["licence"],
                         "files": "experiments/all_images_local/*/attempt_1/trace.jsonl (111 sessions), read through the "
                                  "per-call table derived from them (agentcgroup/derived/all_images_local.calls.csv of the logs folder)"}],
            "derived": ("statistics only (quantiles, fitted tails): main chains; a call's tool = its slowest tool, tool time "
                        "= gap to the next call (parallel tools overlap); new input = prompt growth beyond the previous prompt "
                        f"and the output less its reasoning share (the next prompts drop it: `carry`); shared prefix = {shared} tokens (the Haiku set's cached share {share:.3f} of the first "
                        f"prompt times the GLM median first prompt); max_context {CONTEXT_WINDOW} (the llama-server's -c). Written by benchmarks/agent_log_stats.py --write-specs"),
            "counts": {}, "notes": "sessions ran one at a time; tool time includes container effects (pip, tests, 120 s timeouts)"}
    return t, prov


def codex_trace(logs: Path):
    from traces.importers import import_trace

    df, _ = import_trace("tracelab", [str(logs / "tracelab")])
    return df[df["program_id"].str.startswith("codex:")].reset_index(drop=True)


def lognormal_dist(rng, mean, sigma, size=20_000):
    mu = np.log(mean) - sigma ** 2 / 2
    return np.exp(mu + sigma * rng.standard_normal(size))


def mini_swe_spec(folder: Path):
    """Turns, tokens and the command mix measured in the trajectories; tool durations from
    published statistics (MINI_SWE): pip and sed lognormal with the published means, every
    other command one lognormal solved so that all tool calls have the published mean
    0.87 s and sd 4.1 s at the measured shares of pip and sed."""
    from traces import fit
    from traces.schema import columns

    m = MINI_SWE
    t = mini_swe_trace(folder)
    counts = t.loc[t["tool_duration_s"].notna(), "tool"].value_counts()
    keep = set(counts[counts >= MINI_SWE_MIN_CALLS].index) | {"pip", "sed"}
    t["tool"] = [x if x in keep or x is None else "other" for x in t["tool"]]
    cols = columns(t.drop(columns="reasoning_tokens"))
    n_tool = int(np.isfinite(cols["tool_duration_s"]).sum())
    names = [x for x, d in zip(cols["tool"], cols["tool_duration_s"]) if np.isfinite(d)]
    ps, ss = names.count("pip") / n_tool, names.count("sed") / n_tool
    ex2_pip = m["pip_mean"] ** 2 * np.exp(m["sigma_pip"] ** 2)
    ex2_sed = m["sed_mean"] ** 2 * np.exp(m["sigma_sed"] ** 2)
    mean_o = (m["gap_mean"] - ps * m["pip_mean"] - ss * m["sed_mean"]) / (1 - ps - ss)
    ex2_o = (m["gap_sd"] ** 2 + m["gap_mean"] ** 2 - ps * ex2_pip - ss * ex2_sed) / (1 - ps - ss)
    sigma_o = float(np.sqrt(np.log(ex2_o / mean_o ** 2)))
    rshare = float(t["reasoning_tokens"].sum() / t["output_tokens"].sum())
    prov = {"sources": [
        {"name": "mini-swe-agent 1.15.0 + Gemini 3 Pro trajectories, SWE-bench Verified bash-only run (500)",
         "url": MINI_SWE_REPO["repo"], "commit": MINI_SWE_REPO["commit"], "licence": MINI_SWE_REPO["licence"],
         "files": MINI_SWE_REPO["files"]},
        {"name": "AgentServeSim (arXiv 2606.09613): tool times of SWE-bench leaderboard mini-swe-agent trajectories",
         "url": "https://arxiv.org/abs/2606.09613", "licence": "published statistics (facts)"}],
        "derived": (f"turns, tokens (usage of each completion), reasoning share and command mix (first word of the bash block; "
                    f"commands under {MINI_SWE_MIN_CALLS} calls are `other`) MEASURED in the trajectories; tool durations NOT "
                    f"measured (the trajectories log no tool time): published pip mean {m['pip_mean']} s (lognormal sigma "
                    f"{m['sigma_pip']}), sed mean {m['sed_mean']} s (sigma {m['sigma_sed']}); every other command one "
                    f"lognormal mean {mean_o:.3f} s sigma {sigma_o:.3f}, solved so all tool calls have the published mean "
                    f"{m['gap_mean']} s and sd {m['gap_sd']} s at the measured shares pip {ps:.2%}, sed {ss:.2%}. Written by "
                    "benchmarks/agent_log_stats.py --mini-swe DIR --write-specs"),
        "counts": {"programs": int((cols["turn"] == 0).sum()), "calls": len(cols), "tool_calls": n_tool},
        "notes": "tool durations: published-statistics fallback; sigmas of pip and sed assumed"}
    spec = fit.fit_columns(cols, "mini-swe-agent", prov, reasoning_share=round(rshare, 4), carry=mini_swe_default(folder),
                           reasoning_calls=mini_swe_carry(folder)["reasoning_calls"])
    rng = np.random.default_rng(0)
    other = fit.fit_dist(lognormal_dist(rng, mean_o, sigma_o))
    spec.tools = {k: (fit.fit_dist(lognormal_dist(rng, m["pip_mean"], m["sigma_pip"])) if k == "pip" else
                      fit.fit_dist(lognormal_dist(rng, m["sed_mean"], m["sigma_sed"])) if k == "sed" else other)
                  for k in spec.tools}
    # the logged intervals hold LLM time, so how a program's tool times differ is not measured either
    spec.between = spec.between.without("tool") if spec.between is not None else None
    return spec


# --- carry defaults: what each shipped spec's logs show (glm_carry, codex_carry, mini_swe_carry) --------

ANTHROPIC_THINKING = "https://platform.claude.com/docs/build-with-claude/thinking-tool-workflows"
LLAMA_CPP_THINKING = "https://github.com/ggml-org/llama.cpp/pull/20120"
OPENAI_REASONING = "https://cookbook.openai.com/examples/responses_api/reasoning_items"
HARMONY_DROP = "https://docs.vllm.ai/en/latest/api/vllm/entrypoints/openai/parser/harmony_utils/"
MINI_SWE_CLIENT = ("https://github.com/gruckion/mini-swe-agent/blob/d12a71affd95403b036b2bdbd827349b77bfffb9/"
                   "src/minisweagent/models/openrouter_model.py")


def claude_code_default(gc: dict):
    from traces.fit import Carry

    return Carry(mode="reasoning-dropped", basis="logs", sources=[ANTHROPIC_THINKING, LLAMA_CPP_THINKING], evidence=(
        f"the next prompt holds {gc['reasoning']:.2f} of a call's thinking tokens and {gc['visible']:.2f} of the rest "
        f"(least squares of prompt growth over {gc['pairs']} consecutive main-chain calls of the {gc['sessions']} raw GLM "
        f"sessions with under {CARRY_FIT_CHARS} new characters between; agent_log_stats.glm_carry): dropped. Claude Code "
        "keeps the thinking blocks in its transcript (the Messages API wants them back within a tool loop); llama-server's /v1/messages "
        "dropped them when converting the request until llama.cpp PR 20120 (2026-03-05), after these runs"))


def codex_default(rounds: list[dict]):
    from traces.fit import Carry

    c = codex_carry(rounds)
    grow, since = (" and ".join(str(u[i]) for u in c["user_turns"]) for i in (0, 1))
    return Carry(mode="cached", basis="logs", sources=[OPENAI_REASONING, HARMONY_DROP], evidence=(
        f"at its {c['tool_gaps']} tool gaps the prompt grows by the output and the results (at 4 characters a token) "
        f"plus {c['kept_overhead']} tokens (median) if the reasoning is kept, {c['dropped_overhead']} if dropped: kept "
        "within the tool loop (the Responses API passes reasoning items back); at the user's turns the growth less the "
        f"output is {grow} tokens against {since} tokens of reasoning since the previous user turn: all of it dropped then, which no carry mode "
        "models (the spec's 2 user gaps are tool `(unknown)`, carried as cached); agent_log_stats.codex_carry"))


def mini_swe_default(folder: Path):
    from traces.fit import Carry

    c = mini_swe_carry(folder)
    return Carry(mode="reasoning-dropped", basis="logs", sources=[MINI_SWE_CLIENT], evidence=(
        f"the next prompt holds {c['reasoning']:.2f} of a completion's reasoning tokens and {c['visible']:.2f} of the "
        f"rest (least squares of prompt growth over {c['pairs']} pairs of consecutive completions with under "
        f"{CARRY_FIT_CHARS} new characters between, {c['reasoning_pairs']} of them reasoning; agent_log_stats.mini_swe_carry): dropped, as mini-swe-agent sends "
        f"back each message's role and content only; {c['reasoning_calls']:.1%} of completions reason"))


def write_specs(logs: Path, out: Path, mini: Path | None = None) -> list[Path]:
    from traces import fit
    from traces.schema import columns

    out.mkdir(parents=True, exist_ok=True)
    t, prov = claude_code_spec(logs)
    cols = columns(t)
    prov["counts"] = {"programs": int((cols["turn"] == 0).sum()), "calls": len(cols),
                      "tool_calls": int(np.isfinite(cols["tool_duration_s"]).sum())}
    share, raw = thinking_share(logs, "all_images_local")
    prov["derived"] += (f"; reasoning_share {share:.3f} = thinking characters / generated characters of the {raw} raw "
                        "GLM sessions in the logs folder (the per-call table has no thinking column)")
    gc = glm_carry(logs)
    cc = fit.fit_columns(cols, "claude-code", prov, max_context=CONTEXT_WINDOW, reasoning_share=round(share, 4),
                         reasoning_calls=gc["thinking_calls"] if gc["thinking_calls"] < 1 else None, carry=claude_code_default(gc))
    cx = codex_trace(logs)
    rounds = [x for x in tracelab_rounds(logs) if x["provider"] == "codex"]
    rshare = sum(x.get("reasoning_output_tokens") or 0 for x in rounds) / sum(x["output_tokens"] for x in rounds)
    ccols = columns(cx)
    codex = fit.fit_columns(ccols, "codex", {
        "sources": [{"name": "TraceLab example_sessions/derived/round_trace.jsonl, the Codex CLI session (gpt-5.4)",
                     "url": TRACELAB["repo"], "commit": TRACELAB["commit"], "licence": TRACELAB["licence"]}],
        "derived": ("ONE session of 9 LLM calls (8 tool gaps): every marginal is that session's empirical values, no "
                    "tail; turns are always 9. Read by `sim trace import tracelab`; gaps with no tool (the user's turns, "
                    "2 of 8) are tool `(unknown)`. reasoning_share = logged reasoning / output tokens"),
        "counts": {"programs": 1, "calls": len(ccols), "tool_calls": int(np.isfinite(ccols["tool_duration_s"]).sum())},
        "notes": "far too few sessions for distributions: a shape, not a measurement of Codex at large"},
        reasoning_share=round(rshare, 4), carry=codex_default(rounds),
        reasoning_calls=round(float(np.mean([bool(x.get("reasoning_output_tokens")) for x in rounds])), 4))
    specs = [cc, codex] + ([mini_swe_spec(mini)] if mini is not None else [])
    return [fit.write_spec(s, out / f"{s.name}.json") for s in specs]


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--logs", default=DEFAULT_LOGS, help=f"the folder holding agentcgroup/ and tracelab/ (default {DEFAULT_LOGS})")
    ap.add_argument("--write-docs", nargs="?", const=str(PAGE), default=None, metavar="PAGE")
    ap.add_argument("--mini-swe", default=None, metavar="DIR", help="the mini-swe-agent trajectories (MINI_SWE_REPO)")
    ap.add_argument("--write-specs", default=None, metavar="DIR", help="write the measured specs there")
    a = ap.parse_args(argv)
    logs = external_logs(a.logs)
    if not logs.is_dir():
        raise SystemExit(f"error: --logs {a.logs!r}: no such folder; it holds the AgentCgroup and TraceLab logs")
    mini = Path(a.mini_swe) if a.mini_swe else None
    if mini is not None and not mini.is_dir():
        raise SystemExit(f"error: --mini-swe {a.mini_swe!r}: no such folder")
    text = mini_swe_stats(mini) if mini is not None else stats(logs)
    print(text)
    if a.write_docs:
        write_block(a.write_docs, "agent_log_stats", f"--logs {a.logs}" + (f" --mini-swe {a.mini_swe}" if mini else ""), text)
    if a.write_specs:
        for p in write_specs(logs, Path(a.write_specs), mini):
            print(f"wrote {p}")
    return text


if __name__ == "__main__":
    main()
