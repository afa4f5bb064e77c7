"""The driver's log file under the watchdog, which a full or failing run directory cannot stop.

Standard library only (the in-job runtime).
"""

from __future__ import annotations

import errno
import os
import sys
import time
from pathlib import Path

from hpcrl.contract import RUN_DIR_UNWRITABLE

# The errors that mean the file system has no room for us: the driver may run on.
NO_ROOM = (errno.ENOSPC, errno.EDQUOT)


class DriverLog:
    """The driver's log file, which never stops the watchdog: no room drops lines (and retries after
    retry_s); any other error (EIO, EROFS) leaves `broken` set, and the caller stops the driver."""

    def __init__(self, path: Path, retry_s: float = 10.0):
        self.path, self.retry_s = path, retry_s
        self.fd: int | None = None
        self.full_since: float | None = None  # monotonic time of the first write refused for room
        self.dropped = 0
        self.broken: OSError | None = None
        self._open()

    def _open(self) -> None:
        try:
            self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        except OSError as exc:
            self._failed(exc)

    def _failed(self, exc: OSError) -> None:
        if exc.errno in NO_ROOM:
            if self.full_since is None:
                self.full_since = time.monotonic()
                say(
                    f"{self.path}: {exc.strerror}: dropping the driver's log lines until there is room "
                    "(the console still gets them, the breakers still read them)"
                )
        elif self.broken is None:
            self.broken = exc
            say(
                f"{self.path}: {exc.strerror}: the run directory cannot be written; stopping the driver "
                f"({RUN_DIR_UNWRITABLE})"
            )

    def write(self, raw: bytes) -> None:
        if self.broken is not None:
            return
        now = time.monotonic()
        if self.full_since is not None and now - self.full_since < self.retry_s:
            self.dropped += 1
            return
        try:
            if self.fd is None:
                self._open()
                if self.fd is None:
                    self.dropped += 1
                    return
            if self.full_since is not None:  # room again: say what is missing, then go on
                os.write(self.fd, f"hpcrl-watchdog: {self.dropped} lines dropped while the disk was full\n".encode())
                self.full_since, self.dropped = None, 0
            os.write(self.fd, raw)
        except OSError as exc:
            self.dropped += 1
            if exc.errno in NO_ROOM and self.full_since is not None:
                self.full_since = now  # still full: wait retry_s again
            self._failed(exc)

    def full(self) -> bool:
        """Whether its file system has no room now (a write refused, or no block free)."""
        if self.full_since is not None:
            return True
        try:
            return os.statvfs(self.path.parent).f_bavail == 0
        except OSError:
            return False

    def close(self) -> None:
        if self.fd is not None:
            try:
                os.close(self.fd)
            except OSError:
                pass


def say(text: str) -> None:
    try:
        sys.stderr.write(f"hpcrl-watchdog: {text}\n")
        sys.stderr.flush()
    except OSError:
        pass
