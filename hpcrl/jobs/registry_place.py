"""Where the run registry is, and whether a missing one was never made or is gone.

A reading command makes no registry, so a missing one is "no runs yet", but only where none was ever
made: hpcrl notes each registry it makes in `registries` in its data directory, and a registry that
was made and is gone, or whose named directory is gone (a file system not mounted, or failed), is an
error, never "0 runs".
"""

from __future__ import annotations

import contextlib
import os
from datetime import datetime, timezone
from pathlib import Path

from platformdirs import user_data_dir

from hpcrl.errors import RegistryError


def now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def known_registries_file() -> Path:
    """Where hpcrl notes each registry it made (the user data dir, as node_excludes.data_dir)."""
    return Path(os.environ.get("HPCRL_DATA_DIR") or user_data_dir("hpcrl")) / "registries"


def note_made(path: Path) -> None:
    with contextlib.suppress(OSError):
        known = known_registries_file()
        known.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(known, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, f"{os.path.realpath(path)}\t{now()}\n".encode())
        finally:
            os.close(fd)


def existing(path: Path) -> Path | None:
    """The registry's path when it exists; None when no registry was made yet (a reading command makes
    none). A registry that was there and is gone, one whose directory is gone (a file system not mounted,
    or failed) or one that cannot be looked at is an error, never "no runs"."""
    try:
        path.stat()
        return path
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise RegistryError(
            f"registry {path}: cannot be read ({exc.strerror}); its file system may have failed"
        ) from None
    try:
        made = [ln.split("\t") for ln in known_registries_file().read_text().splitlines()]
    except OSError:
        made = []
    when = next((w[1] for w in made if len(w) == 2 and w[0] == os.path.realpath(path)), None)
    if when:
        raise RegistryError(
            f"registry {path} is gone (hpcrl made it at {when}): its file system is not mounted or "
            "failed, or the file was moved; give its place with --registry or $HPCRL_REGISTRY"
        )
    if path != Path(user_data_dir("hpcrl")) / "runs.db":  # a place the user named: it should be there
        parent = path.parent
        try:
            parent.stat()
        except FileNotFoundError:
            raise RegistryError(
                f"registry {path}: its directory {parent} is not there (a file system not mounted "
                "or failed, or a wrong --registry / $HPCRL_REGISTRY)"
            ) from None
        except OSError as exc:
            raise RegistryError(f"registry {path}: its directory {parent} cannot be read ({exc.strerror})") from None
    return None


__all__ = ["existing", "known_registries_file", "note_made"]
