"""The watchdog's sign of life: a file on node-local storage whose modification time it sets.

The job script ends the job watchdog-hung (hpcrl/contract.py) when the beats stop: a watchdog blocked
on a hung run directory, or stopped, cannot see a hang any more. Standard library only.
"""

from __future__ import annotations

import os
from pathlib import Path

from hpcrl.contract import WATCHDOG_BEAT_S


class Heartbeat:
    """The watchdog's sign of life: FILE's modification time, set at most every beat_s seconds."""

    def __init__(self, path: Path | None, beat_s: float = WATCHDOG_BEAT_S):
        self.path, self.beat_s, self.next_at = path, beat_s, 0.0

    def beat(self, now: float) -> None:
        if self.path is None or now < self.next_at:
            return
        self.next_at = now + self.beat_s
        try:
            os.utime(self.path)
        except FileNotFoundError:
            try:
                self.path.touch()
            except OSError:
                pass
        except OSError:  # the job script then sees no beat, which is the truth
            pass


__all__ = ["Heartbeat"]
