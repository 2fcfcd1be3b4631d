"""Atomic writes for everything inspector saves (CSV, JSON, HTML): a temporary file in the same
folder, then a rename, so a crash or a bad input never leaves half a file or destroys an old one."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd


def check_target(path: Path) -> None:
    """Refuse an output path that is a folder, with a line that says so."""
    from .errors import InspectorError

    if path.is_dir():
        raise InspectorError(f"{path} is a folder: give a file name to write to, e.g. {path / 'out'}")


def plain_mode(tmp: str) -> None:
    """Give ``tmp`` the permissions a plain open() would (0666 less the umask), not mkstemp's 0600."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)


def temp_beside(path: Path) -> str:
    """A temporary file next to ``path``, with plain permissions."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    plain_mode(tmp)
    return tmp


def write_text(path: str | os.PathLike, text: str) -> Path:
    path = Path(path)
    check_target(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_beside(path)
    try:
        with open(tmp, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_csv(path: str | os.PathLike, df: pd.DataFrame) -> Path:
    return write_text(path, df.to_csv(index=False))


def write_json(path: str | os.PathLike, data: Any) -> Path:
    return write_text(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")
