"""`sim validate --server-run` on a result `vllm bench serve` itself wrote against a real
CPU vLLM API server with the shipped tiny model (a word-level tokenizer added so that
the server tokenizes and the bench makes random prompts offline)."""
import json
import math
import subprocess
import sys

import pytest

from agentsim.cli import main
from calibrate.engine import default_model
from calibrate.word_tokenizer import with_word_tokenizer
from conftest import START_ENV, vllm_server

MODEL = default_model("cpu")

pytestmark = pytest.mark.engine

BENCH = ("import sys\nfrom vllm.benchmarks.serve import add_cli_args, main\n"
         "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
         "p = FlexibleArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))\n")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = with_word_tokenizer(MODEL, tmp_path_factory.mktemp("model") / MODEL.name)
    with vllm_server(model, "--max-model-len", "2048") as url:
        yield url, model


def test_server_run_on_a_vllm_bench_serve_result(server, tmp_path, capsys):
    url, model = server
    (tmp_path / "bench.py").write_text(BENCH)  # `vllm bench serve` (the `vllm` script needs the dist named vllm)
    subprocess.run([sys.executable, str(tmp_path / "bench.py"), "--backend", "vllm", "--base-url", url,
                    "--model", str(model), "--dataset-name", "random", "--random-input-len", "128",
                    "--random-output-len", "8", "--num-prompts", "16", "--request-rate", "4", "--seed", "0",
                    "--ignore-eos", "--save-result", "--save-detailed", "--result-dir", str(tmp_path),
                    "--result-filename", "bench.json"], check=True, timeout=300,
                   env={**START_ENV, "HF_HUB_OFFLINE": "1"}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    result = json.loads((tmp_path / "bench.json").read_text())
    out = tmp_path / "cmp.json"
    assert main(["validate", "--server-run", str(tmp_path / "bench.json"), "--profile", f"cpu-{MODEL.name}",
                 "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.count("\n| ") == 13  # header + 12 rows (4 metrics x mean, median, p99)
    rep = json.loads(out.read_text())
    assert rep["requests"] == result["completed"] == 16
    rows = {(r["metric"], r["stat"]): r for r in rep["rows"]}
    for m in ("ttft", "tpot", "itl", "e2el"):  # the real side is vLLM's own figure
        assert rows[m, "mean"]["real_ms"] == pytest.approx(result[f"mean_{m}_ms"] if m != "e2el" else
                                                           sum(result["latencies"]) / 16 * 1000, rel=1e-9)
    for r in rep["rows"]:
        if r["metric"] != "itl" or r["stat"] == "mean":
            assert math.isfinite(r["error_pct"]) and r["sim_ms"] > 0
    # another model's result is refused with one line
    result["model_id"] = "meta-llama/Llama-3.1-8B-Instruct"
    (tmp_path / "other.json").write_text(json.dumps(result))
    assert main(["validate", "--server-run", str(tmp_path / "other.json"), "--profile", f"cpu-{MODEL.name}"]) == 2
    assert "give --profile of the served model" in capsys.readouterr().err
