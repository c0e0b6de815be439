"""benchmarks/cpu_speed.py: an API server's kind of Python work timed, and set against another machine's record."""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import cpu_speed as cs  # noqa: E402

RECORDS = Path(__file__).resolve().parents[1] / "benchmarks" / "host"


def test_a_record_times_every_part_and_compares_with_another(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert cs.main(["--repeats", "1", "--out", str(out), "--against", str(RECORDS / "cpu-speed-h200-host.json")]) == 0
    rec = json.loads(out.read_text())
    assert set(rec["seconds"]) == set(cs.PARTS) and all(s > 0 for s in rec["seconds"].values())
    assert rec["total_s"] == sum(rec["seconds"].values())
    said = capsys.readouterr().out
    assert said.count(" of Intel(R) Xeon(R) Processor") == len(cs.PARTS) and "total" in said


def test_the_shipped_records_are_of_the_same_parts():
    for name in ("cpu-speed-h200-host.json", "cpu-speed-epyc-2core.json"):
        assert set(json.loads((RECORDS / name).read_text())["seconds"]) == set(cs.PARTS), name


def test_bad_input_is_one_line(tmp_path, capsys):
    bad = tmp_path / "b.json"
    bad.write_text('{"seconds": {"other": 1}}')
    assert cs.main(["--repeats", "0"]) == 2
    assert cs.main(["--against", str(bad)]) == 2
    assert cs.main(["--against", str(tmp_path / "none.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and "--repeats 0" in err[0] and "not a benchmarks/cpu_speed.py record" in err[1] and "cannot read it" in err[2]
