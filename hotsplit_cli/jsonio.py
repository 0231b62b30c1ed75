"""Atomic JSON files with a schema tag.

Every output is written to a temp file in the destination folder, fsynced, then renamed over
the target: a crash or a bad input never leaves a truncated file or clobbers a good one.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from .errors import InputFileError

_OPTS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE


def _default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"cannot serialise {type(obj).__name__}")


def dumps(doc: Any, indent: bool = True) -> bytes:
    """Serialise with orjson; numpy arrays become nested lists. Keys keep insertion order."""
    opts = _OPTS if indent else orjson.OPT_SERIALIZE_NUMPY
    return orjson.dumps(doc, default=_default, option=opts)


def write_atomic(path: str | os.PathLike, write: Callable[[Any], None], mode: str = "wb") -> Path:
    """Write a file atomically: `write(fh)` fills a temp file that is fsynced and renamed."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise InputFileError(f"cannot write {path}: folder {folder} does not exist", "create it first")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, mode) as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        # Ctrl-C or any failure: drop the temp file, leave the old target untouched.
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path


def write_json_atomic(path: str | os.PathLike, doc: Any) -> Path:
    """Serialise `doc` and write it atomically. Serialisation happens before the file opens."""
    data = dumps(doc)
    return write_atomic(path, lambda fh: fh.write(data))


def schema_tag(kind: str, version: int = 1) -> str:
    return f"hotsplit.{kind}/{version}"


def read_json_doc(path: str | os.PathLike, kind: str, versions: tuple[int, ...] = (1,)) -> dict:
    """Read a hotsplit JSON file and check its `schema` is `hotsplit.<kind>/<v>` for a known v."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise InputFileError(f"{path}: no such file", "check the path") from None
    except OSError as exc:
        raise InputFileError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InputFileError(f"{path}: not valid JSON ({exc})", "was the file truncated?") from None
    if not isinstance(doc, dict):
        raise InputFileError(f"{path}: expected a JSON object, got {type(doc).__name__}")
    schema = doc.get("schema")
    known = [schema_tag(kind, v) for v in versions]
    if schema not in known:
        raise InputFileError(
            f"{path}: schema {schema!r} is not {' or '.join(known)}",
            "was it written by another tool or a newer hotsplit?",
        )
    return doc
