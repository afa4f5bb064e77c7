"""Where `-o FILE` (and --markdown, --plot) write (issue 39): a regular file, whole or not at all; a symlink
written through; a directory, a device or a FIFO refused with one line, left as it was."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from helpers import assert_user_error, run_hpcrl

RENDER = ("render", "--nodes", "16")


def test_o_onto_a_symlink_writes_its_target_and_leaves_the_link(tmp_path):
    target, link = tmp_path / "job.sbatch", tmp_path / "link.sbatch"
    target.write_text("old\n")
    link.symlink_to(target)
    out = run_hpcrl(*RENDER, "-o", str(link))
    assert out.returncode == 0, out.stderr
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text().startswith("#!/bin/bash")


def test_o_onto_a_dangling_symlink_creates_its_target(tmp_path):
    target, link = tmp_path / "new.sbatch", tmp_path / "link.sbatch"
    link.symlink_to(target)
    assert run_hpcrl("init", "-o", str(link)).returncode == 0
    assert link.is_symlink() and "hpcrl:" in target.read_text()


def test_o_onto_a_directory_is_one_line_and_writes_nothing(tmp_path):
    assert_user_error(run_hpcrl(*RENDER, "-o", str(tmp_path)), f"-o {tmp_path}: a directory")
    assert list(tmp_path.iterdir()) == []


def test_o_onto_a_fifo_with_a_reader_is_refused_and_the_fifo_stays(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()  # blocks in open() until a writer comes: hpcrl must not be it
    err = assert_user_error(run_hpcrl(*RENDER, "-o", str(fifo)), "a FIFO (named pipe)")
    assert "-o -" in err
    with open(fifo, "wb"):  # let the reader finish: it must have read nothing from hpcrl
        pass
    reader.join(10)
    assert got == [b""] and stat.S_ISFIFO(fifo.lstat().st_mode)


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod of a character device needs root")
def test_o_onto_a_character_device_leaves_it_a_device(tmp_path):
    """As root the old writer renamed a temporary file over /dev/null; a copy of /dev/null made here stands in."""
    dev = tmp_path / "null"
    os.mknod(dev, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    assert_user_error(run_hpcrl(*RENDER, "-o", str(dev)), f"-o {dev}: a character device")
    assert stat.S_ISCHR(dev.lstat().st_mode)
    assert_user_error(run_hpcrl("init", "--force", "-o", str(dev)), "a character device")
    assert stat.S_ISCHR(dev.lstat().st_mode)


def test_o_dash_writes_the_script_to_stdout(tmp_path):
    out = run_hpcrl(*RENDER, "-o", "-", cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.startswith("#!/bin/bash") and list(tmp_path.iterdir()) == []


def test_o_into_a_missing_directory_is_one_line_before_any_planning(tmp_path):
    # A config that cannot plan: the -o problem is found first, so it is the one line.
    out = run_hpcrl(*RENDER, "--set", "hpcrl.nodess=3", "-o", str(tmp_path / "no" / "job.sbatch"))
    assert_user_error(out, f"directory {tmp_path / 'no'} does not exist")


def test_a_failed_render_leaves_the_old_file_and_creates_none(tmp_path):
    old, new = tmp_path / "old.sbatch", tmp_path / "new.sbatch"
    old.write_text("keep me\n")
    for path in (old, new):
        assert_user_error(run_hpcrl(*RENDER, "--set", "hpcrl.time=0", "-o", str(path)), "hpcrl.time")
    assert old.read_text() == "keep me\n" and not new.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.sbatch"]  # no temporary file left either


def test_report_and_plan_memory_refuse_a_directory_before_reading_anything(tmp_path):
    # The run does not exist: the output flag is still what the one line names.
    assert_user_error(
        run_hpcrl("report", str(tmp_path / "no-run"), "--markdown", str(tmp_path)),
        f"--markdown {tmp_path}: a directory",
    )
    assert_user_error(run_hpcrl("plan-memory", "--plot", str(tmp_path)), f"--plot {tmp_path}: a directory")


def test_a_dry_run_whose_script_cannot_be_written_records_no_run(tmp_path, monkeypatch):
    from hpcrl.errors import HpcrlError
    from hpcrl.jobs import lifecycle
    from hpcrl.jobs.registry import Registry
    from hpcrl.jobs.run_dir import RunDir
    from hpcrl.jobs.submission import Submission

    def full_disk(path: Path, text: str, **_: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(lifecycle, "write_private", full_disk)
    reg = Registry(tmp_path / "runs.db")
    sub = Submission(
        script="#!/bin/bash\n",
        run_dir=RunDir(tmp_path / "run"),
        name="r",
        cluster="local-dev",
        config_hash="x",
        max_restarts=0,
        plan=None,
    )
    with pytest.raises(HpcrlError, match="No space left on device; nothing recorded"):
        lifecycle.submit(reg, sub, dry_run=True)
    assert reg.list_runs() == []


def test_a_run_name_too_long_for_a_file_name_is_refused_before_anything_is_written(tmp_path):
    env = {**os.environ, "HPCRL_REGISTRY": str(tmp_path / "runs.db"), "PROJECTDIR": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-m", "hpcrl", "submit", "--dry-run", "--set", f"hpcrl.run_name={'a' * 300}"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert_user_error(out, "--set hpcrl.run_name: 300 bytes")
    assert list(tmp_path.iterdir()) == []
