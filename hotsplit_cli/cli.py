"""The `hotsplit` command line: each command parses options, calls the library, renders.

torch and pynvml are imported lazily inside the commands that need them, so that
`hotsplit --help` and every planning command start without them.
"""

from __future__ import annotations

import importlib
import os
import sys

import typer

try:  # typer >= 0.20 vendors click; older releases raise click's own exceptions
    from typer import TyperException as _CliError
except ImportError:  # pragma: no cover - depends on the installed typer
    from click import ClickException as _CliError

from hotsplit_cli import __version__
from hotsplit_cli.commands.run import say_error
from hotsplit_cli.core.errors import HotsplitError, one_line_error
from hotsplit_cli.core.jsonio import forget_written, written_files
from hotsplit_cli.output import StdoutClosed, Switches


def _hide_flag_types() -> None:
    """A flag takes no value, so its help shows none: typer >= 0.2x prints `<bool>` beside every
    flag (`--json <bool>`), as if it wanted one. Options with a value keep their type. Patched on
    the class, once at import: typer makes its options itself and takes no option class to use."""
    try:
        from typer.core import TyperOption
    except ImportError:  # pragma: no cover - older typer prints no type on flags
        return
    shown = getattr(TyperOption, "display_type_rich", None)
    if shown is None:  # a typer without rich type columns (the one a CUDA image may bring) shows none
        return

    def display_type_rich(self, ctx):
        return None if self.is_flag else shown(self, ctx)

    TyperOption.display_type_rich = display_type_rich


_hide_flag_types()

app = typer.Typer(
    name="hotsplit",
    help="Serve MoE models on GPUs too small for every expert: probe, profile, plan, run.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
hist_app = typer.Typer(help="Inspect and import routing histograms.", no_args_is_help=True)
app.add_typer(hist_app, name="hist")

def _version(value: bool) -> None:
    if value:
        print(f"hotsplit {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks (also HOTSPLIT_DEBUG=1)."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """`--debug` is read by `main` from the whole command line (Switches.of)."""


def _register() -> None:
    # Command modules import the library at module level; torch (behind hotsplit_runtime.api),
    # matplotlib and pynvml are imported in the functions that use them, with a comment saying so
    # (tests/test_layers.py). Each exposes register(app, hist_app); a module that cannot be
    # imported is an error, never a command silently left out.
    for name in ("recipe", "plan", "hist_show", "ledger", "probe", "run", "selftest", "balance", "rerank",
                 "simulate", "place", "hist_import", "export"):
        importlib.import_module(f"hotsplit_cli.commands.{name}").register(app, hist_app)


_register()


def _say_error(line: str, exit_code: int) -> None:
    """Print the one error line (under torchrun, a refusal every rank makes alike is said once
    for the job: the runtime knows the launcher)."""
    say_error(line, exit_code)


def main(argv: list[str] | None = None) -> int:
    """Entry point: one-line errors, exit 1 (2 for usage), tracebacks only with --debug."""
    argv = sys.argv[1:] if argv is None else argv
    switches = Switches.of(argv)
    if "--debug" in argv[1:]:  # anywhere, not only before the command (typer takes it there alone)
        argv = [argv[0]] + [a for a in argv[1:] if a != "--debug"]
    forget_written()
    try:
        rc = app(args=argv, prog_name="hotsplit", standalone_mode=False, obj=switches)
    except HotsplitError as exc:
        if switches.debug and exc.message:
            raise
        if exc.message:  # empty: already reported (by its launcher)
            _say_error(exc.render(), exc.exit_code)
        return exc.exit_code
    except typer.Exit as exc:
        return exc.exit_code
    except (typer.Abort, KeyboardInterrupt):
        return _interrupted()
    except StdoutClosed:
        # The reader went away (`hotsplit ... | head`): stop quietly, as other command-line tools
        # do; files written so far are complete. 141 = 128 + SIGPIPE, what a shell reports.
        _silence_stdout()
        return 141
    except _CliError as exc:
        if switches.debug:
            raise
        ctx = getattr(exc, "ctx", None)
        cmd = f"{ctx.command_path} --help" if ctx is not None else "hotsplit --help"
        if type(exc).__name__ == "NoArgsIsHelpError":
            print(exc.format_message(), file=sys.stderr)  # the help text itself
            return 2
        code = getattr(exc, "exit_code", 2)
        _say_error(one_line_error(exc.format_message(), f"see `{cmd}`"), code)
        return code
    except Exception as exc:  # noqa: BLE001 - a bug, not a refusal: one line unless --debug
        if switches.debug:
            raise
        print(one_line_error(f"unexpected {type(exc).__name__}: {exc}",
                             "this is a bug in hotsplit: rerun with --debug and report the traceback"),
              file=sys.stderr)
        return 1
    if rc == 130:  # typer turns Ctrl-C into this return code when not standalone
        return _interrupted()
    return rc if isinstance(rc, int) else 0


def _interrupted() -> int:
    """Ctrl-C outside a command's own handling: say truthfully which files were written."""
    wrote = written_files()
    what = f"wrote {' and '.join(map(str, wrote))} before it" if wrote else "nothing was written"
    print(one_line_error("interrupted", what), file=sys.stderr)
    return 130


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that the interpreter's final flush cannot fail again."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # a test's captured stdout has no descriptor
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


def run_main() -> None:
    sys.exit(main())


if __name__ == "__main__":
    run_main()
