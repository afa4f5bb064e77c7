"""The job script's private_dir, run alone in bash (no Slurm): which node-local paths it takes.

As root with a second Unix user (tests/lifecycle_harness.py's other_user), directories are laid out as another
user could leave them; private_dir must refuse (exit 3, one line naming the level) a level
owned by that user or writable by others without the sticky bit, and otherwise make a 0700
directory of ours under the physical path.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import uuid
from pathlib import Path

import pytest

from helpers import as_other, bash_functions, other_user, rendered_script


def private_dir(tmp_path: Path, base: Path) -> subprocess.CompletedProcess:
    fn = bash_functions(rendered_script(), "private_dir", "safe_path", "path_level")
    return subprocess.run(
        ["bash", "-c", fn + 'private_dir "$1" job-7.0 && echo "$PRIVATE_DIR"', "-", str(base)],
        capture_output=True,
        text=True,
        timeout=30,
    )


@pytest.fixture
def shared():
    """A root-owned sticky 1777 directory in /tmp (as /tmp itself): the other user can reach it."""
    other_user()
    d = Path(f"/tmp/hpcrl-private-test-{uuid.uuid4().hex[:8]}")
    d.mkdir()
    d.chmod(0o1777)
    yield d
    subprocess.run(["rm", "-rf", str(d)], check=False)


@pytest.mark.parametrize("mode", [0o755, 0o777, 0o700])
def test_a_level_owned_by_another_user_is_refused(tmp_path, shared, mode):
    level = shared / "nl"
    assert as_other("mkdir", str(level)).returncode == 0 and as_other("chmod", f"{mode:o}", str(level)).returncode == 0
    res = private_dir(tmp_path, level / "n1")
    why = f"{level} (in the node-local path {level}/n1) belongs to hpcrl-other"
    assert res.returncode == 3 and why in res.stderr, res
    assert not (level / "n1").exists() or list((level / "n1").iterdir()) == []


def test_a_world_writable_level_without_the_sticky_bit_is_refused(tmp_path, shared):
    level = shared / "open"
    level.mkdir()
    level.chmod(0o777)
    res = private_dir(tmp_path, level)
    assert res.returncode == 3 and f"{level} (in the node-local path {level}) is mode 777" in res.stderr, res


def test_a_sticky_root_level_and_a_link_to_it_are_taken(tmp_path, shared):
    """/tmp-like levels are safe; a link in the path is followed once and the physical path used."""
    link = tmp_path / "link"
    link.symlink_to(shared)
    res = private_dir(tmp_path, link / "nl")
    made = Path(res.stdout.strip())
    assert res.returncode == 0, res
    st = made.lstat()
    assert (made.parent, made.name[:8], st.st_uid, st.st_mode & 0o7777) == (shared / "nl", "job-7.0.", 0, 0o700)


def test_two_jobs_that_name_the_same_directory_get_their_own(tmp_path, shared):
    """Another user made the name a job would use first (job ids are predictable): mktemp picks another."""
    base = shared / "nl"
    base.mkdir()
    base.chmod(0o1777)
    first = Path(private_dir(tmp_path, base).stdout.strip())
    second = Path(private_dir(tmp_path, base).stdout.strip())
    assert first != second and first.parent == second.parent == base
    assert pwd.getpwuid(os.lstat(second).st_uid).pw_name == "root"
