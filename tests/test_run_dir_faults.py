"""A run directory whose file system fails under a running job, on the real local Slurm.

The run root is an ext4 image on a loop device (root only, as CI runs). Two faults, as they
happen on a cluster:
- I/O errors mid-run: ext4's shutdown ioctl (EXT4_IOC_SHUTDOWN, what `xfs_io -x -c shutdown`
  sends) after the driver is up; every open and write then fails with EIO, as on a storage
  target that went away. No device-mapper here (no dm module), so this is the EIO stand-in.
- a full disk mid-run: a file that takes every free block (mkfs -m 0: root, which runs the
  jobs here, gets no reserved blocks either).
Each must end with the reason recorded (jobs.tsv or its fallback), nothing of the job left on any
node, and `hpcrl status` naming the reason in one line. The mounts never outlive a test.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from hpcrl.jobs.run_dir import RunDir, read_chain
from lifecycle_harness import behave, config, driver_started, hpcrl, nothing_of_the_job_left, ok_json, wait_status

KILL_WAIT_S = 20  # scripts/dev-slurm's KillWait
# linux/fs.h: _IOR('X', 125, __u32), shared by ext4 and XFS; flag 2 = shut down without flushing the log.
FS_SHUTDOWN, NOLOGFLUSH = (2 << 30) | (4 << 16) | (ord("X") << 8) | 125, 2


@pytest.fixture
def loop_root(tmp_path):
    """An ext4 file system on a loop device, mounted for the test and unmounted after it, whatever happens."""
    if os.geteuid() != 0 or not shutil.which("mkfs.ext4"):
        pytest.skip("a loop-device file system needs root and mkfs.ext4 (CI runs as root)")
    image, mnt = tmp_path / "root.img", tmp_path / "mnt"
    mnt.mkdir()
    with open(image, "wb") as f:
        f.truncate(64 << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", str(image)], check=True, capture_output=True)
    res = subprocess.run(["mount", "-o", "loop", str(image), str(mnt)], capture_output=True, text=True)
    if res.returncode:
        pytest.skip(f"cannot mount a loop device here: {res.stderr.strip()}")
    try:
        yield mnt
    finally:
        # Lazy: a process of a failed test may still hold it; the loop device goes with the last user.
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def fallback_end(job: str, head: str) -> tuple[str, str] | None:
    """(reason, exit code) of the job's end line in its node-local fallback on the head node (a
    private hpcrl-ended-<job>.XXX directory, docs/run-dir.md)."""
    lines = []
    for kept in (Path("/tmp/hpcrl-local") / head).glob(f"hpcrl-ended-{job}.*/jobs.tsv"):
        assert kept.parent.stat().st_mode & 0o777 == 0o700, kept
        lines += kept.read_text().splitlines()
    ends = [ln.split("\t")[3] for ln in lines if ln.split("\t")[1:2] == ["end"]]
    return tuple(ends[-1].split(":")) if ends else None


def start_run(env, name: str, root: Path) -> tuple[str, str, RunDir]:
    env["root"] = root
    # A generous time limit and wait: the shared test machine can take minutes to start Ray.
    out = ok_json(hpcrl(env, "submit", "--json", "--config", str(config(env, name, nodes=2, time_="00:20:00"))))
    rd = RunDir(root / name)
    wait_status(env, out["run_id"], driver_started(rd, out["job_id"]), "the driver to start on 2 nodes", deadline_s=900)
    return out["run_id"], out["job_id"], rd


def status_line(env, run_id: str) -> str:
    proc = hpcrl(env, "status", run_id)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    return proc.stdout.splitlines()[0]


def test_io_errors_under_a_running_job(slurm, env, loop_root):
    """EIO mid-run: the job stops its driver, records run-dir-unwritable in its node-local fallback
    and its Slurm comment, stops Ray on both nodes; status, logs and report say so in one line."""
    behave(env, sleep=300)
    run_id, job, rd = start_run(env, "eio", loop_root)
    head = read_chain(rd)[job].start
    fd = os.open(loop_root, os.O_RDONLY)
    try:
        fcntl.ioctl(fd, FS_SHUTDOWN, struct.pack("I", NOLOGFLUSH))
    finally:
        os.close(fd)
    final = wait_status(env, run_id, lambda r: r["state"] == "ended", "the job to end", deadline_s=400)
    end = fallback_end(job, head)
    assert end and end[0] == "run-dir-unwritable", end
    assert final["reason"] == "run-dir-unwritable", final
    assert nothing_of_the_job_left(rd.path, job, KILL_WAIT_S + 5) == []
    assert status_line(env, run_id).startswith(f"{run_id} ended (run-dir-unwritable)")
    for args in (["logs", run_id], ["report", run_id]):
        proc = hpcrl(env, *args)
        err = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(err) == 1 and "run-dir-unwritable" in err[0], (args, proc.stderr)


def test_a_full_disk_under_a_running_job(slurm, env, loop_root):
    """The disk fills while the driver runs, and the driver then fails (as one that cannot write its
    checkpoint does): the end is run-dir-full, never crashed, and nothing of the job is left."""
    behave(env, sleep=20, exit_code=1)
    run_id, job, rd = start_run(env, "full", loop_root)
    head = read_chain(rd)[job].start
    for i, block in enumerate(("1M", "1k")):  # the last free 1 KiB blocks too
        subprocess.run(["dd", "if=/dev/zero", f"of={loop_root / f'filler{i}'}", f"bs={block}"], capture_output=True)
    # And the slack of driver.log's last block: the watchdog's next write there meets ENOSPC.
    with open(rd.meta / "driver.log", "ab", buffering=0) as log:
        for size in (1024, 64, 1):  # ext4 refuses a write larger than the slack left: smaller ones
            with pytest.raises(OSError, match="No space left"):
                while True:
                    log.write(b"f" * (size - 1) + b"\n" if size > 1 else b"\n")
    assert os.statvfs(loop_root).f_bavail == 0
    final = wait_status(env, run_id, lambda r: r["state"] == "ended", "the job to end", deadline_s=400)
    recorded = read_chain(rd).get(job)
    end = (
        (recorded.end_reason, str(recorded.exit_code)) if recorded and recorded.end_reason else fallback_end(job, head)
    )
    assert end == ("run-dir-full", "88"), (end, final)
    assert final["reason"] == "run-dir-full", final
    assert nothing_of_the_job_left(rd.path, job, KILL_WAIT_S + 5) == []
    assert status_line(env, run_id).startswith(f"{run_id} ended (run-dir-full)")
