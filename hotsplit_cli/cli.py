"""The `hotsplit` command line: each command parses options, calls the library, renders.

torch and pynvml are imported lazily inside the commands that need them, so that
`hotsplit --help` and every planning command start without them.
"""

from __future__ import annotations

import os
import sys

import typer

try:  # typer >= 0.20 vendors click; older releases raise click's own exceptions
    from typer import TyperException as _CliError
except ImportError:  # pragma: no cover - depends on the installed typer
    from click import ClickException as _CliError

from . import __version__
from .errors import HotsplitError

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

_DEBUG = {"on": os.environ.get("HOTSPLIT_DEBUG", "") not in ("", "0")}


def _version(value: bool) -> None:
    if value:
        print(f"hotsplit {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks (also HOTSPLIT_DEBUG=1)."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    if debug:
        _DEBUG["on"] = True


def _register() -> None:
    # Command modules import only numpy/typer at module level; heavy imports live in functions.
    # Each module exposes register(app, hist_app).
    for name in ("plan", "hist_show", "ledger", "probe", "run", "selftest", "balance", "rerank",
                 "simulate", "place", "hist_import"):
        try:
            module = __import__(f"hotsplit_cli.commands.{name}", fromlist=["register"])
        except ModuleNotFoundError as exc:
            if exc.name != f"hotsplit_cli.commands.{name}":
                raise
            continue
        module.register(app, hist_app)


_register()


def main(argv: list[str] | None = None) -> int:
    """Entry point: one-line errors, exit 1 (2 for usage), tracebacks only with --debug."""
    argv = sys.argv[1:] if argv is None else argv
    _DEBUG["on"] = "--debug" in argv or os.environ.get("HOTSPLIT_DEBUG", "") not in ("", "0")
    try:
        rc = app(args=argv, prog_name="hotsplit", standalone_mode=False)
    except HotsplitError as exc:
        if _DEBUG["on"]:
            raise
        print(exc.render(), file=sys.stderr)
        return exc.exit_code
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort:
        print("error: interrupted; nothing was written", file=sys.stderr)
        return 130
    except _CliError as exc:
        if _DEBUG["on"]:
            raise
        ctx = getattr(exc, "ctx", None)
        cmd = f"{ctx.command_path} --help" if ctx is not None else "hotsplit --help"
        if type(exc).__name__ == "NoArgsIsHelpError":
            print(exc.format_message(), file=sys.stderr)  # the help text itself
            return 2
        print(f"error: {exc.format_message()}; see `{cmd}`", file=sys.stderr)
        return getattr(exc, "exit_code", 2)
    except KeyboardInterrupt:
        print("error: interrupted; nothing was written", file=sys.stderr)
        return 130
    if rc == 130:  # typer reports Ctrl-C as a return code when not standalone
        print("error: interrupted; nothing was written", file=sys.stderr)
        return 130
    return rc if isinstance(rc, int) else 0


def run_main() -> None:
    sys.exit(main())


if __name__ == "__main__":
    run_main()
