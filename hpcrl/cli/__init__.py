"""Command line: parses, calls one function, prints. Nothing else lives here."""

from __future__ import annotations

import sys

from hpcrl.cli.app import app
from hpcrl.errors import HpcrlError

# Command modules register themselves on `app` when imported.
from hpcrl.cli import commands  # noqa: F401,E402


def main(argv: list[str] | None = None) -> int:
    """Entry point: user errors become one line on stderr and exit status 2."""
    try:
        # Without standalone mode click returns typer.Exit's code instead of exiting.
        rc = app(args=argv, standalone_mode=False)
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
            if type(exc).__name__ == "NoArgsIsHelpError":
                return 2  # help was printed already
            sys.stderr.write(f"hpcrl: error: {exc.format_message()}\n")
            return 2
        if type(exc).__name__ == "Abort":
            return 130
        raise
    return 0


def entry() -> None:
    sys.exit(main())
