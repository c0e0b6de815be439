"""Output paths: checked before any work (check_output), written so that a reader never
sees half of a file (atomic_write); input JSON read with one line for a bad file (read_json)."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Callable, Literal

from agentsim.errors import InputError


def _writable(folder: Path) -> bool:
    """Can files be created in `folder` (an existing directory)? Asked of the system with a
    nameless file it removes at once: root passes os.access where a filesystem still
    refuses (sysfs, a read-only bind mount). A function of its own so that tests can deny it."""
    if not os.access(folder, os.W_OK | os.X_OK):
        return False
    try:
        with tempfile.TemporaryFile(dir=folder):
            return True
    except OSError:
        return False


def check_output(path: str | os.PathLike | None, kind: Literal["file", "dir"], flag: str = "--out") -> Path | None:
    """Refuse, before any work, an output path that cannot be written: one InputError
    line naming the flag and the path. `kind` is what the writer makes there: a "file"
    (refused where a directory is) or a "dir" (refused where a file is); either way
    refused under a file, or in a folder that is not writable. Folders that do not exist
    yet are fine (writers create them). Nothing is created or written. None passes (an
    optional flag not given)."""
    if path is None:
        return None
    text = os.fspath(path)
    where = f"{flag} {text!r}"
    if not text.strip():
        raise InputError(f"{where}: empty; give a {'file path' if kind == 'file' else 'directory'}")
    if "\0" in text:
        raise InputError(f"{flag} {text!r} is not a valid path (a NUL byte); give another path")
    p = Path(text)
    try:
        if p.is_dir():
            if kind == "file":
                raise InputError(f"{where} is a directory; give a file path (e.g. {str(p / 'out')!r} with its suffix)")
            if not _writable(p):
                raise InputError(f"{where}: the directory is not writable; give another --out or fix its permissions")
            return p
        if p.exists() or p.is_symlink():
            if kind == "dir":
                raise InputError(f"{where} is a file; give a directory (a new one is created)")
        up = p.absolute().parent
        while not up.exists():
            if up.is_symlink():  # a link to nowhere
                raise InputError(f"{where}: {str(up)!r} is a broken link; give a path in an existing folder")
            up = up.parent
        if not up.is_dir():
            raise InputError(f"{where} is under {str(up)!r}, which is a file, so nothing can be written there; "
                             f"give a path in a folder")
        if not _writable(up):
            raise InputError(f"{where}: the folder {str(up)!r} is not writable; give a path in a writable folder")
    except OSError as e:  # a name too long, a loop of links, a component without permission
        raise InputError(f"{where} cannot be used ({e.strerror or e}); give another path") from None
    return p


def atomic_write(path: str | os.PathLike, write: Callable[[str], None]) -> Path:
    """Call write(tmp_path) on a temp file beside `path`, then rename it into place.

    A crash or an exception leaves the old file (or none), never a partial one. The
    file gets ordinary permissions (mkstemp's 0600 would hide shared artefacts).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def read_json(path: str | os.PathLike, flag: str):
    """The JSON of the file a flag names; InputError in one line naming the flag where it cannot be read or parsed."""
    try:
        return json.loads(Path(path).read_text())
    except OSError as e:
        raise InputError(f"{flag} {path}: cannot read it ({e.strerror})") from None
    except ValueError as e:
        raise InputError(f"{flag} {path}: not JSON ({e})") from None

