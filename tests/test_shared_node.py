"""Shared nodes on the real local Slurm: another user's node-local parent, ports and metrics.

A second Unix user (created as tests/test_hardening.py does) pre-creates the job's node-local
parent, binds ports, and asks every port a running job listens on for Ray's `/metrics`. Runs use
test_lifecycle's environment (private registry, run root, profile and fake open-instruct).
"""

from __future__ import annotations

import os
import pwd
import subprocess
import uuid
from pathlib import Path

import pytest

from lifecycle_harness import (  # noqa: F401 - env is a fixture
    behave,
    config,
    env,
    hpcrl,
    ok_json,
    wait_status,
)
from test_hardening import as_other, other_user
from hpcrl.jobs.run_dir import RunDir, read_chain


def profile_with_node_local(env, base: Path) -> None:
    """The test profile with its node-local directories under base/<node>."""
    path = env["tmp"] / "clusters" / "lc-test.yaml"
    path.write_text(path.read_text() + "storage:\n  node_local:\n    path: " + str(base) + "/$SLURMD_NODENAME\n"
                    "    description: per node, under a directory this test controls\n")


@pytest.mark.parametrize("mode,node", [(0o755, "n2"), (0o777, "n2"), (0o777, "n1")])
def test_a_node_local_parent_of_another_user_is_refused_without_blaming_the_node(slurm, env, mode, node):
    """Another user made the node-local parent of `node` (n1 runs the head, n2 the worker):
    the job ends node-local-unsafe naming that directory and its owner, no node is blamed or
    excluded, no continuation is submitted and nothing was created in it."""
    user = other_user()
    base = Path(f"/tmp/hpcrl-nl-{uuid.uuid4().hex[:8]}")
    base.mkdir()
    base.chmod(0o1777)  # as /tmp: root's, sticky; the other user can make its own entry
    try:
        foreign = base / node
        as_other("mkdir", str(foreign))
        as_other("chmod", f"{mode:o}", str(foreign))
        assert foreign.stat().st_uid == pwd.getpwnam(user).pw_uid
        profile_with_node_local(env, base)
        behave(env, sleep=30)
        cfg = config(env, "foreign", nodes=2, hpcrl_extra="  exclude_nodes: [n3, n4]\n  failure_backoff_s: 2\n")
        out = ok_json(hpcrl(env, "submit", "--json", "--config", str(cfg)))
        final = wait_status(env, out["run_id"], lambda r: r["state"] == "ended", "the refusal", deadline_s=300)
        rd = RunDir(env["root"] / "foreign")
        log = rd.log(out["job_id"]).read_text()
        assert final["reason"] == "node-local-unsafe", log
        assert f"{foreign} (in the node-local path {foreign}) belongs to {user}, not to root" in log, log
        chain = read_chain(rd)
        assert list(chain) == [out["job_id"]] and chain[out["job_id"]].next_job is None
        assert not (rd.meta / "excluded-nodes").exists() and "\tfailure\t" not in rd.jobs_tsv.read_text()
        assert list(foreign.iterdir()) == []
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)
