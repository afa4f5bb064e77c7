"""Where the shipped data (profiles, run configs, templates) lives, installed or in a checkout."""

from __future__ import annotations

from pathlib import Path

_PKG = Path(__file__).resolve().parent


def data_dir(name: str) -> Path:
    """Directory of shipped data `name` (clusters, configs, templates).

    A wheel carries them under hpcrl/_data/; an editable install or a checkout
    reads them from the repository root, so edits there take effect at once.
    """
    installed = _PKG / "_data" / name
    if installed.is_dir():
        return installed
    checkout = _PKG.parent / name
    if checkout.is_dir():
        return checkout
    raise FileNotFoundError(f"hpcrl data directory {name!r} is missing from this install")
