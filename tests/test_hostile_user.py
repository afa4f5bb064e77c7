"""Shared nodes, round two: another Unix user beside the victim, on the real local Slurm.

The victim is the test's own user (root in CI), the other one `hpcrl-other` (made here). That user
re-creates a deleted run dir with links to the victim's files for the leftover sweep to write through,
makes every 3-character mktemp name of the victim's next job in a sticky node-local path, owns the run
root; a watchdog stops; a plain `scancel` comes; the registry is held locked, or its file system goes.
Runs use the lifecycle harness (private registry, run root, profile and fake open-instruct).
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import string
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from helpers import as_other, bash_functions, other_user, rendered_script, scontrol_job
from lifecycle_harness import behave, config, hpcrl, ok_json, wait_status
from hpcrl import contract
from hpcrl.jobs.registry import Registry
from hpcrl.jobs.run_dir import RunDir, read_chain

NODE_LOCAL = Path("/tmp/hpcrl-local")  # local-dev's storage.node_local: /tmp/hpcrl-local/$SLURMD_NODENAME


def on_one_node(slurm) -> tuple[str, str]:
    """(node, hpcrl config lines) pinning a 1-node run to the first usable node (names from sinfo)."""
    node, *others = slurm.usable
    return node, f"  exclude_nodes: [{', '.join(others)}]\n" if others else ""


def submit_run(env, name: str, extra: str = "", **kw) -> tuple[str, str, RunDir]:
    out = ok_json(hpcrl(env, "submit", "--json", "--config", str(config(env, name, hpcrl_extra=extra, **kw))))
    return out["run_id"], out["job_id"], RunDir(env["root"] / name)


def started(rd: RunDir, job: str):
    return lambda _run: rd.log(job).exists() and f"wrote marker-{job}" in rd.log(job).read_text()


def tree(root: Path) -> dict[str, tuple[int, str]]:
    """Every entry under root: (owner, link target or file bytes' length or 'dir')."""
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        kind = os.readlink(p) if p.is_symlink() else "dir" if p.is_dir() else str(st.st_size)
        out[str(p.relative_to(root))] = (st.st_uid, kind)
    return out


def end_of(rd: RunDir, job: str) -> str | None:
    ev = read_chain(rd).get(job)
    return f"{ev.end_reason}:{ev.exit_code}" if ev and ev.end_reason else None


# --------------------------------------------------------------------------- the leftover sweep


def test_a_leftover_whose_run_dir_another_user_remade_with_links_changes_nothing_of_the_victims(slurm, env):
    """A dead job of the victim left its node-local directory (Ray logs in it) on a node; its run dir, in a
    sticky shared run root, was deleted, and the other user made it again with logs/ray/<job>/<node>/
    holding links to the victim's ~/.bashrc (the recovered mark) and registry (raylet.out). The victim's
    next job on that node sweeps the leftover: both files unchanged, nothing of the victim's in the other
    user's tree, the leftover gone and its Ray logs kept in the new job's own run dir, where its log says."""
    user = other_user()
    node, pin = on_one_node(slurm)
    shared_root = Path(f"/tmp/hpcrl-rr-{uuid.uuid4().hex[:8]}")
    shared_root.mkdir()
    shared_root.chmod(0o1777)  # a shared scratch: anyone makes an entry, nobody renames another's
    dead = (
        subprocess.run(
            ["sbatch", "--parsable", "--output=/dev/null", "--wrap=true"],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        .stdout.strip()
        .split(";")[0]
    )
    leftover = NODE_LOCAL / node / f"hpcrl-{dead}.0.qZ7"
    bashrc = env["tmp"] / "home" / ".bashrc"
    registry = Path(env["env"]["HPCRL_REGISTRY"])
    try:
        deadline = time.monotonic() + 120
        while scontrol_job(dead).get("JobState") not in ("COMPLETED", None) and time.monotonic() < deadline:
            time.sleep(0.5)
        (leftover / "ray" / "session_latest" / "logs").mkdir(parents=True)
        leftover.chmod(0o700)
        (leftover / "ray" / "session_latest" / "logs" / "raylet.out").write_text("raylet of the dead job\n")
        old_run = shared_root / "old"
        (leftover / contract.NODE_OWNER).write_text(f"{node}\n{old_run}\n")
        bashrc.parent.mkdir()
        bashrc.write_text("# the victim's own\n")
        behave(env, sleep=5)
        hpcrl(env, "runs")  # the registry exists before the trap points at it
        run_id, job, rd = submit_run(env, "next", pin)
        # The old run dir, gone, made again by the other user: real directories down to <job>/<node>, open
        # to all, and in the last one links to the victim's files under the names the sweep writes.
        kept = old_run / "logs" / "ray" / dead / node
        assert as_other("mkdir", "-p", str(kept)).returncode == 0
        assert as_other("chmod", "-R", "777", str(old_run)).returncode == 0
        assert as_other("ln", "-s", str(bashrc), str(kept / contract.RAY_LOGS_RECOVERED)).returncode == 0
        assert as_other("ln", "-s", str(registry), str(kept / "raylet.out")).returncode == 0
        trap = tree(old_run)

        final = wait_status(env, run_id, lambda r: r["state"] == "ended", "the run to end", deadline_s=400)
        log = rd.log(job).read_text()
        assert final["reason"] == "completed", log
        assert bashrc.read_text() == "# the victim's own\n"
        # the registry is still SQLite's (not a copy of a log), and holds the run
        assert registry.read_bytes()[:16] == b"SQLite format 3\0"
        assert [r["run_id"] for r in ok_json(hpcrl(env, "runs", "--json"))["runs"]] == [run_id]
        assert tree(old_run) == trap and all(p.lstat().st_uid == pwd.getpwnam(user).pw_uid for p in old_run.rglob("*"))
        assert not leftover.exists(), log
        own = rd.path / "logs" / "ray-left" / dead / node
        line = next((ln for ln in log.splitlines() if f"removed {leftover}" in ln), "")
        assert (
            f"left by job {dead} (" in line
            and f"its run dir {old_run} is not safe to write into: " in line
            and f"its Ray logs kept in {own}/ instead" in line
        ), log
        assert (own / "raylet.out").read_text() == "raylet of the dead job\n"
    finally:
        subprocess.run(["rm", "-rf", str(shared_root), str(leftover)], check=False)


# --------------------------------------------------------------------------- names nobody can exhaust


SQUAT = """
import itertools, os, string, sys
base, prefix = sys.argv[1], sys.argv[2]
chars = string.ascii_letters + string.digits  # mktemp's X
made = 0
for a, b, c in itertools.product(chars, repeat=3):
    try:
        os.mkdir(os.path.join(base, prefix + a + b + c), 0o700)
        made += 1
    except FileExistsError:
        pass
print(made)
"""


def test_every_three_character_name_of_the_next_job_squatted_and_the_job_runs(slurm, env):
    """In a sticky 1777 node-local path (a tmpfs, as many nodes' local scratch is), the other user makes
    every `hpcrl-<job>.0.XXX` name of the victim's next job (held until then): 62^3 = 238,328
    directories. The job still makes its own directory (12 random characters) and completes; no node
    is blamed."""
    node, pin = on_one_node(slurm)
    base = Path(f"/tmp/hpcrl-nl-{uuid.uuid4().hex[:8]}")
    here = base / node
    here.mkdir(parents=True)
    base.chmod(0o755)
    # root's, sticky, 1777; in memory, so that 238,328 directories take seconds, not minutes, to make
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m,mode=1777", "tmpfs", str(here)]).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root, as CI runs)")
    path = env["tmp"] / "clusters" / "lc-test.yaml"
    path.write_text(
        path.read_text() + f"storage:\n  node_local:\n    path: {base}/$SLURMD_NODENAME\n"
        "    description: a sticky directory others may write, per node\n"
    )
    behave(env, sleep=5)
    try:
        env["env"]["SBATCH_HOLD"] = "1"  # sbatch's own variable: the job waits until released
        run_id, job, rd = submit_run(env, "squat", pin)
        del env["env"]["SBATCH_HOLD"]
        squat = subprocess.run(
            ["/usr/bin/python3", "-c", SQUAT, str(here), f"hpcrl-{job}.0."],
            user=other_user(),
            group=pwd.getpwnam(other_user()).pw_gid,
            extra_groups=[],
            capture_output=True,
            text=True,
            timeout=600,
            cwd="/",
        )
        assert int(squat.stdout) == len(string.ascii_letters + string.digits) ** 3, squat.stderr
        subprocess.run(["scontrol", "release", job], check=True, timeout=60)
        final = wait_status(env, run_id, lambda r: r["state"] == "ended", "the run to end", deadline_s=400)
        log = rd.log(job).read_text()
        assert final["reason"] == "completed", log
        assert not list(rd.meta.glob("blame-*")) and not (rd.meta / "excluded-nodes").exists(), log
        assert "File exists" not in log
    finally:
        subprocess.run(["scancel", job] if "job" in locals() else ["true"], check=False)
        subprocess.run(["umount", "-l", str(here)], check=False)
        subprocess.run(["rm", "-rf", str(base)], check=False)


def test_the_rendered_names_carry_enough_randomness_that_nobody_makes_them_all_in_a_day():
    """Every mktemp template of the rendered script has 10+ random characters: at the squatter's measured
    rate (238,328 directories in 13 s) one job id's names take more than a day to make."""
    script = rendered_script()
    templates = re.findall(r'mktemp -d -- "[^"]*?(X+)"', script)
    assert len(templates) >= 2 and all(len(x) >= 10 for x in templates), templates
    rate = 238_328 / 13
    assert min(62 ** len(x) for x in templates) / rate > 86_400


def test_a_name_mktemp_cannot_make_is_its_own_reason_never_the_nodes(tmp_path):
    """mktemp failing with EEXIST (every name it tried taken): private_dir returns 4 and says so; the
    reason (node-local-taken) is not continued, so no node is excluded."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "mktemp").write_text(
        "#!/bin/bash\necho \"mktemp: failed to create directory via template '${@: -1}': File exists\" >&2\nexit 1\n"
    )
    (bin_dir / "mktemp").chmod(0o755)
    script = rendered_script()
    fns = bash_functions(script, *(f for f in ("private_dir", "safe_path", "path_level") if f"\n{f}() {{" in script))
    res = subprocess.run(
        ["bash", "-c", fns + 'private_dir "$1" hpcrl-7.0', "-", str(tmp_path / "nl")],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"},
    )
    assert res.returncode == 4 and "another user is making this job's names first; not this node's fault" in res.stderr
    assert contract.NODE_LOCAL_TAKEN not in contract.FAILURE_REASONS + contract.LIMIT_REASONS


# --------------------------------------------------------------------------- the run root


def test_a_run_root_another_user_owns_is_refused_by_submit_and_by_the_job(slurm, env):
    """The run root is the other user's. `hpcrl submit` refuses it in one line (exit 2), writing nothing.
    A job that meets it anyway (a hand sbatch, a continuation), where that user has put a link to another
    run dir of the victim in place of the run dir, writes nothing there: it ends run-dir-unsafe, in its
    Slurm comment and the node-local fallback."""
    node, pin = on_one_node(slurm)
    theirs = Path(f"/tmp/hpcrl-theirs-{uuid.uuid4().hex[:8]}")
    assert as_other("mkdir", "-m", "755", str(theirs)).returncode == 0
    env["root"] = theirs
    try:
        proc = hpcrl(env, "submit", "--config", str(config(env, "steered", hpcrl_extra=pin)))
        err = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(err) == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert f"{theirs} belongs to hpcrl-other, not to" in err[0] and "refusing to write into it" in err[0], err
        assert not (theirs / "steered").exists() and ok_json(hpcrl(env, "runs", "--json"))["runs"] == []

        victim = env["tmp"] / "other-run"
        (victim / "hpcrl").mkdir(parents=True)
        (victim / "logs").mkdir()
        (victim / "hpcrl" / "jobs.tsv").write_text("1\tstart\t2026-01-01T00:00:00Z\tn1\n")
        before = tree(victim)
        assert as_other("ln", "-s", str(victim), str(theirs / "steered")).returncode == 0
        script = env["tmp"] / "steered.sbatch"
        proc = hpcrl(env, "render", "--config", str(config(env, "steered", hpcrl_extra=pin)), "-o", str(script))
        assert proc.returncode == 0, proc.stderr
        out = env["tmp"] / "slurm-%j.out"  # Slurm's own output file elsewhere: Slurm opens it before the script runs
        job = (
            subprocess.run(
                ["sbatch", "--parsable", f"--output={out}", str(script)],
                capture_output=True,
                text=True,
                check=True,
                timeout=60,
                env=env["env"],
                cwd=env["tmp"],
            )
            .stdout.strip()
            .split(";")[0]
        )
        deadline = time.monotonic() + 300
        while (fields := scontrol_job(job)).get("JobState") in ("PENDING", "RUNNING", "COMPLETING"):
            assert time.monotonic() < deadline, fields
            time.sleep(1)
        text = Path(str(out).replace("%j", job)).read_text()
        assert fields.get("Comment", "").strip() == f"{contract.END_COMMENT}{contract.RUN_DIR_UNSAFE}:1", text
        assert f"{theirs} (in the run directory's path {theirs}/steered) belongs to hpcrl-other" in text, text
        kept = list((NODE_LOCAL / node).glob(f"hpcrl-ended-{job}.*/jobs.tsv"))
        assert kept and "\tend\t" in kept[0].read_text() and contract.RUN_DIR_UNSAFE in kept[0].read_text()
        assert tree(victim) == before
    finally:
        subprocess.run(["rm", "-rf", str(theirs)], check=False)


# --------------------------------------------------------------------------- someone watches the watchdog


def test_a_stopped_watchdog_ends_the_job_within_the_hang_limit_and_is_not_continued(slurm, env):
    """The watchdog is SIGSTOPped (what one blocked on a hung run dir looks like from outside) under a
    1-minute hang limit: the job ends watchdog-hung (87) within the hang limit plus a margin, long before
    its time limit, with no continuation and nothing of it left running."""
    node, pin = on_one_node(slurm)
    behave(env, sleep=900)
    run_id, job, rd = submit_run(env, "stopped", pin + "  hang_minutes: 1\n", time_="00:15:00")
    try:
        stop_the_watchdog(env, run_id, job, rd)
    finally:
        subprocess.run(["scancel", job], check=False, timeout=60)


def stop_the_watchdog(env, run_id: str, job: str, rd: RunDir) -> None:
    wait_status(env, run_id, started(rd, job), "the driver to start", deadline_s=600)
    watchdogs = [
        int(pid)
        for pid, args in (
            ln.strip().split(None, 1)
            for ln in subprocess.run(
                ["ps", "-eww", "-o", "pid=,args="], capture_output=True, text=True
            ).stdout.splitlines()
            if ln.strip()
        )
        if "hpcrl.runtime.watchdog" in args and str(rd.path) in args
    ]
    assert len(watchdogs) == 1, watchdogs
    os.kill(watchdogs[0], signal.SIGSTOP)
    final = wait_status(
        env, run_id, lambda r: r["state"] == "ended", "the end within the hang limit and a margin", deadline_s=60 + 120
    )
    log = rd.log(job).read_text()
    assert (final["reason"], end_of(rd, job)) == ("watchdog-hung", "watchdog-hung:87"), log
    assert read_chain(rd)[job].next_job is None, log
    deadline = time.monotonic() + 30  # the end is recorded first, then everything is stopped
    while (
        left := [
            a
            for a in subprocess.run(["ps", "-eww", "-o", "args="], capture_output=True, text=True).stdout.splitlines()
            if f"hpcrl-{job}." in a or str(rd.path) in a
        ]
    ) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert left == [], left


# --------------------------------------------------------------------------- a plain scancel


def test_a_plain_scancel_is_recorded_cancelled_and_not_continued(slurm, env):
    """`scancel <job>` by hand (no `hpcrl cancel`, so no cancel marker) is the user's stop: cancelled,
    never preempted, and no continuation."""
    node, pin = on_one_node(slurm)
    behave(env, sleep=600)
    run_id, job, rd = submit_run(env, "plain", pin)
    try:
        wait_status(env, run_id, started(rd, job), "the driver to start", deadline_s=600)
    finally:
        subprocess.run(["scancel", job], check=True, timeout=60)
    final = wait_status(env, run_id, lambda r: r["state"] == "ended", "the end")
    log = rd.log(job).read_text()
    assert final["reason"] == "cancelled" and end_of(rd, job).startswith("cancelled:"), log
    assert read_chain(rd)[job].next_job is None, log


# --------------------------------------------------------------------------- the registry


HOLD_LOCK = """
import sqlite3, sys, time
c = sqlite3.connect(sys.argv[1], isolation_level=None)
c.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
time.sleep(300)
"""


def test_a_locked_registry_is_answered_within_30_s_in_one_line_naming_the_lock(slurm, env):
    """Another process holds the registry's write lock (BEGIN EXCLUSIVE) while a run is live: `hpcrl
    status` and `hpcrl submit --dry-run` each answer within 30 s, one line naming the lock's holder."""
    registry = env["env"]["HPCRL_REGISTRY"]
    reg = Registry(registry)
    run = reg.create_run(
        name="live",
        cluster="lc-test",
        config_hash="-",
        script_path="-",
        run_dir=str(env["tmp"] / "live"),
        state="pending",
        max_restarts=0,
    )
    reg.add_job(run, "1", run_state="pending")
    reg.close()
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, registry], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        for args in (["status"], ["submit", "--dry-run", "--config", str(config(env, "second"))]):
            proc = hpcrl(env, *args, timeout=30)  # the bounded wait: TimeoutExpired fails the test
            err = proc.stderr.strip().splitlines()
            assert proc.returncode == 2 and len(err) == 1, (args, proc.stderr)
            assert f"registry {registry} is locked by pid {holder.pid} (" in err[0], err
    finally:
        holder.kill()
        holder.wait()


@pytest.fixture
def loop_mount(tmp_path):
    """An ext4 file system on a loop device, mounted for the test (root, as CI runs)."""
    if os.geteuid() != 0 or not shutil.which("mkfs.ext4"):
        pytest.skip("a loop-device file system needs root and mkfs.ext4 (CI runs as root)")
    image, mnt = tmp_path / "fs.img", tmp_path / "mnt"
    mnt.mkdir()
    with open(image, "wb") as f:
        f.truncate(32 << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True, capture_output=True)
    if subprocess.run(["mount", "-o", "loop", str(image), str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a loop device here")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_a_registry_whose_file_system_went_away_is_an_error_not_no_runs(env, loop_mount):
    """The registry lives on a file system that then goes (unmounted under it, as a failed mount looks):
    `hpcrl runs` and `hpcrl status` exit 2 with one line, never '0 runs'."""
    (loop_mount / "hpcrl").mkdir()
    env["env"]["HPCRL_REGISTRY"] = str(loop_mount / "hpcrl" / "runs.db")
    assert hpcrl(env, "submit", "--dry-run", "--config", str(config(env, "gone"))).returncode == 0
    assert len(ok_json(hpcrl(env, "runs", "--json"))["runs"]) == 1
    subprocess.run(["umount", "-l", str(loop_mount)], check=True)
    for args in (["runs"], ["status"]):
        proc = hpcrl(env, *args)
        err = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(err) == 1 and "Traceback" not in proc.stderr, (args, proc.stdout)
        assert err[0].startswith(f"hpcrl: error: registry {loop_mount}/hpcrl/runs.db") and "0 runs" not in proc.stdout


# --------------------------------------------------------------------------- report


def test_a_leftover_that_held_no_ray_logs_is_reported_lost(tmp_path):
    """A later job's sweep found the dead job's directory on n2 with no Ray logs, and marked it ("<job>
    <time> none", as the job script writes it): the report says lost, not that a later job recovers them."""
    run = tmp_path / "run"
    (run / "hpcrl").mkdir(parents=True)
    (run / "logs" / "ray" / "301" / "n1").mkdir(parents=True)
    (run / "logs" / "ray" / "301" / "n2").mkdir(parents=True)
    (run / "logs" / "ray" / "301" / "n2" / "hpcrl-recovered").write_text("305 2026-03-02T10:00:04Z none\n")
    (run / "logs" / "worker-n2-301.log").write_text("hpcrl: ray on n2 ...\n")
    (run / "hpcrl" / "jobs.tsv").write_text(
        "301\tstart\t2026-03-02T09:00:00Z\tn1\n301\tend\t2026-03-02T09:10:00Z\tworker-died:95\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "hpcrl", "report", str(run)], capture_output=True, text=True, timeout=120
    )
    assert "job 301: Ray logs of n2 lost: job 305 found none left on the node at 2026-03-02T10:00:04Z" in proc.stdout
    assert "recovers them" not in proc.stdout and "recovered later" not in proc.stdout, proc.stdout
