"""One live chain per run directory, whichever registry submitted it: the lock file hpcrl/chain.lock.

The file names the chain's newest job (its owner). `submit` holds its flock while it checks that
the owner is not live in Slurm, sbatches, and writes the new job's id; the job does the same at
start (the batch script's claim_run_dir) and writes its continuation's id when it chains one. The
flock is only held for that check-and-write, never for a job's life: a process the job left
behind cannot keep the run dir from the next chain. A registry sees only its own runs; this file
is what two registries (HPCRL_REGISTRY) sharing one run dir both see.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator

from hpcrl.errors import HpcrlError
from hpcrl.jobs import slurm
from hpcrl.jobs.run_dir import RunDir

LOCK_WAIT_S = 30  # others hold it for one sbatch at most


class ChainLock:
    """The held lock of one run dir: who owns it, and how to hand it to a new job."""

    def __init__(self, fd: int, rd: RunDir):
        self._fd, self.rd = fd, rd

    def owner(self) -> str | None:
        """The job id the file names; None when empty or garbled."""
        os.lseek(self._fd, 0, os.SEEK_SET)
        words = os.read(self._fd, 256).decode(errors="replace").split()
        return words[0] if words and words[0].isdigit() else None

    def refuse_live_owner(self) -> None:
        """Raise when the owner is a job Slurm still has pending or running."""
        owner = self.owner()
        if owner is None:
            return
        state = slurm.job_states([owner])[owner].state
        if state in slurm.LIVE_STATES:
            raise HpcrlError(
                f"run dir {self.rd.path} belongs to job {owner} ({state}), the live chain of another submit "
                f"(another registry or a hand sbatch: {self.rd.chain_lock}); cancel job {owner} there, or pick another "
                "hpcrl.run_name"
            )

    def set_owner(self, job_id: str) -> None:
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, f"{job_id}\n".encode(), 0)


@contextlib.contextmanager
def held(rd: RunDir) -> Iterator[ChainLock]:
    """The run dir's chain lock, waited for up to LOCK_WAIT_S; the file is made 0600."""
    fd = os.open(rd.chain_lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise HpcrlError(
                        f"{rd.chain_lock}: still locked after {LOCK_WAIT_S} s by another submit or "
                        "job of this run dir; try again"
                    ) from None
                time.sleep(0.2)
        yield ChainLock(fd, rd)
    finally:
        os.close(fd)  # closing the only descriptor releases the flock


__all__ = ["ChainLock", "held"]
