"""What `hotsplit run` shows while the runtime runs (hotsplit_runtime.api `Watch`): progress bars,
notes, the run's header once it is built, and one hit-rate line per window (and, with
--log-jsonl, one JSON line)."""

from __future__ import annotations

from hotsplit_runtime import api
from rich.markup import escape

from hotsplit_cli.core.jsonio import dumps
from hotsplit_cli.output import Output

from . import _run_report as report
from ._run_ep import job_header


class RunWatch(api.Watch):
    def __init__(self, out: Output, request: api.RunRequest):
        self.out, self.request = out, request
        self.say = out.note if out.json_mode else out.print
        self.line = report.format_job_line if request.recipe.parallel.ep > 1 else report.format_line
        self.log = None  # the --log-jsonl file while it is written (_run_report.logged)

    def progress(self, label: str, total: float):
        return self.out.progress(label, total)

    def note(self, line: str) -> None:
        self.out.note(escape(line))

    def ready(self, header: api.RunHeader) -> None:
        rec = self.request.recipe
        if header.parallel["ep"] > 1:
            job_header(self.say, self.request, header)
        elif rec.model.kind == "hf":
            self.say(escape(report.checkpoint_words(rec, header)))
        else:
            report.describe(self.say, rec.name, header)

    def record(self, record) -> None:
        self.say(self.line(record))
        if self.log is not None:
            self.log.write(dumps(record.to_doc(), indent=False) + b"\n")
            self.log.flush()
