"""The run registry: schema, ids, prefix lookup, concurrent writers (real processes, real SQLite)."""

from __future__ import annotations

import multiprocessing as mp
import re
import sqlite3

import pytest

from hpcrl.errors import RegistryError
from hpcrl.jobs.registry import Registry, default_path, new_run_id

ID = re.compile(r"^[A-Za-z0-9._-]+-[0-9a-f]{6}$")
STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


def _run(reg: Registry, name: str = "grpo", state: str = "pending") -> str:
    return reg.create_run(
        name=name,
        cluster="local-dev",
        config_hash="abc123",
        script_path=f"/r/{name}/hpcrl/job.sbatch",
        run_dir=f"/r/{name}",
        state=state,
        max_restarts=2,
    )


def test_location_env_and_explicit(tmp_path, monkeypatch):
    monkeypatch.setenv("HPCRL_REGISTRY", str(tmp_path / "env.db"))
    assert default_path() == tmp_path / "env.db"
    assert default_path(tmp_path / "x.db") == tmp_path / "x.db"
    monkeypatch.delenv("HPCRL_REGISTRY")
    assert default_path().name == "runs.db" and "hpcrl" in str(default_path())


def test_wal_mode_and_schema(tmp_path):
    reg = Registry(tmp_path / "sub" / "runs.db")
    conn = sqlite3.connect(reg.path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    cols = {r[1] for r in conn.execute("PRAGMA table_info(runs)")}
    assert {
        "run_id",
        "name",
        "cluster",
        "config_hash",
        "script_path",
        "run_dir",
        "created",
        "state",
        "reason",
        "max_restarts",
    } <= cols
    cols = {r[1] for r in conn.execute("PRAGMA table_info(jobs)")}
    assert {"run_id", "seq", "job_id", "state", "reason", "submitted", "ended"} <= cols


def test_run_ids_are_short_and_human():
    assert ID.match(new_run_id("grpo-olmo3-7b"))
    assert new_run_id("a b/c").startswith("a-b-c-")
    assert len({new_run_id("x") for _ in range(200)}) > 190


def test_jobs_chain_in_order(tmp_path):
    reg = Registry(tmp_path / "runs.db")
    rid = _run(reg)
    assert reg.add_job(rid, "101") == 0
    assert reg.add_job(rid, "205") == 1
    assert reg.add_job(rid, "101") == 0  # already there: no duplicate
    run = reg.get(rid)
    assert [j.job_id for j in run.jobs] == ["101", "205"]
    assert run.last_job.job_id == "205" and all(STAMP.match(j.submitted) for j in run.jobs)
    reg.update_jobs(
        [run.jobs[0]._replace(state="TIMEOUT", reason="timeout", exit_code=0, ended="2026-01-01T00:00:00Z")]
    )
    assert reg.get(rid).jobs[0].reason == "timeout"


def test_prefix_and_job_id_lookup(tmp_path):
    reg = Registry(tmp_path / "runs.db")
    a, b = _run(reg, "alpha"), _run(reg, "beta")
    reg.add_job(b, "4242")
    assert reg.find(a).run_id == a
    assert reg.find("alp").run_id == a
    assert reg.find("4242").run_id == b
    _run(reg, "alpha")
    with pytest.raises(RegistryError, match="ambiguous"):
        reg.find("alpha")


def test_unknown_id_lists_recent_runs(tmp_path):
    reg = Registry(tmp_path / "runs.db")
    with pytest.raises(RegistryError, match="no runs yet"):
        reg.find("nope")
    ids = [_run(reg, f"r{i}") for i in range(7)]
    with pytest.raises(RegistryError) as err:
        reg.find("nope")
    msg = str(err.value)
    assert "unknown run 'nope'" in msg and ids[-1] in msg and ids[0] not in msg  # the 5 newest


def test_like_wildcards_are_literal(tmp_path):
    reg = Registry(tmp_path / "runs.db")
    _run(reg, "a_b")
    with pytest.raises(RegistryError):
        reg.find("a%")


def _writer(path: str, i: int, out: mp.Queue) -> None:
    reg = Registry(path)
    rid = reg.create_run(
        name=f"w{i}", cluster="c", config_hash="h", script_path="s", run_dir=f"/r/{i}", state="dry-run", max_restarts=1
    )
    for k in range(3):
        reg.add_job(rid, str(1000 * i + k))
    reg.set_run(rid, state="pending")
    out.put(rid)


def test_twenty_concurrent_writers(tmp_path):
    """20 processes open a new registry at once, each writing a run and 3 jobs."""
    path = str(tmp_path / "runs.db")
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(path, i, q)) for i in range(20)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    ids = {q.get(timeout=5) for _ in procs}
    runs = Registry(path).list_runs()
    assert {r.run_id for r in runs} == ids and len(ids) == 20
    for r in runs:
        assert r.state == "pending" and ID.match(r.run_id)
        assert [j.seq for j in r.jobs] == [0, 1, 2]


def _claimer(path: str, i: int, start, out) -> None:
    reg = Registry(path)
    start.wait(60)
    try:
        rid = reg.create_run(
            name=f"c{i}",
            cluster="local-dev",
            config_hash="h",
            script_path="/r/same/hpcrl/job.sbatch",
            run_dir="/r/same",
            state="submitting",
            max_restarts=2,
            claim_run_dir=True,
        )
        out.put(("ok", rid))
    except RegistryError as exc:
        out.put(("refused", str(exc)))


def test_one_of_many_simultaneous_claims_of_a_run_dir_wins(tmp_path):
    """8 processes released together each try to claim the same run dir: exactly one row is
    created, and the 7 others are told which run holds it."""
    path = str(tmp_path / "runs.db")
    Registry(path).close()
    ctx = mp.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_claimer, args=(path, i, start, out)) for i in range(8)]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(120)
    results = [out.get(timeout=5) for _ in procs]
    won = [r for kind, r in results if kind == "ok"]
    refused = [r for kind, r in results if kind == "refused"]
    assert len(won) == 1 and len(refused) == 7, results
    for msg in refused:
        assert msg == (
            f"run {won[0]} is still submitting in /r/same; hpcrl cancel {won[0]}, or pick another hpcrl.run_name"
        )
    assert [r.run_id for r in Registry(path).list_runs()] == won


def test_a_run_dir_is_free_again_once_its_run_ended(tmp_path):
    reg = Registry(tmp_path / "runs.db")

    def claim() -> str:
        return reg.create_run(
            name="x",
            cluster="local-dev",
            config_hash="h",
            script_path="/r/x/hpcrl/job.sbatch",
            run_dir="/r/x",
            state="submitting",
            max_restarts=2,
            claim_run_dir=True,
        )

    first = claim()
    for state in ("pending", "running"):
        reg.set_run(first, state=state)
        with pytest.raises(RegistryError, match=f"run {first} is still {state} in /r/x"):
            claim()
    reg.set_run(first, state="ended")
    second = claim()
    assert second != first and {r.run_id for r in reg.list_runs(live_only=True)} == {second}
    # a dry run's row never holds the run dir
    reg.set_run(second, state="failed")
    reg.create_run(
        name="x",
        cluster="local-dev",
        config_hash="h",
        script_path="/r/x/hpcrl/job.sbatch",
        run_dir="/r/x",
        state="dry-run",
        max_restarts=2,
    )
    assert claim()
