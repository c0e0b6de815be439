"""notebooks/sweep_jps_ttl.ipynb runs top to bottom headlessly, and every figure it saves
draws exactly the sweep tables it wrote (~40 s on 2 cores)."""
import json
import os
from pathlib import Path

import nbclient
import nbformat
import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "sweep_jps_ttl.ipynb"


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    out = tmp_path_factory.mktemp("notebook")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    with pytest.MonkeyPatch.context() as mp:  # the kernel inherits the environment
        mp.setenv("SWEEP_NOTEBOOK_OUT", str(out))
        mp.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
        nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    return nb, out


def fig(out, name):
    return json.loads((out / "figures" / f"{name}.json").read_text())


def label(r) -> str:
    if r["policy"] == "continuum-static":
        return f"continuum-static pin_seconds={r['pin_seconds']:g}"
    if r["policy"] == "continuum":
        return "continuum max_ttl=" + ("none" if pd.isna(r["max_ttl"]) else f"{r['max_ttl']:g}")
    return r["policy"]


def test_runs_clean_and_shows_every_figure(executed):
    nb, out = executed
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 5
    for name in ("jct_vs_load", "tail_jct", "ttl_by_tool", "kv_usage", "turns"):
        assert (out / "figures" / f"{name}.png").stat().st_size > 5000


def test_load_figures_equal_the_table(executed):
    _, out = executed
    t = pd.read_parquet(out / "jps_ttl" / "results.parquet")
    assert len(t) == 3 * (1 + 2 + 3)  # loads x (vllm, continuum x 2 caps, static x 3 TTLs)
    t["label"] = t.apply(label, axis=1)
    for name, metrics in (("jct_vs_load", ["mean_jct"]), ("tail_jct", ["p90_jct", "p95_jct"])):
        panels = fig(out, name)
        assert len(panels) == len(metrics)
        for panel, m in zip(panels, metrics):
            assert set(panel["lines"]) == set(t["label"])
            for lab, g in t.groupby("label"):
                g = g.sort_values("jps")
                assert panel["lines"][lab] == {"x": g["jps"].tolist(), "y": g[m].tolist()}


def test_ttl_and_kv_figures_equal_the_table(executed):
    _, out = executed
    t = pd.read_parquet(out / "jps_ttl" / "results.parquet")
    high = t[t["jps"] == t["jps"].max()]
    bars = fig(out, "ttl_by_tool")[0]["bars"]
    for _, r in high[high["pins"] > 0].iterrows():
        got = {x: y for x, y in zip(bars[label(r)]["x"], bars[label(r)]["y"]) if y == y}  # NaN: tool not pinned
        want = {k: v["mean_ttl_s"] for k, v in json.loads(r["ttl_by_tool"]).items() if k in bars[label(r)]["x"]}
        assert len(bars[label(r)]["x"]) == 12 and got == pytest.approx(want)  # the 12 tools pinned most
    lines = fig(out, "kv_usage")[0]["lines"]
    assert set(lines) == {"vllm", "continuum", "continuum pinned", "continuum-static", "continuum-static pinned"}
    for name, r in (("vllm", high[high["policy"] == "vllm"].iloc[0]),
                    ("continuum-static", high[high["pin_seconds"] == 2.0].iloc[0])):
        kv = pd.read_parquet(out / "jps_ttl" / "kv" / f"{r['key']}.parquet")
        assert lines[name]["y"] == pytest.approx((kv["used_blocks"] / r["num_gpu_blocks"]).tolist())


def test_turns_figure_equals_the_table(executed):
    _, out = executed
    t = pd.read_parquet(out / "turns" / "results.parquet")
    v, c = (t[t["policy"] == p].sort_values("turn_repeat") for p in ("vllm", "continuum"))
    left, right = fig(out, "turns")
    assert left["lines"]["vllm"] == {"x": (v["calls"] / v["n_programs"]).tolist(), "y": v["mean_jct"].tolist()}
    imp = (100 * (1 - c["mean_jct"].to_numpy() / v["mean_jct"].to_numpy())).tolist()
    assert right["lines"]["continuum"]["y"] == pytest.approx(imp, rel=1e-12)
