"""Who holds the run registry's lock: the one line a locked registry is refused with.

SQLite's locks on the registry, its WAL and its shared-memory file are POSIX record locks; Linux
lists them, with the holder's pid, in /proc/locks. A command that waited LOCK_WAIT_S for a lock
(hpcrl/jobs/registry.py) names the processes that hold a write lock instead of waiting on silently.
"""

from __future__ import annotations

import os
from pathlib import Path

from hpcrl.errors import RegistryError


def lock_holders(path: Path) -> list[str]:
    """'pid N (command)' of each other process holding a write lock on the registry, its WAL or its
    shared-memory file (Linux /proc/locks; none elsewhere)."""
    ids = set()
    for f in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        try:
            st = f.stat()
        except OSError:
            continue
        ids.add(f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}")
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return []
    pids: dict[str, None] = {}
    for line in lines:
        words = line.split()
        if (
            len(words) >= 6
            and words[1] != "->"
            and words[3] == "WRITE"
            and words[5] in ids
            and words[4] != str(os.getpid())
        ):
            pids[words[4]] = None
    out = []
    for pid in pids:
        try:
            raw = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            cmd = " ".join(raw.replace("\0", " ").split())
        except OSError:
            cmd = ""
        out.append(f"pid {pid}" + (f" ({cmd[:80]})" if cmd else ""))
    return out


def locked_error(path: Path, waited_s: float) -> RegistryError:
    """The one line for a registry another process kept locked for waited_s seconds."""
    holders = lock_holders(path)
    who = f"by {', '.join(holders[:3])}" if holders else "by another process"
    return RegistryError(
        f"registry {path} is locked {who}; waited {waited_s:g} s for it: try again once that has finished (or stop it)"
    )


__all__ = ["lock_holders", "locked_error"]
