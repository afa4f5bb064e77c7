"""Printing helpers shared by the command modules: Rich tables or stable JSON."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from rich.console import Console

# Piped or logged output (no terminal) gets a wide page instead of Rich's 80 columns,
# so tables stay one row per line in job logs and CI; COLUMNS still wins when set.
_WIDTH = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 160
console = Console(width=_WIDTH)
err_console = Console(stderr=True, width=_WIDTH)


def print_json(data: Any) -> None:
    """Write data as indented JSON with sorted keys (the stable --json schema)."""
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
