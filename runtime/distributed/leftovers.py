"""What a killed expert-parallel job leaves (cold bank segments in /dev/shm, the launcher's log
folder), removed by the next run: each name records its owner, the ranks' parent, as
`o<pid>.<start time>`; a file is a leftover when its owner no longer runs, never by its age."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

SHM_DIR = "/dev/shm"
LOG_PREFIX = "hotsplit-ep-"
_SEGMENT = re.compile(r"^hotsplit-.+-o(\d+)\.(\d+)-\d+$")  # shared_bank.shm_prefix + slab number
_FOLDER = re.compile(rf"^{LOG_PREFIX}o(\d+)\.(\d+)-")  # log_folder


def stat_fields(stat: Path) -> list[bytes]:
    """A /proc/PID/stat's fields after the command name (which may hold spaces and parentheses):
    [0] the state (b"Z": a zombie, ended but not reaped yet), [1] the parent pid, [19] the start time."""
    return stat.read_bytes().rsplit(b")", 1)[1].split()


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot; None when no such process runs (or
    only its zombie). 0 where /proc is not there (then the pid alone is compared)."""
    try:
        fields = stat_fields(Path(f"/proc/{pid}/stat"))
    except FileNotFoundError:
        return None
    except OSError:
        return _pid_runs(pid)
    return None if fields[0] == b"Z" else int(fields[19])


def _pid_runs(pid: int) -> int | None:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return 0


def owner_tag(pid: int) -> str:
    """`o<pid>.<start time>`, the owner recorded in a job's file names."""
    return f"o{pid}.{start_time(pid) or 0}"


def owner_runs(name: str, pattern: re.Pattern) -> bool | None:
    """Whether the owner recorded in `name` still runs; None when it is not a name `pattern`
    (with the owner's pid and start time as its groups) matches."""
    m = pattern.match(name)
    if m is None:
        return None
    pid, recorded = int(m.group(1)), int(m.group(2))
    now = start_time(pid)
    return now is not None and (recorded == 0 or now in (0, recorded))


def log_folder(owner_pid: int) -> str:
    """A new launcher log folder, named for its owner."""
    return tempfile.mkdtemp(prefix=f"{LOG_PREFIX}{owner_tag(owner_pid)}-")


@dataclass
class Removed:
    segments: list[str] = field(default_factory=list)
    segment_bytes: int = 0
    folders: list[str] = field(default_factory=list)


def remove_ended(shm_dir: str = SHM_DIR, log_dir: str | None = None) -> Removed:
    """Remove the cold bank segments and log folders whose owning job no longer runs. Files this
    user may not remove (another user's) are left alone."""
    out = Removed()
    for name in names_in(shm_dir):
        if owner_runs(name, _SEGMENT) is False:
            path = os.path.join(shm_dir, name)
            try:
                size = os.stat(path).st_size
                os.unlink(path)
            except OSError:
                continue
            out.segments.append(name)
            out.segment_bytes += size
    log_dir = log_dir or tempfile.gettempdir()
    for name in names_in(log_dir):
        path = os.path.join(log_dir, name)
        if owner_runs(name, _FOLDER) is False and os.path.isdir(path):
            try:
                shutil.rmtree(path)
            except OSError:
                continue
            out.folders.append(path)
    return out


def names_in(folder: str) -> list[str]:
    """The names in `folder`, sorted ([] when it cannot be listed)."""
    try:
        return sorted(os.listdir(folder))
    except OSError:
        return []


def removed_words() -> str | None:
    """Before a job starts: remove what killed jobs left on this node; what was removed, in one
    line (None: nothing)."""
    removed, parts = remove_ended(), []
    if removed.segments:
        n = len(removed.segments)
        parts.append(f"{n} shared-memory segment{'s' * (n != 1)} ({removed.segment_bytes / 2**20:,.1f} MiB) "
                     f"from {SHM_DIR}")
    if removed.folders:
        n = len(removed.folders)
        parts.append(f"{n} log folder{'s' * (n != 1)} ({', '.join(removed.folders)})")
    return f"removed what ended expert-parallel jobs left: {' and '.join(parts)}" if parts else None
