"""`sim plan` (sim/study/plan.py): the planner's answer equals an exhaustive search over the same
grid, pruning skips points, a rerun resumes, the SLO parser, the price table, bad input."""
import argparse
import json
import math
import shutil

import numpy as np
import pandas as pd
import pytest

from sim.hardware import measured_kernels as mk
from sim.hardware.profile import load_profile
from sim.study import plan as P
from sim.study.sweep import RESULTS, SweepReport, point_key, sweep
from agentsim.errors import InputError

# A tiny case: 12 SWE-bench programs on a cut KV pool, two GPUs (measured H100, roofline
# A100), two policies, up to 4 replicas. The SLO sits where the candidates need different
# replica counts, some more than one (checked below, so the case stays a real search).
TINY = dict(trace="swebench", jps=0.5, seeds=(0,), programs=12, num_gpu_blocks=1500, max_replicas=4)
SLO = "mean_jct<=57"
GPUS, POLICIES = ["H100", "A100-80GB"], ["vllm", "continuum"]


def tiny_candidates(out):
    return P.candidates(GPUS, ["llama3.1-8b"], [1], POLICIES, ["none"], ["round_robin"], P.load_prices(), out / "profiles")


def question(slo=SLO):
    return P.Question(slo=P.parse_slo(slo), **TINY)


def exhaustive(q, cands, out):
    """Every (candidate, replicas) in the grid, run through the sweep; the cheapest passing
    one, ties broken by the lower metric, then the candidate's input order."""
    pts = {(i, r): q.points(c, r) for i, c in enumerate(cands) for r in range(1, q.max_replicas + 1)}
    table = sweep([p for ps in pts.values() for p in ps], out).table.set_index("key")
    value = {k: float(table.loc[[point_key(p) for p in ps], q.slo.metric].mean()) for k, ps in pts.items()}
    passing = [(r * cands[i].unit_cost, v, i, r) for (i, r), v in value.items() if v <= q.slo.limit]
    return min(passing) if passing else None, value


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The planner with pruning on a fresh DIR; the exhaustive grid and the planner without
    pruning start from its table (the sweep skips points already there), to save time."""
    root = tmp_path_factory.mktemp("plan")
    cands, _, profiles = tiny_candidates(root / "pruned")
    q = question()
    pruned = P.plan(q, cands, root / "pruned", profiles)
    for d in ("grid", "full"):
        (root / d).mkdir()
    shutil.copy(root / "pruned" / RESULTS, root / "grid" / RESULTS)
    best, value = exhaustive(q, cands, root / "grid")
    shutil.copy(root / "grid" / RESULTS, root / "full" / RESULTS)
    full = P.plan(q, cands, root / "full", profiles, prune=False)
    return dict(root=root, q=q, cands=cands, profiles=profiles, pruned=pruned, full=full, best=best, value=value)


def test_tiny_case_is_a_real_search(tiny):
    q, cands, value = tiny["q"], tiny["cands"], tiny["value"]
    mins = []
    for i in range(len(cands)):
        vals = [value[(i, r)] for r in range(1, q.max_replicas + 1)]
        passing = [r for r, v in enumerate(vals, 1) if v <= q.slo.limit]
        # the planner assumes the metric passes from some replica count on; the grid obeys it
        assert passing == list(range(passing[0], q.max_replicas + 1)) if passing else True, (cands[i], vals)
        mins.append(passing[0] if passing else None)
    assert tiny["best"] is not None
    assert any(m is None or m > 1 for m in mins) and len(set(mins)) > 2, mins


def test_planner_answer_equals_exhaustive_search(tiny):
    cost, value, i, r = tiny["best"]
    for res in (tiny["pruned"], tiny["full"]):
        b, c = res.best, tiny["cands"][i]
        assert (b["gpu"], b["tp"], b["policy"], b["replicas"]) == (c.gpu, c.tp, c.policy, r)
        assert (b["offload"], b["router"]) == ("none", "round_robin")
        assert math.isclose(b["usd_per_hour"], cost) and math.isclose(b[tiny["q"].slo.metric], value)


def test_each_candidates_minimum_matches_the_grid(tiny):
    """Without pruning every candidate's smallest passing count is found, as the grid says."""
    q, cands, value = tiny["q"], tiny["cands"], tiny["value"]
    t = tiny["full"].table
    for i, c in enumerate(cands):
        row = t[(t["gpu"] == c.gpu) & (t["policy"] == c.policy)].iloc[0]
        passing = [r for r in range(1, q.max_replicas + 1) if value[(i, r)] <= q.slo.limit]
        if passing:
            assert row["status"] == "met" and row["replicas"] == passing[0]
        else:
            assert row["status"] == "infeasible"


def test_pruning_skips_points(tiny):
    pruned, full = tiny["pruned"], tiny["full"]
    n_pruned, n_full = pruned.ran + pruned.resumed, full.ran + full.resumed
    grid = len(tiny["cands"]) * tiny["q"].max_replicas
    assert n_pruned < n_full < grid, (n_pruned, n_full, grid)  # bisection < grid; the cost bound < bisection
    assert set(pruned.table["status"]) & {"cut", "pruned"}
    assert pruned.ran == n_pruned and full.ran == 0  # the first plan ran everything it tried
    assert len(pruned.probes) == n_pruned  # one seed: one point per probe


def test_the_plan_does_not_depend_on_the_order_its_points_finish(tiny, monkeypatch):
    """Two workers finish points in whatever order the machine's load gives: the search takes their results in the
    order it sent the points out, so the same points run and the same table comes out. Here a stand-in sweep finishes
    the points in flight in a random order (the grid's real results), five orders, two workers."""
    grid = pd.read_parquet(tiny["root"] / "grid" / RESULTS).drop_duplicates("key", keep="last").set_index("key")

    def finishing_in(seed):
        def fake_sweep(points, out, more=None, **_):
            rng, flying, done, asked = np.random.default_rng(seed), [], [], 0

            def add(pts):
                nonlocal asked
                asked += len(pts)
                for k in dict.fromkeys(point_key(p) for p in pts):
                    if k in done:  # settled already: settled again at once, as the sweep does
                        add(more(k, grid.loc[done].reset_index(), None))
                    elif k not in flying:
                        flying.append(k)
            add(points)
            while flying:
                k = flying.pop(int(rng.integers(len(flying))))
                done.append(k)
                add(more(k, grid.loc[done].reset_index(), None))
            return SweepReport(points=asked, skipped=0, ran=len(done), table=grid.loc[done].reset_index())
        return fake_sweep

    class NoPool:
        def __init__(self, *a):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

    monkeypatch.setattr(P, "Workers", NoPool)
    seen = []
    for seed in range(5):
        monkeypatch.setattr(P, "sweep", finishing_in(seed))
        res = P.search(tiny["q"], tiny["cands"], tiny["root"] / "order", workers=2)
        seen.append((res.table.to_json(), res.probes.to_json(), res.ran))
    assert all(x == seen[0] for x in seen), "the plan changed with the order its points finished"


def test_rerun_resumes_without_running(tiny):
    root, q = tiny["root"], tiny["q"]
    again = P.plan(q, tiny["cands"], root / "pruned", tiny["profiles"])
    assert again.ran == 0 and again.resumed == tiny["pruned"].ran + tiny["pruned"].resumed
    assert again.table.equals(tiny["pruned"].table)


def test_outputs_written(tiny):
    out = tiny["root"] / "pruned"
    t = __import__("pandas").read_parquet(out / "plan.parquet")
    assert list(t["rank"]) == list(range(1, len(tiny["cands"]) + 1))
    md = (out / "plan.md").read_text()
    assert f"{int(tiny['pruned'].best['replicas'])} x {tiny['pruned'].best['gpu']}" in md
    fig = json.loads((out / "plan.json").read_text())[0]
    assert "swebench" in fig["title"] and "JPS 0.5" in fig["title"] and SLO in fig["title"]
    front = fig["lines"]["Pareto front"]
    assert front["x"] == sorted(front["x"]) and all(a > b for a, b in zip(front["y"], front["y"][1:]))


@pytest.mark.parametrize("text, metric, limit", [("p95_jct<=60", "p95_jct", 60.0), (" mean_jct <= 12.5 ", "mean_jct", 12.5),
                                                 ("p99_jct<=1e3", "p99_jct", 1000.0)])
def test_parse_slo(text, metric, limit):
    s = P.parse_slo(text)
    assert (s.metric, s.limit) == (metric, limit) and s.met(limit) and not s.met(limit * 1.01)


@pytest.mark.parametrize("text", ["p95_jct=60", "p95_jct<60", "p95_jct<=", "p95_jct<=-1", "p95_jct<=nan",
                                  "p97_jct<=60", "throughput<=3", "<=60", "p95_jct<=inf"])
def test_parse_slo_refuses(text):
    with pytest.raises(InputError, match="METRIC<=SECONDS"):
        P.parse_slo(text)


def test_default_prices_have_sources():
    raw = json.loads(P.PRICES_FILE.read_text())["prices"]
    assert raw
    for gpu, p in raw.items():
        P.roofline.find_gpu(gpu)  # every priced GPU is one sim/hardware/specs knows
        assert p["source"].startswith("https://") and p["date"] and "on-demand" in p["kind"] and "list" in p["kind"]
    assert P.load_prices() == {g: p["usd_per_gpu_hour"] for g, p in raw.items()}


def test_prices_override_and_aliases(tmp_path):
    f = tmp_path / "p.json"
    f.write_text(json.dumps({"prices": {"h100-sxm": {"usd_per_gpu_hour": 1.5}, "a100-80gb": {"usd_per_gpu_hour": 1.0}}}))
    assert P.load_prices(f) == {"H100": 1.5, "A100-80GB": 1.0}
    cands, _, _ = P.candidates(["H100"], ["llama3.1-8b"], [1], ["vllm"], ["none"], ["round_robin"], P.load_prices(f), tmp_path)
    assert cands[0].unit_cost == 1.5
    f.write_text(json.dumps({"prices": {"H100": {"usd_per_gpu_hour": -1}}}))
    with pytest.raises(InputError, match="usd_per_gpu_hour"):
        P.load_prices(f)


def test_profiles_from_measured_kernels_where_they_exist_else_roofline(tmp_path):
    cands, notes, profiles = P.candidates(["H100", "RTX-5090"], ["llama3.1-8b", "llama3.1-70b"], [1, 2], ["vllm"],
                                          ["none"], ["round_robin"], {**P.load_prices(), "RTX-5090": 0.5}, tmp_path)
    src = {(c.gpu, c.model, c.tp): c.source for c in cands}
    assert src[("H100", "llama3.1-8b", 1)] == src[("H100", "llama3.1-8b", 2)] == "measured kernels"
    assert src[("RTX-5090", "llama3.1-8b", 1)] == "roofline"  # no measured kernels shipped for it
    assert ("H100", "llama3.1-70b", 1) not in src  # 141 GB of weights
    assert any("llama3.1-70b at tp=1" in n for n in notes)
    assert len(profiles) == len(src)  # every candidate's profile is written to DIR/profiles/
    h100 = next(p for path, p in profiles.items() if path.endswith("H100-llama3.1-8b-tp1.json"))
    assert h100["step_time"] == load_profile("llama3.1-8b-h100").raw["step_time"]  # the bundled default's prices


def test_a_replica_whose_gpus_talk_over_pcie_carries_a_caveat(tmp_path):
    """An RTX 5090 has no NVLink and no measured collectives: its tp 2 candidate is kept, with a
    note that its all-reduce is assumed and the measured one far slower; NVLink GPUs, one-GPU
    replicas and the L40S (its all-reduce measured, sim/hardware/measured_kernels.py) get none."""
    prices = {**P.load_prices(), "L40S": 1.0, "RTX-5090": 0.5}
    _, notes, _ = P.candidates(["RTX-5090", "L40S", "H100"], ["llama3.1-8b"], [1, 2], ["vllm"], ["none"], ["round_robin"],
                               prices, tmp_path)
    pcie = [n for n in notes if "NVLink" in n]
    assert [n.split(":")[0] for n in pcie] == ["RTX-5090 x llama3.1-8b at tp=2"]
    assert "no NVLink" in pcie[0] and "about 7x slower" in pcie[0]


def test_a_candidate_whose_gemms_keep_zero_weight_prices_says_so(tmp_path):
    """The L40S's measured kernels time GEMMs on zero weights, which the H100's profile prices for trained weights
    and the L40S's cannot (not measured on that chip): each of its candidates carries the caveat, the H100's and the
    roofline RTX 5090's none."""
    prices = {**P.load_prices(), "L40S": 1.0, "RTX-5090": 0.5}
    _, notes, _ = P.candidates(["RTX-5090", "L40S", "H100"], ["llama3.1-8b"], [1, 2], ["vllm"], ["none"], ["round_robin"],
                               prices, tmp_path)
    gemms = [n for n in notes if "on unloaded (zero) weights" in n]
    assert [n.split(":")[0] for n in gemms] == ["L40S x llama3.1-8b at tp=1", "L40S x llama3.1-8b at tp=2"]
    assert all("not measured on this GPU" in n and f"{mk.gemm_values_factor():.3f}x" in n for n in gemms)


def _cli(args):
    ap = argparse.ArgumentParser()
    P.register(ap.add_subparsers())
    a = ap.parse_args(["plan", *args])
    return a.func(a)


BASE = ["--jps", "0.5", "--slo", "p95_jct<=40", "--gpu", "H100", "--policy", "vllm"]


@pytest.mark.parametrize("change, match", [
    ({"--gpu": "H999"}, "unknown gpu 'H999'"),
    ({"--slo": "p95<=40"}, "METRIC<=SECONDS"),
    ({"--gpu": "RTX-5090"}, "no price for GPU RTX-5090"),
    ({"--model": "llama3.1-70b", "--gpu": "L40S"}, "no candidate configuration is left"),
    ({"--router": "random"}, "not a router"),
    ({"--tp": "0"}, "tensor-parallel sizes >= 1"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, change, match):
    args = dict(zip(BASE[::2], BASE[1::2]))
    args.update(change)
    out = tmp_path / "plan"
    with pytest.raises(InputError, match=match) as e:
        _cli([x for kv in args.items() for x in kv] + ["--out", str(out), "--no-progress"])
    assert "\n" not in str(e.value)
    assert not out.exists()
