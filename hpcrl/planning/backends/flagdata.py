"""The flag tables of hpcrl/planning/backends/data/ (facts read from upstream at a pinned commit)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DATA = Path(__file__).with_name("data")


def load_table(filename: str) -> dict[str, dict[str, Any]]:
    """Flag or key name -> its facts (default, type, ...), without the `_meta` entry."""
    data = json.loads((DATA / filename).read_text())
    return {k: v for k, v in data.items() if not k.startswith("_")}


def load_meta(filename: str) -> dict[str, Any]:
    """The table's `_meta` entry: upstream repository, commit, entry point, renames."""
    meta: dict[str, Any] = json.loads((DATA / filename).read_text())["_meta"]
    return meta
