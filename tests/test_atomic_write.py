"""Files are written atomically (agentsim/files.py atomic_write): a failed write keeps the old file and leaves no temporary."""
import os
from pathlib import Path

import pytest

from agentsim.files import atomic_write


def test_failed_write_keeps_old_file_and_leaves_no_temp(tmp_path):
    target = tmp_path / "out.json"
    target.write_text("old")

    def boom(tmp):
        Path(tmp).write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        atomic_write(target, boom)
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["out.json"]


def test_written_file_is_readable_by_others(tmp_path):
    p = atomic_write(tmp_path / "a" / "t.txt", lambda tmp: Path(tmp).write_text("x"))
    assert p.read_text() == "x" and p.stat().st_mode & 0o044
