"""`sim validate --server-run`: a `vllm bench serve` result read, replayed and compared."""
import json
import math

import numpy as np
import pytest

from agentsim.cli import main
from calibrate.server_run import compare, read_result, real_metrics, sim_metrics, trace_of
from agentsim.errors import InputError

PROFILE = "cpu-tiny-llama"


def _result(n=6, **over):
    """A result as vLLM 0.32's `vllm bench serve --save-result --save-detailed` writes it."""
    rng = np.random.default_rng(0)
    out = [int(x) for x in rng.integers(2, 9, n)]
    itls = [[0.02 + 0.001 * j for j in range(k - 1)] for k in out]
    ttfts = [0.05 + 0.01 * i for i in range(n)]
    r = {"date": "20261128-090000", "endpoint_type": "vllm", "backend": "vllm", "label": None,
         "model_id": "sim/hardware/models/tiny-llama", "tokenizer_id": "sim/hardware/models/tiny-llama",
         "num_prompts": n, "request_rate": 4.0, "burstiness": 1.0, "max_concurrency": None,
         "duration": 3.0, "completed": n, "failed": 0,
         "input_lens": [int(x) for x in rng.integers(50, 400, n)], "output_lens": out, "ttfts": ttfts,
         "itls": itls, "latencies": [t + sum(i) for t, i in zip(ttfts, itls)],
         "start_times": [1000.0 + 0.25 * i for i in range(n)], "queue_times": [0.0] * n,
         "generated_texts": [""] * n, "errors": [""] * n}
    r.update(over)
    return r


def _write(tmp_path, data, name="r.json"):
    p = tmp_path / name
    p.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(p)


def test_read_and_real_metrics(tmp_path):
    raw = _result()
    raw["errors"][2] = "boom"
    raw["output_lens"][2] = 0
    run = read_result(_write(tmp_path, raw))
    assert len(run.arrivals) == 5 and run.failed == 1 and run.arrivals[0] == 0.0
    assert np.allclose(run.arrivals, [0, 0.25, 0.75, 1.0, 1.25])
    m = real_metrics(run)
    keep = [0, 1, 3, 4, 5]
    assert m["ttft"]["mean"] == pytest.approx(np.mean([raw["ttfts"][i] for i in keep]) * 1000)
    tp = [(raw["latencies"][i] - raw["ttfts"][i]) / (raw["output_lens"][i] - 1) for i in keep]
    assert m["tpot"]["median"] == pytest.approx(np.median(tp) * 1000)
    assert m["itl"]["p99"] == pytest.approx(np.percentile([x for i in keep for x in raw["itls"][i]], 99) * 1000)
    t = trace_of(run)
    assert list(t["new_input_tokens"]) == [raw["input_lens"][i] for i in keep]


def test_compare_errors():
    real = {m: {"mean": 10.0, "median": 8.0, "p99": 20.0} for m in ("ttft", "tpot", "itl", "e2el")}
    sim = sim_metrics({"mean_ttft_ms": 11.0, "median_ttft_ms": 8.0, "p99_ttft_ms": 18.0, "mean_itl_ms": 9.0,
                       "mean_tpot_ms": 10.0, "median_tpot_ms": 10.0, "p99_tpot_ms": 10.0,
                       "mean_e2el_ms": 5.0, "median_e2el_ms": 4.0, "p99_e2el_ms": 10.0})
    rows = {(r["metric"], r["stat"]): r["error_pct"] for r in compare(real, sim)}
    assert rows["ttft", "mean"] == pytest.approx(10.0) and rows["ttft", "p99"] == pytest.approx(-10.0)
    assert rows["e2el", "median"] == pytest.approx(-50.0)
    assert rows["itl", "mean"] == pytest.approx(-10.0) and rows["itl", "p99"] is None  # no per-token times in the sim


def test_cli_table_and_json(tmp_path, capsys):
    path = _write(tmp_path, _result())
    out = tmp_path / "cmp.json"
    assert main(["validate", "--server-run", path, "--profile", PROFILE, "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "| metric | stat | real (ms) | sim (ms) | error |" in text
    rep = json.loads(out.read_text())
    assert rep["requests"] == 6 and len(rep["rows"]) == 12
    for r in rep["rows"]:
        if r["error_pct"] is not None:
            assert math.isfinite(r["error_pct"]) and r["sim_ms"] > 0


def test_old_result_without_start_times(tmp_path):
    raw = _result(request_rate="inf")
    del raw["start_times"], raw["latencies"]
    run = read_result(_write(tmp_path, raw))
    assert (run.arrivals == 0).all()
    assert run.latencies[0] == pytest.approx(raw["ttfts"][0] + sum(raw["itls"][0]))


@pytest.mark.parametrize("data, args, says", [
    ("{not json", [], "not JSON"),
    ([1, 2], [], "not a `vllm bench serve` result"),
    ({k: v for k, v in _result().items() if k not in ("ttfts", "itls", "input_lens", "output_lens")}, [],
     "--save-detailed"),
    (_result(ttfts=[0.1]), [], "malformed"),
    (_result(ttfts=[-1.0] * 6), [], "malformed"),
    (_result(model_id="meta-llama/Llama-3.1-8B-Instruct"), [], "give --profile of the served model"),
    ({k: v for k, v in _result().items() if k != "start_times"}, [], "arrivals are unknown"),
    (_result(), ["--trace", "swebench"], "--trace applies only with a real engine run (not --server-run)"),
    (_result(), ["--out", "x"], "--out applies only with a real engine run"),
    (_result(), ["--jps", "2.0"], "--jps applies only with a real engine run"),  # at its default value: given all the same
])
def test_refused_with_one_line(tmp_path, capsys, data, args, says):
    path = _write(tmp_path, data)
    assert main(["validate", "--server-run", path, "--profile", PROFILE, *args]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and "\n" not in err, err


def test_json_without_server_run_refused():
    import argparse

    from agentsim import requires

    with pytest.raises(InputError, match="--json applies only with --server-run"):  # sim validate's row of the table
        requires.check("validate", argparse.Namespace(server_run=None, json="x.json", merge=False, shape=None, policy_arg=[]))


def test_a_profile_with_a_server_section_is_read_as_a_client_sees_it(tmp_path, capsys):
    from sim.hardware.profile import load_profile

    path = _write(tmp_path, _result())
    raw = dict(load_profile(PROFILE).raw)
    raw["server"] = {"request_s": 0.01, "per_prompt_token_s": 0.0, "per_output_token_s": 0.0, "source": "test"}
    prof = tmp_path / "tiny-llama.json"
    prof.write_text(json.dumps(raw))
    reps = {}
    for name, p in (("engine", PROFILE), ("client", str(prof))):
        assert main(["validate", "--server-run", path, "--profile", p, "--json", str(tmp_path / f"{name}.json")]) == 0
        reps[name] = json.loads((tmp_path / f"{name}.json").read_text())
    assert reps["engine"]["view"] == "engine" and reps["client"]["view"] == "client"
    ttft = {k: next(r["sim_ms"] for r in v["rows"] if r["metric"] == "ttft" and r["stat"] == "mean") for k, v in reps.items()}
    assert ttft["client"] == pytest.approx(ttft["engine"] + 10.0)
    assert "metrics at the client" in capsys.readouterr().out


def test_validate_without_out_or_server_run_refused(capsys):
    assert main(["validate", "--trace", "swebench"]) == 2
    assert "needs --out DIR" in capsys.readouterr().err
