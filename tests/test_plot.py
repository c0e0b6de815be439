"""Figures: what each one draws equals the sweep table (read back from the figure's own
lines and bars), saved PNG + JSON sidecar, and `sim plot`."""
import json

import numpy as np
import pandas as pd
import pytest

import sim.study.sweep as sw
from conftest import linear_profile, random_trace
from sim.study import plot
from sim.cli import main
from agentsim.errors import InputError
from traces.schema import write_trace


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    d = tmp_path_factory.mktemp("plot")
    write_trace(random_trace(np.random.default_rng(5), 24), d / "t.parquet", {"generator": "test"})
    (d / "prof.json").write_text(json.dumps(linear_profile(c2=1e-7, blocks=400).raw))
    common = {"trace": str(d / "t.parquet"), "profile": str(d / "prof.json"), "num_gpu_blocks": 64}
    pts = sw.expand_grid([
        {**common, "policy": ["vllm", "continuum", "continuum-static"], "pin_seconds": [0.3, 1.5],
         "jps": [0.5, 1.0, 2.0], "rep": [0, 1]},
        {**common, "policy": ["vllm", "continuum"], "jps": 1.0, "turn_repeat": [2, 3]},
    ])
    out = d / "sweep"
    sw.sweep(pts, out, save_kv=True)
    return out, sw.load_results(out)


def lines(fig, i=0):
    return plot.figure_data(fig)[i]["lines"]


def turn1(table):
    return table[table["turn_repeat"] == 1]


def test_jct_against_load_equals_table_means(results):
    _, t = results
    t = turn1(t)
    got = lines(plot.jct_vs_load(t))
    assert list(got) == ["vllm", "continuum", "continuum-static pin_seconds=0.3", "continuum-static pin_seconds=1.5"]
    for label, (pol, pin) in {"vllm": ("vllm", None), "continuum": ("continuum", None),
                              "continuum-static pin_seconds=0.3": ("continuum-static", 0.3)}.items():
        rows = t[(t["policy"] == pol) & ((t["pin_seconds"] == pin) if pin else True)]
        want = rows.groupby("jps")["mean_jct"].mean()  # averaged over the two repetitions
        assert got[label]["x"] == want.index.tolist()
        assert got[label]["y"] == pytest.approx(want.tolist(), rel=1e-12)


def test_tail_figure_has_p90_and_p95(results):
    _, t = results
    t = turn1(t)
    data = plot.figure_data(plot.jct_vs_load(t, ("p90_jct", "p95_jct")))
    assert [d["ylabel"] for d in data] == ["P90 JCT (s)", "P95 JCT (s)"]
    want = t[t["policy"] == "vllm"].groupby("jps")["p95_jct"].mean()
    assert data[1]["lines"]["vllm"]["y"] == pytest.approx(want.tolist(), rel=1e-12)


def test_improvement_against_turns(results):
    _, t = results
    t = t[(t["jps"] == 1.0) & (t["rep"] == 0) & t["policy"].isin(["vllm", "continuum"])]
    left, right = plot.figure_data(plot.improvement_vs_turns(t))
    v = t[t["policy"] == "vllm"].sort_values("turn_repeat")
    c = t[t["policy"] == "continuum"].sort_values("turn_repeat")
    assert left["lines"]["vllm"]["x"] == pytest.approx((v["calls"] / v["n_programs"]).tolist())
    assert len(v) == 3 and v["calls"].tolist() == [v["calls"].iloc[0] * k for k in (1, 2, 3)]
    imp = 100 * (1 - c["mean_jct"].to_numpy() / v["mean_jct"].to_numpy())
    assert right["lines"]["continuum"]["y"] == pytest.approx(imp.tolist(), rel=1e-12)


def test_kv_over_time_draws_the_saved_samples(results):
    out, t = results
    pick = turn1(t)
    pick = pick[(pick["jps"] == 2.0) & (pick["rep"] == 0) & pick["policy"].isin(["vllm", "continuum"])]
    got = lines(plot.kv_over_time(out, pick))
    for _, r in pick.iterrows():
        kv = pd.read_parquet(out / "kv" / f"{r['key']}.parquet")
        assert got[r["policy"]]["y"] == pytest.approx((kv["used_blocks"] / r["num_gpu_blocks"]).tolist())
        assert got[r["policy"]]["x"] == pytest.approx(kv["t"].tolist())
    assert "continuum pinned" in got and "vllm pinned" not in got
    with pytest.raises(InputError, match="at most 12"):
        plot.kv_over_time(out, t)


def test_ttl_per_tool_bars(results):
    _, t = results
    bars = plot.figure_data(plot.ttl_by_tool(turn1(t), jps=2.0))[0]["bars"]
    static = [y for y in bars["continuum-static pin_seconds=0.3"]["y"] if not np.isnan(y)]
    assert static and static == pytest.approx([0.3] * len(static))
    rows = t[(t["policy"] == "continuum") & (t["jps"] == 2.0) & (t["turn_repeat"] == 1)]
    pins, ttl = {}, {}
    for raw in rows["ttl_by_tool"]:
        for tool, v in json.loads(raw).items():
            pins[tool] = pins.get(tool, 0) + v["pins"]
            ttl[tool] = ttl.get(tool, 0.0) + v["pins"] * v["mean_ttl_s"]
    got = {x: y for x, y in zip(bars["continuum"]["x"], bars["continuum"]["y"]) if not np.isnan(y)}
    assert got == pytest.approx({k: ttl[k] / pins[k] for k in pins})


def test_save_writes_png_and_the_drawn_data(results, tmp_path):
    _, t = results
    fig = plot.jct_vs_load(turn1(t))
    png, side = plot.save(fig, tmp_path / "f.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads(side.read_text()) == plot.figure_data(fig)


@pytest.mark.parametrize("kind, extra", [
    ("jct", ["--where", "turn_repeat=1"]), ("tail", ["--where", "turn_repeat=1"]), ("ttl", ["--where", "turn_repeat=1"]),
    ("turns", ["--where", "jps=1"]), ("kv", ["--where", "jps=2", "--where", "rep=0", "--where", "policy=continuum"])])
def test_cli_plot(results, tmp_path, kind, extra):
    out, _ = results
    assert main(["plot", kind, str(out), "-o", str(tmp_path / f"{kind}.png"), *extra]) == 0
    data = json.loads((tmp_path / f"{kind}.json").read_text())
    assert any(d["lines"] or d["bars"] for d in data)
    assert (tmp_path / f"{kind}.png").stat().st_size > 1000
    # every figure says which runs it shows: trace, programs, KV pool (issue 16)
    assert all(d["subtitle"] == "trace t, 24 programs, KV pool 64 blocks, profile prof" for d in data), data[0]["subtitle"]


def test_figures_say_which_trace_programs_and_pool_they_show(results):
    _, t = results
    t = turn1(t)
    for fig in (plot.jct_vs_load(t), plot.jct_vs_load(t, ("p90_jct", "p95_jct")), plot.ttl_by_tool(t)):
        subs = {d["subtitle"] for d in plot.figure_data(fig)}
        assert subs == {"trace t, 24 programs, KV pool 64 blocks, profile prof"}
    # taken from the runs' summaries (n_programs, num_gpu_blocks), several values listed
    two = pd.concat([t.assign(trace="traces/data/swebench.parquet", n_programs=20, num_gpu_blocks=6000, replicas=3),
                     t.assign(trace="bfcl", n_programs=40, profile=None)])
    sub = plot.runs_subtitle(two)
    assert sub == "trace bfcl/swebench, 20/40 programs, KV pool 64/6000 blocks, 1/3 replicas, profile default/prof"
    assert plot.figure_data(plot.jct_vs_load(two))[0]["subtitle"] == sub


def test_cli_plot_bad_input(results, tmp_path, capsys):
    out, _ = results
    assert main(["plot", "jct", str(out), "-o", str(tmp_path / "x.png"), "--where", "policy=nope"]) == 2
    assert main(["plot", "jct", str(out), "-o", str(tmp_path / "x.png"), "--where", "nocol=1"]) == 2
    assert main(["plot", "jct", str(tmp_path / "empty"), "-o", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 3 and all(e.startswith("error: ") for e in err)
    assert not (tmp_path / "x.png").exists()
