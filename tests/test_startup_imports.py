"""A run that wants only its summary imports no pandas (~0.4 s of a few-second run): the
trace is read columnar by pyarrow (traces/schema.read_columns) and the summary computed
with numpy; the result's tables are DataFrames built on first use (sim/simulate.Result)."""
import json
import subprocess
import sys

CHILD = """
import json, sys
from sim.run.config import ClusterConfig, EngineLimits, PolicyConfig, SimConfig, WorkloadConfig, build_run, execute
cfg = SimConfig(workload=WorkloadConfig(trace="swebench", programs=4), policy=PolicyConfig(name="continuum"),
                engine=EngineLimits(num_gpu_blocks=3000), cluster=ClusterConfig(replicas=2))
res = execute(build_run(cfg))
before = "pandas" in sys.modules
turns = res.turns  # asking for a table brings pandas in
print(json.dumps({"pandas_before_tables": before, "pandas_after": "pandas" in sys.modules,
                  "calls": res.summary["calls"], "rows": len(turns)}))
"""


def test_summary_only_run_imports_no_pandas():
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["pandas_before_tables"] is False, "the run path imports pandas again (see this file's docstring)"
    assert got["pandas_after"] is True and got["rows"] == got["calls"] > 0


CLI = """
import json, sys
from agentsim.cli import main
rc = main(["run", "--trace", "swebench", "--programs", "3", "--num-gpu-blocks", "3000", "--no-progress"])
print(json.dumps({"rc": rc, "loaded": sorted(m for m in ("pandas", "calibrate", "traces.generate", "sim.study.plan") if m in sys.modules)}))
"""


def test_sim_run_on_the_command_line_imports_only_its_command():
    """`sim run` registers only its own subcommand (agentsim/cli.py COMMANDS): no pandas
    (sim plan and sim sweep import it), no calibrate, no trace tools."""
    out = subprocess.run([sys.executable, "-c", CLI], capture_output=True, text=True, check=True)
    assert "JCT mean / p50" in out.stdout  # the run's summary was printed
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"rc": 0, "loaded": []}
