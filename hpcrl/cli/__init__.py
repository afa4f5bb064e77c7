"""Command line: parses, calls one function, prints. Nothing else lives here."""

from __future__ import annotations

import gc
import os
import sys

from hpcrl.cli.app import app
from hpcrl.cli.commands import load
from hpcrl.errors import HpcrlError


def _skip_pydantic_plugins() -> None:
    """hpcrl's models are its own files' schema: no pydantic plugin has anything to watch there,
    and finding plugins scans every installed distribution's entry points (10-20 ms of start-up).
    PYDANTIC_DISABLE_PLUGINS is honoured as pydantic reads it; a pydantic without this cache is left alone."""
    if os.environ.get("PYDANTIC_DISABLE_PLUGINS") is not None:
        return
    try:
        from pydantic.plugin import _loader
    except ImportError:
        return
    if getattr(_loader, "_plugins", 0) is None:
        _loader._plugins = {}


def main(argv: list[str] | None = None) -> int:
    """Entry point: user errors become one line on stderr and exit status 2."""
    argv = sys.argv[1:] if argv is None else list(argv)
    # Start-up builds many long-lived objects (modules, schemas, classes) and no garbage cycles to
    # speak of: a collection every 100k allocations instead of every 700 saves ~8 ms; cycles
    # made by long-running commands (logs --follow) are still collected.
    gc.set_threshold(100_000)
    if argv and "--help" not in argv:  # help builds no model: leave pydantic unimported
        _skip_pydantic_plugins()
    # Command modules register themselves on `app` when imported: only the one argv names.
    load(argv)
    try:
        from typer.main import get_command

        from hpcrl.cli.argv import refuse_repeated_options

        command = get_command(app)
        refuse_repeated_options(command, argv)
        # Without standalone mode click returns typer.Exit's code instead of exiting.
        rc = command(args=argv, prog_name="hpcrl", standalone_mode=False)
        if isinstance(rc, int) and rc:
            return rc
    except HpcrlError as exc:
        sys.stderr.write(f"hpcrl: error: {exc}\n")
        return exc.exit_code
    except SystemExit as exc:  # typer.Exit inside commands
        return int(exc.code or 0)
    except Exception as exc:
        # Usage errors (bad option, missing value) are user errors too. Typer may vendor
        # its own click, so recognise them by shape rather than by class.
        if hasattr(exc, "format_message") and hasattr(exc, "exit_code"):
            if type(exc).__name__ == "NoArgsIsHelpError" and hasattr(exc, "show"):
                exc.show()  # a bare group: its help on stderr, exit 2, as click's standalone mode does
                return 2
            sys.stderr.write(f"hpcrl: error: {exc.format_message()}\n")
            return 2
        if type(exc).__name__ == "Abort":
            return 130
        raise
    return 0


def entry() -> None:
    rc = main()
    if "sqlite3" in sys.modules:  # the registry's connection closes (and checkpoints its WAL) at teardown
        sys.exit(rc)
    # Everything else is written and closed by now (hpcrl starts no threads and registers no atexit
    # handler); skipping the interpreter's teardown of every module and schema saves 20-30 ms.
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (BrokenPipeError, ValueError):  # a reader that went away (`| head`), or a closed stream
        pass
    os._exit(rc)
