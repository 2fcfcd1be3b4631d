"""A capture file's header read without torch, safetensors or numpy: the command line checks a file with it (and the
site, head, batch row and words a command names) before it imports any of them (issue 28).

A safetensors file starts with 8 bytes (the header length ``n``, little-endian), then ``n`` bytes of JSON: one entry
per tensor (``dtype``, ``shape``, ``data_offsets``) and ``__metadata__``, whose ``inspector`` value is the capture's
own JSON document (docs/file-format.md). :func:`read` checks as much as that takes and no more: the length against
the file's size and a bound proportional to its data, the JSON, the ``inspector`` document against its budget. The
full checks (every field, every tensor) run when the file is opened (:func:`inspector.store.capture_file.load`); the
messages here are the same ones.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

from inspector.errors import InspectorError

MAX_HEADER = 100_000_000  # safetensors' own limit on the header length
HEADER_BASE = 16 << 20  # any header up to this size; beyond it, at most 1/16 of the tensor data


def header_length(path: Path) -> int:
    """The safetensors header length, checked against the file size and a bound proportional to the data,
    before any JSON is parsed."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
    if len(head) < 8:
        raise InspectorError(f"{path} is not a readable capture file ({size} bytes, too short to be safetensors): make it "
                             "again with `inspector capture`")
    (n,) = struct.unpack("<Q", head)
    if n > size - 8:
        raise InspectorError(f"{path} is not a readable capture file (its header claims {n} bytes but the file has {size}); "
                             "it may be truncated or not a capture: make it again with `inspector capture`")
    data = size - 8 - n
    if n > min(MAX_HEADER, HEADER_BASE + data // 16):
        raise InspectorError(f"{path} has a {n}-byte header for {data} bytes of tensors, far more than a capture needs: "
                             "refusing to parse it (a damaged or hostile file); capture again")
    return n


def _json_header(path: Path) -> Any:
    """The safetensors header's JSON (bounded by :func:`header_length`), or None where it is no JSON."""
    n = header_length(path)
    with open(path, "rb") as f:
        f.seek(8)
        raw = f.read(n)
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return None


def is_capture_file(path: Path) -> bool:
    """True when ``path`` is a safetensors file whose header carries an inspector document (read within
    the header bound; nothing else is parsed)."""
    try:
        header = _json_header(path)
        return isinstance(header, dict) and "inspector" in (header.get("__metadata__") or {})
    except (OSError, InspectorError):
        return False


def check_replaceable(path: Path, force: bool = False) -> None:
    """Refuse to replace an existing regular file that is not a capture (unless ``force``)."""
    if not force and path.is_file() and not is_capture_file(path):
        raise InspectorError(f"{path} exists and is not an inspector capture (it may be a model's weights): choose another "
                             "name, or pass --force to replace it")


def read(path: str | os.PathLike) -> dict[str, Any]:
    """The ``inspector`` document of the capture file ``path`` (a dict), checked as far as the header goes; one
    line (:class:`InspectorError`, the same as :func:`~inspector.store.capture_file.load` gives) for a folder, a
    missing file, a file too short or too large in its header to be a capture, a safetensors file without an
    inspector document, or one whose document is no JSON object."""
    if not str(path).strip():  # Path("") is "." (a folder): say what is wrong, the path itself
        raise InspectorError("the capture file's path is empty: give a capture file, e.g. run.safetensors")
    path = Path(path)
    if path.is_dir():
        raise InspectorError(f"{path} is a folder, not a capture file: give the .safetensors file inside it")
    if not path.is_file():
        raise InspectorError(f"{path} does not exist: make a capture with `inspector capture ... -o {path.name}`")
    try:
        header = _json_header(path)
    except OSError as exc:
        raise InspectorError(f"cannot read {path} ({exc.strerror or exc}): check the path and its permissions") from None
    if not isinstance(header, dict):
        raise InspectorError(f"{path} is not a readable capture file (its header is no safetensors JSON); it may be "
                             "truncated or not a capture: make it again with `inspector capture`")
    metadata = header.get("__metadata__")
    if not isinstance(metadata, dict) or "inspector" not in metadata:
        raise InspectorError(f"{path} is a safetensors file but not an inspector capture (no 'inspector' header): make one "
                             "with `inspector capture`")
    text = metadata["inspector"]
    try:
        meta = json.loads(text) if isinstance(text, str) else None
    except (ValueError, RecursionError) as exc:
        raise InspectorError(f"{path}: its inspector header is not valid JSON ({str(exc)[:80]}): the file is damaged: capture "
                             "again") from None
    if not isinstance(meta, dict):
        raise InspectorError(f"{path}: header: the inspector header is not an object; the file is damaged or was not written "
                             "by inspector: capture again")
    return meta


# ---- what a command names, against the header (each check passes what it cannot read: load decides then) --------
def sites(meta: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The header's sites by name (entries that are no object with a string name are left to the full check)."""
    found = meta.get("sites") if isinstance(meta, dict) else None
    return {d["name"]: d for d in found if isinstance(d, dict) and isinstance(d.get("name"), str)} \
        if isinstance(found, list) else {}


def _inputs(meta: dict[str, Any]) -> list:
    """The header's input records, or none where ``inputs`` is not a list (the full check on load names that)."""
    found = meta.get("inputs") if isinstance(meta, dict) else None
    return found if isinstance(found, list) else []


def batch_size(meta: dict[str, Any]) -> int | None:
    """Rows in the captured batch, or None where the header does not say clearly."""
    rows = [r.get("batch") for r in _inputs(meta) if isinstance(r, dict)]
    if not rows or not all(isinstance(b, int) and not isinstance(b, bool) and b >= 0 for b in rows):
        return None
    return 1 + max(rows)


def texts(meta: dict[str, Any], roles: list[str] | tuple[str, ...] | None = None, batch: int = 0) -> dict[str, str]:
    """``{role: text}`` of batch row ``batch`` (only ``roles`` when given), from the header's input records."""
    out = {}
    for r in _inputs(meta):
        if isinstance(r, dict) and r.get("batch") == batch and isinstance(r.get("text"), str) \
                and isinstance(r.get("role"), str) and (roles is None or r["role"] in roles):
            out[r["role"]] = r["text"]
    return out
