"""Statistics of real OpenHands (CodeActAgent) runs, derived from the public data of Bouzenia &
Pradel, "Understanding Software Engineering Agents: A Study of Thought-Action-Result
Trajectories" (arXiv 2506.18824): github.com/sola-st/llm-agents-study, MIT licence, commit
e84f66f (40 OpenHands trajectories on SWE-bench Verified instances, 10 resolved).

The figures printed here are the ones cited in traces/generate.py's `openhands` spec. Nothing of
that repository is copied into this one; point this script at a clone (or at the bare git
directory that `git clone --mirror` writes) to recompute them:

    python -m traces.openhands_stats PATH_TO/llm-agents-study

What it reads:
  * rq1/codeact_iterations.csv: LLM iterations (agent turns) per trajectory;
  * rq1/codeact_token_usage.csv: total input tokens (summed over the calls, i.e. what an engine
    without prefix caching prefills) and total output tokens per trajectory;
  * trajectories/openhands/parsed/actions_actions/*.txt: each iteration's tool call (function
    name and arguments); bash commands are classified by their first word as traces/generate.py's
    SWE-bench tools are;
  * trajectories/openhands/parsed/results_actions/*.txt: each iteration's tool result (text);
    its size in tokens is estimated as characters / 4 (no tokenizer is named in the data).

The data has no timestamps: tool durations of OpenHands runs are not in it.
"""
from __future__ import annotations

import ast
import csv
import io
import json
import re
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

CHARS_PER_TOKEN = 4.0


class _Repo:
    """Files of a work tree or a bare git directory, by path."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.bare = not (self.root / "rq1").is_dir()

    def read(self, path: str) -> str:
        if not self.bare:
            return (self.root / path).read_text(encoding="utf-8", errors="replace")
        return subprocess.run(["git", "--git-dir", str(self.root), "show", f"HEAD:{path}"], check=True,
                              capture_output=True).stdout.decode("utf-8", errors="replace")

    def ls(self, folder: str) -> list[str]:
        if not self.bare:
            return sorted(str(p.relative_to(self.root)) for p in (self.root / folder).glob("*.txt"))
        out = subprocess.run(["git", "--git-dir", str(self.root), "ls-tree", "--name-only", f"HEAD:{folder}"],
                             check=True, capture_output=True, text=True).stdout.split()
        return sorted(f"{folder}/{n}" for n in out if n.endswith(".txt"))


def _iterations(text: str, word: str) -> dict[int, str]:
    """{iteration: text} of a parsed file whose entries start `<word> at iteration N: `."""
    parts = re.split(rf"^{word} at iteration (\d+): ", text, flags=re.M)
    return {int(parts[i]): parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def tool_of(action: str) -> str:
    """The tool kind of one parsed action: bash commands by first word (after `cd DIR &&`),
    editor calls by their sub-command, other functions by name."""
    try:
        call = ast.literal_eval(action.strip())
        name, args = call.get("name", "none"), json.loads(call.get("arguments") or "{}")
    except (ValueError, SyntaxError, json.JSONDecodeError, AttributeError):
        return "unparsed"
    if name == "execute_bash":
        cmd = str(args.get("command", "")).strip()
        cmd = re.sub(r"^cd\s+\S+\s*(&&|;)\s*", "", cmd)
        first = cmd.split()[0] if cmd.split() else ""
        first = Path(first).name
        if first.startswith("python"):
            return "pytest" if re.search(r"\bpytest\b|runtests|-m\s+unittest", cmd) else "python"
        return first if first in {"cat", "ls", "grep", "find", "sed", "pytest", "git", "pip", "head", "cd"} else "other_bash"
    if name == "str_replace_editor":
        return "editor_" + str(args.get("command", "?"))
    return name


def stats(root: str | Path) -> dict:
    repo = _Repo(root)
    it = list(csv.DictReader(io.StringIO(repo.read("rq1/codeact_iterations.csv"))))
    tok = list(csv.DictReader(io.StringIO(repo.read("rq1/codeact_token_usage.csv"))))
    n = np.array([int(r["n_iterations"]) for r in it])
    t_in = np.array([int(r["total_input_tokens"]) for r in tok])
    t_out = np.array([int(r["total_output_tokens"]) for r in tok])
    n_by_id = {r["instance_id"]: int(r["n_iterations"]) for r in it}
    out_per_call = np.array([int(r["total_output_tokens"]) / n_by_id[r["instance_id"]] for r in tok])

    tin_by_id = {r["instance_id"]: int(r["total_input_tokens"]) for r in tok}
    tout_by_id = {r["instance_id"]: int(r["total_output_tokens"]) for r in tok}
    tools: Counter = Counter()
    result_tokens: dict[str, list[float]] = defaultdict(list)
    first_prompt = []  # implied turn-0 prompt: total input minus the growth the results and outputs explain
    for path in repo.ls("trajectories/openhands/parsed/actions_actions"):
        acts = _iterations(repo.read(path), "Action")
        res = _iterations(repo.read(path.replace("actions_actions", "results_actions")), "Result")
        grow = []
        for i, a in sorted(acts.items()):
            kind = tool_of(a)
            tools[kind] += 1
            if i in res:
                # a result line may carry the parser's "; Next action: ..." suffix: not the tool's output
                body = res[i].split("; Next action: {")[0]
                result_tokens[kind].append(len(body) / CHARS_PER_TOKEN)
                grow.append(len(body) / CHARS_PER_TOKEN)
        iid = Path(path).stem
        if iid in n_by_id and grow:
            k = n_by_id[iid]
            step = np.array(grow[:k - 1] + [0.0] * max(0, k - 1 - len(grow))) + tout_by_id[iid] / k
            prompts_growth = np.r_[0.0, np.cumsum(step)][:k].sum()  # sum over calls of what earlier turns added
            first_prompt.append((tin_by_id[iid] - prompts_growth) / k)
    total = sum(tools.values())

    def q(x):
        return {"mean": float(np.mean(x)), "sd": float(np.std(x, ddof=1)), "median": float(np.median(x))}

    return {
        "trajectories": int(len(n)),
        "turns": q(n), "input_tokens_sum": q(t_in), "output_tokens_sum": q(t_out),
        "tokens_sum": q(t_in + t_out), "output_tokens_per_call": q(out_per_call),
        "implied_first_prompt_tokens": q(first_prompt),
        "tool_calls": int(total),
        "tools": {k: {"share": c / total, "calls": int(c),
                      "result_tokens_median": float(np.median(result_tokens[k])) if result_tokens[k] else None,
                      "result_tokens_log_sd": float(np.std(np.log(np.maximum(result_tokens[k], 1)), ddof=1))
                      if len(result_tokens[k]) > 1 else None} for k, c in tools.most_common()},
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m traces.openhands_stats PATH_TO/llm-agents-study", file=sys.stderr)
        return 2
    s = stats(argv[0])
    print(json.dumps(s, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
