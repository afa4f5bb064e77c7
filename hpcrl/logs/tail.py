"""Reading a file that grows, from where the last read stopped (pure: files only, no process).

`hpcrl watch` reads a run's logs, step-times.jsonl and GPU monitor CSVs every few seconds for days:
each refresh reads only the bytes appended since the one before, and a file first seen larger than
`start_bytes` is read from its last `start_bytes` (a multi-day log's start holds nothing a live view shows).
"""

from __future__ import annotations

import os
from pathlib import Path

# The most bytes one read takes from a file; the rest waits for the next refresh.
READ_LIMIT = 64 << 20


class Tail:
    """The complete lines appended to one file since the last call of `lines`; a torn last line waits."""

    def __init__(self, path: Path, start_bytes: int | None = None) -> None:
        self.path = path
        self.start_bytes = start_bytes
        self.offset: int | None = None  # None until the file is first opened
        self.skipped = 0  # bytes left unread at the file's start (start_bytes)
        self._rest = b""
        self._skip = False  # inside the fragment of a line before `start_bytes`
        self._ident: tuple[int, int] | None = None

    @property
    def seen(self) -> bool:
        return self.offset is not None

    def lines(self, limit: int = READ_LIMIT) -> list[str]:
        """New complete lines; [] when the file does not exist (yet). Other OSErrors are the caller's."""
        try:
            f = open(self.path, "rb")
        except FileNotFoundError:
            return []
        with f:
            st = os.fstat(f.fileno())
            ident = (st.st_dev, st.st_ino)
            # First read, a file replaced by another (a new inode) or truncated: start again.
            if self.offset is None or ident != self._ident or st.st_size < self.offset:
                self._ident, self._rest = ident, b""
                self.offset = 0 if self.start_bytes is None else max(0, st.st_size - self.start_bytes)
                self.skipped, self._skip = self.offset, self.offset > 0
            f.seek(self.offset)
            data = f.read(limit)
        self.offset += len(data)
        data = self._rest + data
        if self._skip:  # started inside the file: its first line is a fragment
            cut = data.find(b"\n")
            data, self._skip = (data[cut + 1 :], False) if cut >= 0 else (b"", True)
        *complete, self._rest = data.split(b"\n")
        return [line.decode(errors="replace") for line in complete]


__all__ = ["READ_LIMIT", "Tail"]
