"""Whether another user could steer a run directory: the run root checked as the job checks it.

The job script's `safe_path` (templates/ray.sh.j2) walks the run directory's path from / at every job
start, following each link, and refuses a level another user owns or may write (unless sticky, as
/tmp): that user could rename the run directory away and put a link in its place, and the job's
records, logs and the script its continuation runs would go where they chose. `hpcrl submit` makes
the same walk before anything is written, so such a run root is refused at once, in one line, not in
a queued job. With the profile's `storage.run_root_shared` (project directories the group shares), a
level another member owns or the group may write is a warning instead; a world-writable one never is.
"""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path
from typing import NamedTuple

MAX_LINKS = 40


class PathCheck(NamedTuple):
    problem: str | None  # why the path is refused; None when it may be used
    warnings: tuple[str, ...] = ()


def _who(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _you() -> str:
    """The user, as the refusals name the owners they accept: 'alice or root', or 'root'."""
    return _who(os.getuid()) + (" or root" if os.getuid() else "")


def _level(level: Path, st: os.stat_result, shared: bool, warnings: list[str]) -> str | None:
    """Why one directory of the path is unsafe (None: it is safe); a shared root's warnings go to warnings."""
    me = os.getuid()
    if not stat.S_ISDIR(st.st_mode):
        return f"{level} is not a directory"
    if st.st_uid not in (0, me):
        if not shared:
            return (
                f"{level} belongs to {_who(st.st_uid)}, not to {_you()}: its owner could rename the "
                "run directory away and put a link in its place"
            )
        warnings.append(
            f"{level} belongs to {_who(st.st_uid)}: its owner could rename the run directory away and "
            "put a link in its place (accepted: storage.run_root_shared)"
        )
    mode = stat.S_IMODE(st.st_mode)
    if mode & stat.S_ISVTX:
        return None
    if mode & stat.S_IWOTH or (mode & stat.S_IWGRP and not shared):
        return f"{level} is mode {mode:o}: other users could rename the run directory away and put a link in its place"
    if mode & stat.S_IWGRP:
        warnings.append(
            f"{level} is mode {mode:o}: members of its group could rename the run directory away and "
            "put a link in its place (accepted: storage.run_root_shared)"
        )
    return None


def check_run_dir(path: str | os.PathLike, *, shared: bool = False) -> PathCheck:
    """Walk path from / as the kernel does (links followed, each link root's or the user's); every
    directory that exists must be root's or the user's and writable by no one else unless sticky, and
    the run directory itself, when it exists, the user's. Levels still missing are the submit's own to make."""
    path = Path(os.path.abspath(os.path.expanduser(path)))
    warnings: list[str] = []
    todo, cur, hops, me = list(path.parts[1:]), Path("/"), 0, os.getuid()
    why = _level(cur, os.stat(cur), shared, warnings)
    while why is None and todo:
        part = todo.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            cur = cur.parent
            continue
        entry = cur / part
        try:
            st = entry.lstat()
        except FileNotFoundError:
            return PathCheck(None, tuple(warnings))
        except OSError as exc:
            return PathCheck(f"{entry} cannot be looked at ({exc.strerror})", tuple(warnings))
        if stat.S_ISLNK(st.st_mode):
            hops += 1
            if st.st_uid not in (0, me):
                why = f"{entry} is a link of {_who(st.st_uid)}, not of {_you()}: its owner could point it elsewhere"
            elif hops > MAX_LINKS:
                why = f"more than {MAX_LINKS} links on the way"
            else:
                target = Path(os.readlink(entry))
                if target.is_absolute():
                    cur = Path("/")
                todo = list(target.parts[1:] if target.is_absolute() else target.parts) + todo
            continue
        if not stat.S_ISDIR(st.st_mode):
            return PathCheck(None, tuple(warnings))  # not a directory: the submit's own mkdir says so
        cur = entry
        why = _level(cur, st, shared, warnings)
    if why is None and cur.exists() and not todo and os.stat(cur).st_uid != me:
        why = f"{cur} belongs to {_who(os.stat(cur).st_uid)}, not to {_who(me)}"
    return PathCheck(
        why
        and f"run dir {path}: {why}; refusing to write into it (set hpcrl.run_root to a directory "
        "of yours, or storage.run_root_shared: true where the site's project directories are "
        "shared)",
        tuple(warnings),
    )


__all__ = ["PathCheck", "check_run_dir"]
