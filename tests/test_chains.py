"""One live chain per run dir across registries, and what a new chain inherits (issue 28, items 6-7).

The lock file hpcrl/chain.lock names the chain's newest job; `submit` (hpcrl/jobs/chain_lock.py)
and the job at its start (the batch script's claim_run_dir) refuse a run dir whose named job Slurm
still has pending or running. A new chain starts with its failure continuations uncounted and no
node excluded, unless `submit --keep-exclusions`.
"""

from __future__ import annotations

import os
import subprocess
import sys

from lifecycle_harness import assert_user_error, behave, hpcrl, ok_json, script
from stub_run import Stub

RUN = "grpo-olmo3-7b"  # the run name the stub renders


def test_a_second_registry_is_refused_a_run_dir_whose_chain_is_live(slurm, env):
    """Two registries (HPCRL_REGISTRY) submit into one run dir: the first job runs, the second submit
    is refused with one line naming that job, and the first chain's script is left as it was."""
    behave(env, sleep=300)
    path = script(env, "shared")
    first = ok_json(hpcrl(env, "submit", "--json", str(path)))
    other = dict(env, env={**env["env"], "HPCRL_REGISTRY": str(env["tmp"] / "other.db")})
    path.write_text(path.read_text().replace("# hpcrl-cluster", "# the second chain's script\n# hpcrl-cluster"))
    try:
        refused = hpcrl(other, "submit", str(path))
        line = assert_user_error(refused, f"belongs to job {first['job_id']} (")
        assert "the live chain of another submit" in line
        assert "second chain" not in (env["root"] / "shared" / "hpcrl" / "job.sbatch").read_text()
    finally:
        hpcrl(env, "cancel", first["run_id"])


def _stub_submit(stub: Stub, script_path, *args: str) -> subprocess.CompletedProcess:
    """The real `hpcrl submit` of a rendered script, with the stub's sbatch (job 4242) and squeue on PATH."""
    e = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "HPCRL_"))}
    e.update(
        PATH=f"{stub.bindir}:{os.environ['PATH']}",
        STUB_OUT=str(stub.out),
        HPCRL_REGISTRY=str(stub.tmp / "runs.db"),
        HPCRL_DATA_DIR=str(stub.tmp / "data"),
    )
    return subprocess.run(
        [sys.executable, "-m", "hpcrl", "submit", *args, str(script_path)],
        env=e,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=stub.tmp,
    )


def _old_chain(run_dir) -> None:
    """What a chain that used its failure continuations leaves (hpcrl.max_failure_restarts is 3)."""
    (run_dir / "hpcrl").mkdir(parents=True)
    (run_dir / "hpcrl" / "failure-restarts").write_text("3\n")
    (run_dir / "hpcrl" / "excluded-nodes").write_text("n3\n")
    (run_dir / "hpcrl" / "chain.lock").write_text("1111\n")  # its last job, long gone


def test_a_fresh_submit_after_a_spent_failure_chain_continues_when_a_worker_dies(tmp_path):
    """The issue's reproduction: the run had used its failure continuations (and excluded n3); a
    fresh `hpcrl submit` starts a new chain, which loses a worker (n2's raylet dies while the
    driver runs) and continues, excluding n2 only. (The stub's Slurm: sbatch answers job 4242.)"""
    stub = Stub(tmp_path, nodes=2)
    stub.job = "4242"
    run_dir = tmp_path / "runs" / RUN
    _old_chain(run_dir)
    submitted = _stub_submit(stub, stub.render())
    assert submitted.returncode == 0, submitted.stderr
    rc, out = stub.run(
        run_dir / "hpcrl" / "job.sbatch", timeout=60, STUB_DRIVER_SLEEP="120", STUB_RAY_WORKER_DIES_AFTER="3"
    )
    assert "continuation submitted: job 4242 (failure continuation 1 of at most 3)" in out, out
    assert [a for a in stub.argv("sbatch.argv") if a.startswith("--exclude")] == ["--exclude=n2"]


def test_keep_exclusions_keeps_the_old_chains_nodes_out(tmp_path):
    """`submit --keep-exclusions`: the nodes the old chain excluded stay in excluded-nodes, and the
    first job of the new chain is submitted without them."""
    stub = Stub(tmp_path, nodes=2)
    run_dir = tmp_path / "runs" / RUN
    _old_chain(run_dir)
    submitted = _stub_submit(stub, stub.render(), "--keep-exclusions")
    assert submitted.returncode == 0, submitted.stderr
    assert "--exclude=n3" in stub.argv("sbatch.argv")
    assert (run_dir / "hpcrl" / "excluded-nodes").read_text().split() == ["n3"]


def test_a_job_of_another_chain_leaves_a_live_chains_run_dir_alone(tmp_path):
    """The lock names job 1111, which Slurm says is RUNNING: a job of this script started by hand
    (no submit) refuses at once, before it records anything, and the lock still names 1111."""
    stub = Stub(tmp_path, nodes=2)
    run_dir = tmp_path / "runs" / RUN
    _old_chain(run_dir)
    rc, out = stub.run(stub.render(), timeout=60, STUB_OWNER_STATE="RUNNING")
    assert rc == 1 and "belongs to job 1111 (RUNNING), the live chain of another submit" in out, out
    assert not (run_dir / "hpcrl" / "jobs.tsv").exists()
    assert (run_dir / "hpcrl" / "chain.lock").read_text() == "1111\n"


def test_the_continuation_owns_the_run_dir(tmp_path):
    """A job that chains a continuation names it in the lock (sbatch answers 4242), so the
    continuation's own start check finds itself there."""
    stub = Stub(tmp_path, nodes=2)
    rc, out = stub.run(stub.render(), timeout=60, STUB_DRIVER_SLEEP="120", STUB_RAY_WORKER_DIES_AFTER="3")
    assert "continuation submitted: job 4242" in out, out
    assert (tmp_path / "runs" / RUN / "hpcrl" / "chain.lock").read_text() == "4242\n"
