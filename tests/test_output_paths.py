"""Issue 36 item 3: every writer checks its output path before any work.

A path under a file, an existing directory where a file is meant (or a file where a
directory is), a folder that is not writable: one line, exit 2, nothing run or written.
One helper (agentsim.files.check_output) applied by the CLI to each writer's flags
(agentsim.cli.OUTPUTS); each writer is tested here once per kind of bad path.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

import agentsim.cli as cli
import agentsim.files as files
from agentsim.errors import InputError
from agentsim.files import check_output

FIX = Path(__file__).parent / "fixtures"
CLAUDE = str(FIX / "importers" / "claude_code_session.jsonl")
REG = str(FIX / "regressions" / "case4413.parquet")

# writer -> (argv with {P} where the output path goes, what it makes there)
WRITERS = {
    "run": (["run", "--trace", REG, "--no-progress", "--out", "{P}"], "dir"),
    "sweep": (["sweep", "--axis", f"trace={REG}", "--no-progress", "--out", "{P}"], "dir"),
    "plot": (["plot", "jct", "{R}", "-o", "{P}"], "file"),
    "plan --out": (["plan", "--trace", REG, "--jps", "0.3", "--slo", "mean_jct<=100", "--gpu", "H100",
                    "--no-progress", "--out", "{P}"], "dir"),
    "plan --md": (["plan", "--trace", REG, "--jps", "0.3", "--slo", "mean_jct<=100", "--gpu", "H100",
                   "--no-progress", "--out", "{R}", "--md", "{P}"], "file"),
    "tune": (["tune", "--trace", REG, "--jps", "0.3", "--no-progress", "--out", "{P}"], "dir"),
    "trace gen": (["trace", "gen", "swebench", "--programs", "2", "-o", "{P}"], "file"),
    "trace import": (["trace", "import", "claude-code", CLAUDE, "-o", "{P}"], "file"),
    "trace resample": (["trace", "resample", REG, "--programs", "2", "-o", "{P}"], "file"),
    "calibrate": (["calibrate", "--quick", "--out", "{P}"], "file"),
    "validate": (["validate", "--programs", "2", "--out", "{P}"], "dir"),
    "profile roofline": (["profile", "roofline", "--gpu", "H100", "--model", "llama3.1-8b", "--out", "{P}"], "file"),
    "profile fit-roofline": (["profile", "fit-roofline", "--out", "{P}"], "file"),
    "profile check": (["profile", "check", "llama3.1-8b-h100", "--probes", "probes.json", "--json", "{P}"], "file"),
}
BAD = ("under a file", "the other kind exists", "folder not writable")


def _bad_path(tmp_path: Path, case: str, kind: str, monkeypatch) -> str:
    name = "out.json" if kind == "file" else "outdir"
    if case == "under a file":
        (tmp_path / "f").write_text("x")
        return str(tmp_path / "f" / "sub" / name)
    if case == "the other kind exists":
        if kind == "file":
            (tmp_path / "d").mkdir()
            return str(tmp_path / "d")
        (tmp_path / "f").write_text("x")
        return str(tmp_path / "f")
    ro = tmp_path / "ro"
    ro.mkdir()
    real = files._writable
    monkeypatch.setattr(files, "_writable", lambda p: Path(p) != ro and real(p))  # root may write anywhere
    return str(ro / name)


@pytest.mark.parametrize("case", BAD)
@pytest.mark.parametrize("writer", WRITERS)
def test_every_writer_refuses_a_bad_output_path_before_any_work(writer, case, tmp_path, monkeypatch, capsys):
    argv, kind = WRITERS[writer]
    work = tmp_path / "w"
    work.mkdir()
    bad = _bad_path(work, case, kind, monkeypatch)
    before = sorted(os.walk(work))
    started = []

    real_build = cli.build_parser

    def build(command=None):  # the command's work would start in args.func: record it instead
        parser = real_build(command)
        real_parse = parser.parse_args

        def parse(a=None):
            args = real_parse(a)
            args.func = lambda _args: started.append(writer) or 0
            return args
        parser.parse_args = parse
        return parser

    monkeypatch.setattr(cli, "build_parser", build)
    rc = cli.main([a.replace("{P}", bad).replace("{R}", str(tmp_path / "r")) for a in argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    flag = argv[argv.index("{P}") - 1]
    flag = {"-o": "--out" if writer in ("plot", "trace import") else "--output"}.get(flag, flag)
    assert err[0].startswith(f"error: {flag} {bad!r}"), err[0]
    assert not started  # refused before the command began
    assert sorted(os.walk(work)) == before  # nothing written


def test_writers_table_names_real_flags():
    # every (attribute, flag) of OUTPUTS is an option of its command, so no writer is left unchecked
    for name, outs in cli.OUTPUTS.items():
        cmd, _, sub = name.partition(" ")
        parser = cli.build_parser(cmd)
        sp = parser._subparsers._group_actions[0].choices[cmd]
        if sub:
            sp = next(a for a in sp._actions if a.__class__.__name__ == "_SubParsersAction").choices[sub]
        opts = {o: a.dest for a in sp._actions for o in a.option_strings}
        for attr, flag, _ in outs:
            assert opts.get(flag) == attr, (name, flag)


def test_a_real_run_under_a_file_simulates_nothing(tmp_path, capsys):
    # was: simulated in full, printed its summary, then a traceback from mkdir
    (tmp_path / "f").write_text("x")
    rc = cli.main(["run", "--trace", REG, "--no-progress", "--out", str(tmp_path / "f" / "o")])
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and "which is a file" in err and len(err.strip().splitlines()) == 1


def test_an_import_into_an_existing_directory_is_one_line(tmp_path, capsys):
    rc = cli.main(["trace", "import", "claude-code", CLAUDE, "-o", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2 and "is a directory; give a file path" in err and os.listdir(tmp_path) == []


@pytest.mark.parametrize("path,kind,msg", [
    ("", "file", "empty"), ("a\0b", "file", "NUL byte"), ("x" * 300, "file", "File name too long"),
])
def test_check_output_odd_names(path, kind, msg, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError, match=msg):
        check_output(path, kind)


def test_check_output_accepts_new_folders_and_existing_files(tmp_path):
    (tmp_path / "t.parquet").write_text("x")
    assert check_output(tmp_path / "t.parquet", "file") == tmp_path / "t.parquet"  # overwritten atomically
    assert check_output(tmp_path / "a" / "b" / "c.json", "file") == tmp_path / "a" / "b" / "c.json"
    assert check_output(tmp_path, "dir") == tmp_path
    assert check_output(None, "dir") is None
    assert os.listdir(tmp_path) == ["t.parquet"]  # nothing created


def test_a_folder_whose_filesystem_refuses_files_is_refused_before_work(tmp_path, monkeypatch):
    """os.access lets root write anywhere; sysfs or a read-only bind mount still refuse:
    the check asks the system by making a nameless file."""
    def refuse(*a, **kw):
        raise PermissionError(1, "Operation not permitted")
    monkeypatch.setattr(files.tempfile, "TemporaryFile", refuse)
    with pytest.raises(InputError, match="not writable"):
        check_output(tmp_path / "new" / "out", "dir")
    assert list(tmp_path.iterdir()) == []


def test_a_write_the_system_refuses_late_is_one_line(tmp_path, monkeypatch, capsys):
    """A full disk after the checks: one line naming the file, exit 1, no traceback."""
    import sim.commands.run

    def full(path, write):
        raise OSError(28, "No space left on device", str(path))
    monkeypatch.setattr(sim.commands.run, "atomic_write", full)
    code = cli.main(["run", "--trace", REG, "--no-progress", "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and err.startswith("error: No space left on device: ") and "config.json" in err
