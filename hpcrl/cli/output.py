"""Printing helpers shared by the command modules: Rich tables or stable JSON, and warnings."""

from __future__ import annotations

import json
import os
import sys
from typing import Any


class _LazyConsole:
    """A Rich Console made on first use: commands that print no table never import Rich."""

    def __init__(self, stderr: bool) -> None:
        self._stderr = stderr
        self._console: Any = None  # a rich.console.Console once made

    def __getattr__(self, name: str) -> Any:
        return getattr(self._get(), name)

    def _get(self) -> Any:
        """The Console itself (made now if not yet)."""
        if self._console is None:
            from rich.console import Console

            # Piped or logged output (no terminal) gets a wide page instead of Rich's 80 columns,
            # so tables stay one row per line in job logs and CI; COLUMNS still wins when set.
            stream = sys.stderr if self._stderr else sys.stdout
            width = None if stream.isatty() or os.environ.get("COLUMNS") else 160
            self._console = Console(width=width, stderr=self._stderr)
        return self._console


console = _LazyConsole(stderr=False)
err_console = _LazyConsole(stderr=True)


def print_json(data: Any) -> None:
    """Write data as indented JSON with sorted keys (the stable --json schema)."""
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def table(title: str | None = None, **kwargs: Any) -> Any:
    """A Rich Table, imported only by the commands that print one."""
    from rich.table import Table

    return Table(title=title, **kwargs)


def progress(shown: bool = True) -> None:
    """Show the planner's progress lines (`hpcrl: planning N nodes: ...`) on stderr, where a person
    watches it: on a terminal, and not beside --json (a script reads those runs)."""
    import logging

    log = logging.getLogger("hpcrl.progress")
    if shown and sys.stderr.isatty() and not log.handlers:
        log.propagate = False
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("hpcrl: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)


def warn(message: str) -> None:
    """The one warning style of every command: `hpcrl: warning: ...` on stderr."""
    sys.stderr.write(f"hpcrl: warning: {message}\n")


def assumed(message: str) -> None:
    """What a plan assumed that the config did not say: `hpcrl: assumes ...` on stderr."""
    sys.stderr.write(f"hpcrl: {message}\n")
