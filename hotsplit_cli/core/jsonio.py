"""Atomic JSON files with a schema tag.

Every output is written to a temp file in the destination folder, fsynced, then renamed over
the target: a crash or a bad input never leaves a truncated file or clobbers a good one.
A new file gets the user's umask mode; a replaced file keeps its permission bits (as `cp` does).
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from hotsplit_cli.core.errors import InputFileError

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


def output_problem(path: str | os.PathLike) -> tuple[str, str] | None:
    """Why `path` cannot be written as an output file, as (what is wrong, what to do); None when
    it can: not a folder or a device, and a file can be created in its folder (a temp file is
    created and removed to find out)."""
    path = Path(path)
    folder = path.parent
    if path.is_dir():
        return "is a folder", "name a file inside it"
    if path.exists() and not path.is_file():
        return "is not a regular file", "name a file (written atomically: a temp file renamed over it)"
    if not folder.exists():
        return f"folder {folder} does not exist", "create it first"
    if not folder.is_dir():
        return f"{folder} is not a folder", "name a file inside a folder"
    try:  # the one sure test (permissions, ACLs, read-only or pseudo file systems): create a file
        fd, tmp = _create_temp(folder, path.name)
    except OSError as exc:
        return f"cannot create a file in {folder} ({exc.strerror})", "choose another folder or fix its permissions"
    os.close(fd)
    tmp.unlink()
    return None


# Process-wide on purpose: every writer of the process records here, however deep, so that the
# entry point's Ctrl-C message can say truthfully what was written (cli.main forgets it per run).
_WRITTEN: list[Path] = []  # every file this process has written, in order


def written_files() -> list[Path]:
    """The files written since the last `forget_written()` (for a truthful message on Ctrl-C)."""
    return list(_WRITTEN)


def forget_written() -> None:
    _WRITTEN.clear()


def _create_temp(folder: Path, name: str) -> tuple[int, Path]:
    """A new temp file next to the target, created with mode 0666 so that the kernel applies the
    umask (and a folder's default ACL) as for any new file; mkstemp would make it 0600."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        tmp = folder / f".{name}.{secrets.token_hex(4)}.tmp"
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temp file name for {name} in {folder}")


def write_atomic(path: str | os.PathLike, write: Callable[[Any], None], mode: str = "wb") -> Path:
    """Write a file atomically: `write(fh)` fills a temp file that is fsynced and renamed.

    A new file gets the umask's mode (0644 under umask 022); a file that is replaced keeps its
    permission bits, as `cp` and editors do."""
    path = Path(path)
    problem = output_problem(path)
    if problem:
        raise InputFileError(f"cannot write {path}: {problem[0]}", problem[1])
    try:
        fd, tmp = _create_temp(path.parent, path.name)
    except OSError as exc:
        raise InputFileError(f"cannot write {path} ({exc.strerror})", "choose another folder") from None
    try:
        with os.fdopen(fd, mode) as fh:
            if path.exists():
                os.fchmod(fh.fileno(), path.stat().st_mode & 0o777)
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
    _WRITTEN.append(path)
    return path


def write_json_atomic(path: str | os.PathLike, doc: Any) -> Path:
    """Serialise `doc` and write it atomically. Serialisation happens before the file opens."""
    data = dumps(doc)
    return write_atomic(path, lambda fh: fh.write(data))


def schema_tag(kind: str, version: int = 1) -> str:
    return f"hotsplit.{kind}/{version}"


# The commands that read each hotsplit file kind, for an error that names a file given to the wrong one.
TAKEN_BY = {"hist": "`hotsplit plan HIST`, `hist show`, `simulate --fit`", "plan": "`run --plan`, `simulate --plan`",
            "platform": "`plan --platform`, `run --platform`", "placement": "`plan --placement`",
            "trace": "`run --trace`, `simulate --trace`"}


def sniff_kind(path: str | os.PathLike) -> str | None:
    """What a file is, from its first bytes, as a user reads it: a hotsplit JSON kind (and which
    command takes it), a routing trace (.npz), a torch dump, an image; None when unknown."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(512)
    except OSError:
        return None
    if head.startswith(b"PK\x03\x04"):
        import zipfile

        try:
            with zipfile.ZipFile(path) as z:
                names = z.namelist()
        except (zipfile.BadZipFile, OSError):
            return "a zip archive"
        if any(n.endswith("data.pkl") for n in names):
            return "a torch.save dump (`hotsplit hist import --from sglang|vllm` reads these)"
        if "topk_ids.npy" in names:
            return f"a routing trace (.npz; {TAKEN_BY['trace']} take it)"
        return "a .npz or zip archive"
    if head.startswith(b"\x93NUMPY"):
        return "a numpy .npy array"
    if head.startswith(b"\x89PNG"):
        return "a PNG image"
    text = head.lstrip()
    if text.startswith(b"{"):
        import re

        m = re.search(rb'"schema"\s*:\s*"hotsplit\.([a-z_]+)/\d+"', head)
        if m:
            kind = m.group(1).decode()
            takers = TAKEN_BY.get(kind)
            return f"a hotsplit.{kind} file" + (f" ({takers} take it)" if takers else "")
        return "a JSON file"
    return None


def read_json(path: str | os.PathLike, error: type[InputFileError] = InputFileError, *,
              nonfinite: bool = False) -> Any:
    """Parse a JSON file; every failure is `error` naming the file. `nonfinite`: also accept the
    NaN and Infinity literals orjson refuses, so that the caller's check can name the entry."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise error(f"{path}: no such file", "check the path") from None
    except OSError as exc:
        raise error(f"{path}: cannot read ({exc.strerror})") from None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        problem: Exception = exc
    if nonfinite:
        try:
            return json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            problem = exc
    kind = sniff_kind(path)
    if kind and not kind.startswith(("a hotsplit.", "a JSON")):  # a truncated JSON file stays one
        raise error(f"{path}: is {kind}, not JSON", "pass the file this option asks for") from None
    raise error(f"{path}: not valid JSON ({problem})", "was the file truncated?") from None


def read_json_doc(path: str | os.PathLike, kind: str, versions: tuple[int, ...] = (1,)) -> dict:
    """Read a hotsplit JSON file and check its `schema` is `hotsplit.<kind>/<v>` for a known v."""
    doc = read_json(path)
    if not isinstance(doc, dict):
        raise InputFileError(f"{path}: expected a JSON object, got {type(doc).__name__}")
    schema = doc.get("schema")
    known = [schema_tag(kind, v) for v in versions]
    if schema not in known:
        other = isinstance(schema, str) and schema.startswith("hotsplit.") and schema.split("/")[0][9:] != kind
        if other:
            raise InputFileError(f"{path}: is {sniff_kind(path)}, not a hotsplit.{kind} file",
                                 "pass the file this option asks for")
        raise InputFileError(
            f"{path}: schema {schema!r} is not {' or '.join(known)}",
            "was it written by another tool or a newer hotsplit?",
        )
    return doc
