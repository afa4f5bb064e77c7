"""`hpcrl watch RUN`: a run's snapshots, each from one batched Slurm query and the run directory's new bytes.

Read-only: the registry is read, never refreshed or written (`hpcrl status` does that), and nothing in the
run directory changes. A job Slurm has said is over is never asked about again.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

from hpcrl.errors import SlurmError
from hpcrl.jobs import slurm
from hpcrl.jobs.run_lookup import find_run_dir, newest_live_run
from hpcrl.logs.watch import RunReader
from hpcrl.logs.watch_model import SlurmView, Snapshot


def _phase(state: str) -> str:
    if state in slurm.PENDING_STATES:
        return "pending"
    if state == "COMPLETING":  # the batch script is over; Slurm waits for its processes
        return "completing"
    return "running" if state in slurm.RUNNING_STATES else "ended"


def view(v: slurm.JobView) -> SlurmView:
    """Slurm's answer in the reader's terms."""
    end = v.comment.removeprefix("hpcrl-end:") if v.comment.startswith("hpcrl-end:") else None
    return SlurmView(
        job_id=v.job_id,
        state=v.state,
        phase=_phase(v.state),
        reason=v.reason,
        time_left_s=v.time_left_s,
        time_limit_s=v.time_limit_s,
        nodes=v.nodes or None,
        node_count=v.node_count,
        comment_end=end,
    )


class Watcher:
    """One run followed across its chain: `snapshot()` asks Slurm once and reads what the files gained."""

    def __init__(self, run: str | None = None, registry: Path | None = None) -> None:
        run_dir, row = find_run_dir(run or newest_live_run(registry), registry, refresh=False)
        self.reader = RunReader(run_dir, row.to_dict() if row else None)
        self._over: dict[str, SlurmView] = {}  # jobs Slurm said are over: never asked again
        self.queries = 0  # Slurm queries made (one per snapshot at most)

    def snapshot(self) -> Snapshot:
        ids, ended = self.reader.chain()
        # The newest job until Slurm says it is over (its end line comes before the script's last steps);
        # an earlier one only while it has no end line.
        ask = [j for j in ids if j not in self._over and (j == ids[-1] or j not in ended)]
        views, note = dict(self._over), None
        if ask:
            self.queries += 1
            try:
                got = {k: view(v) for k, v in slurm.job_views(ask).items()}
            except SlurmError as exc:
                got, note = {}, str(exc)
            views.update(got)
            self._over.update({k: v for k, v in got.items() if v.phase == "ended"})
        return self.reader.snapshot(views, time.time(), note)


def follow(watcher: Watcher, every_s: float = 5.0) -> Iterator[Snapshot]:
    """Snapshots every `every_s` seconds until the run has ended (the last one says how)."""
    while True:
        snap = watcher.snapshot()
        yield snap
        if snap.ended:
            return
        time.sleep(every_s)


__all__ = ["Watcher", "follow", "view"]
