"""Rank 0 to the launcher that started it: the job's notes, set-up, windows and result, each
event one pickled file in the job's folder (written, then renamed), read in order by the
launcher on a thread and passed to the caller's `Watch`."""

from __future__ import annotations

import os
import pickle
import signal
import threading
from pathlib import Path

from ..request import RunHeader, RunResult, Watch

POLL_S = 0.05  # how often the launcher looks for rank 0's next event


class RankChannel(Watch):
    """Rank 0's side: what the job shows, sent to the launcher (other ranks send nothing)."""

    def __init__(self, folder: str | Path, rank: int):
        self.folder, self.rank, self.sent = Path(folder), rank, 0

    def _send(self, kind: str, value) -> None:
        if self.rank != 0:
            return
        tmp = self.folder / f".event{self.sent:08d}"
        tmp.write_bytes(pickle.dumps((kind, value)))
        tmp.rename(self.folder / f"event{self.sent:08d}")
        self.sent += 1

    def ready(self, header: RunHeader) -> None:
        self._send("ready", header)

    def note(self, line: str) -> None:
        self._send("note", line)

    def record(self, record) -> None:
        self._send("record", record)

    def result(self, result: RunResult | None) -> None:
        self._send("result", result)


class LauncherTail:
    """The launcher's side: rank 0's events passed to `watch`. A failure there (stdout's reader went
    away) stops the job through SIGTERM to this process; `error` keeps it for the launcher."""

    def __init__(self, folder: str | Path, watch: Watch):
        self.folder, self.watch = Path(folder), watch
        self.read, self.result, self.error = 0, None, None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="hotsplit-rank0-events", daemon=True)

    def __enter__(self) -> LauncherTail:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join()

    def _follow(self) -> None:
        while True:
            done = self._done.is_set()  # read before the folder: an event written before the end is seen
            try:
                self._deliver()
            except BaseException as exc:  # noqa: BLE001 - raised by the launcher, once the ranks are stopped
                self.error = exc
                if not done:  # the agent still watches the ranks
                    os.kill(os.getpid(), signal.SIGTERM)
                return
            if done:
                return
            self._done.wait(POLL_S)

    def _deliver(self) -> None:
        while (path := self.folder / f"event{self.read:08d}").exists():
            kind, value = pickle.loads(path.read_bytes())
            self.read += 1
            if kind == "result":
                self.result = value
            else:
                getattr(self.watch, kind)(value)
