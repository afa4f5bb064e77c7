"""The watchdog's record of step and checkpoint-write times (D/hpcrl/step-times.jsonl; stdlib only).

The StepClock (hpcrl/logs/step_times.py) turns driver lines into records; this appends them and
watches the checkpoint marker's mtime. A write that fails (a full disk) is reported, never raised.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from hpcrl.logs.driver_log import Step
from hpcrl.logs.step_times import StepClock
from hpcrl.runtime.watchdog_io.driver_log_file import say


class TimeRecorder:
    """Appends the StepClock's records to step-times.jsonl; watches the checkpoint marker's mtime."""

    def __init__(self, clock: StepClock, path: Path, marker: Path | None = None) -> None:
        self.clock, self.path, self.marker = clock, path, marker
        self.marker_mtime = self._mtime()  # a marker from an earlier job is no write of this one
        self.next_look = 0.0
        self.failed: str | None = None  # the last error said, so a full disk is said once, not per line

    def _mtime(self) -> float | None:
        try:
            return self.marker.stat().st_mtime if self.marker else None
        except OSError:
            return None

    def _append(self, records: list[dict]) -> None:
        if not records:
            return
        try:
            with open(self.path, "a") as f:
                f.write("".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
        except OSError as exc:  # a full disk must not stop the breaker
            if exc.strerror != self.failed:
                say(f"cannot record step times in {self.path}: {exc.strerror}")
            self.failed = exc.strerror
            return
        if self.failed:
            say(f"recording step times in {self.path} again")
            self.failed = None

    def line(self, text: str, step: Step | None) -> None:
        now = time.time()
        recs = self.clock.step(step, now) if step is not None else []
        self._append(recs + [r for r in [self.clock.line(text, now)] if r])

    def tick(self, mono: float) -> None:
        if self.marker is None or mono < self.next_look:
            return
        self.next_look = mono + 1.0
        mtime = self._mtime()
        if mtime is not None and mtime != self.marker_mtime:
            self.marker_mtime = mtime
            self._append([r for r in [self.clock.marker(mtime)] if r])
