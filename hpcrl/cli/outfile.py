"""Where a command's output file goes (`render -o`, `init -o`, `report --markdown`, `--plot`): one writer.

The rules (docs/cli.md, "Output files"): `-` is stdout; a regular file, or a path that does not exist
yet, is written whole through a temporary file in the same directory and renamed over it, so a reader
never sees half a file and a failed command leaves the old one; a symlink is written through to its
target (the link stays a link); a directory, a device, a FIFO or a socket is refused with one line,
as is a file or directory the user cannot write. Nothing is replaced that is not a regular file:
`-o /dev/null` run as root once turned the machine's /dev/null into a file.
"""

from __future__ import annotations

import os
import stat
import sys
import tempfile
from pathlib import Path

from hpcrl.errors import HpcrlError

STDOUT = "-"
_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
)


def is_stdout(path: Path | str | None) -> bool:
    """Whether an output option names stdout (`-o -`)."""
    return path is not None and str(path) == STDOUT


def _kind(mode: int) -> str | None:
    """What a file that is not a regular file is, in words (None for a regular file)."""
    return next((what for test, what in _KINDS if test(mode)), None if stat.S_ISREG(mode) else "not a regular file")


def output_target(path: Path | str, flag: str, *, stdout_ok: bool = True) -> Path | None:
    """The regular file `flag PATH` will write (a symlink's target), or None for stdout; an HpcrlError
    naming the path and what is valid for anything else. Called before a command does its work, and
    again just before it writes."""
    if is_stdout(path):
        if not stdout_ok:
            raise HpcrlError(f"{flag} -: this command prints to stdout already; give a file path")
        return None
    given = str(path)
    if not given:
        raise HpcrlError(f"{flag} '': give a file name, or - for stdout")
    target = Path(os.path.realpath(os.path.expanduser(given)))  # through every symlink, to the file itself
    shown = f"{flag} {given}" + (f" (a link to {target})" if os.path.islink(os.path.expanduser(given)) else "")
    try:
        st = target.stat()
    except FileNotFoundError:
        st = None
    except OSError as exc:  # a symlink loop, a name too long, a component that is no directory
        raise HpcrlError(f"{shown}: cannot write there: {exc.strerror or exc}") from None
    if st is not None and (kind := _kind(st.st_mode)):
        raise HpcrlError(
            f"{shown}: {kind}; {flag} writes a regular file (give a file path, or {flag} - for stdout and redirect it)"
        )
    if st is not None and not os.access(target, os.W_OK):
        raise HpcrlError(f"{shown}: the file is not writable (permission denied)")
    directory = target.parent
    if not directory.is_dir():
        raise HpcrlError(f"{shown}: directory {directory} does not exist")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise HpcrlError(f"{shown}: cannot create a file in {directory} (permission denied)")
    return target


def write_output(
    path: Path | str, data: str | bytes, flag: str, mode: int | None = None, *, stdout_ok: bool = True
) -> None:
    """Write data where `flag PATH` says (output_target's rules): whole or not at all, with `mode` (None: a file
    replaced keeps its mode, a new one is 0644)."""
    target = output_target(path, flag, stdout_ok=stdout_ok)
    raw = data.encode() if isinstance(data, str) else data
    if target is None:
        sys.stdout.flush()
        sys.stdout.buffer.write(raw)
        sys.stdout.flush()
        return
    tmp = None
    try:
        keep = mode if mode is not None else target.stat().st_mode & 0o7777 if target.exists() else 0o644
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
            os.fchmod(fh.fileno(), keep)
        # The target may have changed since it was checked: still nothing but a regular file is replaced.
        try:
            kind = _kind(os.lstat(target).st_mode)
        except FileNotFoundError:
            kind = None
        if kind:
            raise HpcrlError(f"{flag} {path}: became {kind} while hpcrl wrote; nothing written")
        os.replace(tmp, target)
        tmp = None
    except OSError as exc:
        raise HpcrlError(f"{flag} {path}: cannot write: {exc.strerror or exc}") from None
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


__all__ = ["STDOUT", "is_stdout", "output_target", "write_output"]
