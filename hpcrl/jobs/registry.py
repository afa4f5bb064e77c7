"""The run registry: one SQLite file (WAL mode) of runs and the Slurm jobs of each.

Location: `--registry PATH`, else $HPCRL_REGISTRY, else `user_data_dir("hpcrl")/runs.db`.
Many hpcrl processes may write at once (a script submitting 20 runs in parallel): every
write is one short `BEGIN IMMEDIATE` transaction with a busy timeout, retried when the
database stays locked.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sqlite3
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NamedTuple

from platformdirs import user_data_dir

from hpcrl.errors import RegistryError
from hpcrl.jobs.registry_locks import locked_error
from hpcrl.jobs.registry_place import note_made

SCHEMA_VERSION = 1
# SQLite's own wait for a lock, per statement; a locked registry is retried until LOCK_WAIT_S have passed,
# then refused in one line naming the process that holds it (a silent wait of minutes looks like a hang).
BUSY_TIMEOUT_MS = 2_000
LOCK_WAIT_S = 20.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id       TEXT PRIMARY KEY,
    name         TEXT NOT NULL,
    cluster      TEXT NOT NULL,
    config_hash  TEXT NOT NULL,
    script_path  TEXT NOT NULL,
    run_dir      TEXT NOT NULL,
    created      TEXT NOT NULL,
    state        TEXT NOT NULL,
    reason       TEXT NOT NULL DEFAULT '',
    max_restarts INTEGER,
    updated      TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS jobs (
    run_id     TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
    seq        INTEGER NOT NULL,
    job_id     TEXT NOT NULL,
    state      TEXT NOT NULL,
    reason     TEXT NOT NULL DEFAULT '',
    exit_code  INTEGER,
    submitted  TEXT NOT NULL,
    ended      TEXT,
    PRIMARY KEY (run_id, seq)
);
CREATE INDEX IF NOT EXISTS jobs_job_id ON jobs(job_id);
CREATE INDEX IF NOT EXISTS runs_created ON runs(created);
"""

# Run states. A run is `pending`/`running` while its newest job is; `ended` carries the
# reason (completed, timeout, crashed, cancelled, ...); `failed` means sbatch refused it.
RUN_STATES = ("submitting", "dry-run", "failed", "pending", "running", "ended")
LIVE_RUN_STATES = frozenset({"submitting", "pending", "running"})


class Job(NamedTuple):
    run_id: str
    seq: int
    job_id: str
    state: str
    reason: str
    exit_code: int | None
    submitted: str
    ended: str | None


class Run(NamedTuple):
    run_id: str
    name: str
    cluster: str
    config_hash: str
    script_path: str
    run_dir: str
    created: str
    state: str
    reason: str
    max_restarts: int | None
    updated: str
    jobs: tuple[Job, ...] = ()

    @property
    def live(self) -> bool:
        return self.state in LIVE_RUN_STATES

    @property
    def last_job(self) -> Job | None:
        return self.jobs[-1] if self.jobs else None

    def to_dict(self) -> dict[str, Any]:
        d = self._asdict()
        d["jobs"] = [j._asdict() for j in self.jobs]
        return d


def now() -> str:
    """UTC time as ISO 8601 with seconds, the registry's and jobs.tsv's format."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def default_path(explicit: str | os.PathLike | None = None) -> Path:
    """The registry file: explicit path, else $HPCRL_REGISTRY, else the user data dir."""
    if explicit:
        return Path(explicit).expanduser()
    env = os.environ.get("HPCRL_REGISTRY")
    if env:
        return Path(env).expanduser()
    return Path(user_data_dir("hpcrl")) / "runs.db"


def new_run_id(name: str) -> str:
    """`<name>-<6 hex>`: short enough to type, unique enough for one user's runs."""
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in name).strip("-") or "run"
    return f"{safe}-{secrets.token_hex(3)}"


def _locked(exc: sqlite3.OperationalError) -> bool:
    return "locked" in str(exc) or "busy" in str(exc)


class DirIdentity(NamedTuple):
    """What makes two spellings of a run directory the same directory."""

    real: str  # the path with every symlink and `..` resolved (as far as it exists)
    inode: tuple[int, int] | None  # (device, inode) where the directory exists

    def same(self, other: DirIdentity) -> bool:
        return self.real == other.real or (self.inode is not None and self.inode == other.inode)


def dir_identity(path: str | os.PathLike) -> DirIdentity:
    """The run directory's identity: `runs/x`, `runs/../runs/x` and a symlink to it are one."""
    real = os.path.realpath(os.path.expanduser(path))
    try:
        st = os.stat(real)
        inode = (st.st_dev, st.st_ino)
    except OSError:
        inode = None
    return DirIdentity(real, inode)


def _refuse_busy_run_dir(conn: sqlite3.Connection, run_dir: str) -> None:
    marks = ",".join("?" * len(LIVE_RUN_STATES))
    want = dir_identity(run_dir)
    rows = conn.execute(
        f"SELECT run_id, state, run_dir FROM runs WHERE state IN ({marks}) ORDER BY created DESC",
        sorted(LIVE_RUN_STATES),
    ).fetchall()
    for row in rows:
        if row["run_dir"] == run_dir or dir_identity(row["run_dir"]).same(want):
            also = "" if row["run_dir"] == run_dir else f" (the same directory as {run_dir})"
            raise RegistryError(
                f"run {row['run_id']} is still {row['state']} in {row['run_dir']}{also}; "
                f"hpcrl cancel {row['run_id']}, or pick another hpcrl.run_name"
            )


def damaged(path: Path, detail: str) -> RegistryError:
    """The one-line error for a registry file SQLite cannot read."""
    lines = [ln.strip() for ln in detail.replace("*** in database main ***", "").splitlines() if ln.strip()]
    detail = lines[0] + (f" and {len(lines) - 1} more problems" if len(lines) > 1 else "") if lines else "unreadable"
    return RegistryError(
        f"registry {path} is damaged ({detail}); `hpcrl runs --repair` keeps what can be read and "
        f"moves the file aside, or move it away yourself (mv {path} {path}.damaged) to start a new one"
    )


def _create_file(path: Path) -> None:
    """A new registry, schema included, put in place atomically (link): no process ever opens a
    half-made one, so an empty or headless file is always damage, never a registry being born."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        conn = sqlite3.connect(tmp, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        Registry._migrate(conn)
        conn.close()  # the last close checkpoints the WAL into the file
        try:
            os.link(tmp, path)
            note_made(path)
        except FileExistsError:
            pass  # another process created it first: use theirs
    finally:
        for leftover in (tmp, f"{tmp}-wal", f"{tmp}-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(leftover)


class Registry:
    """Runs and jobs in SQLite. Each method is one short transaction."""

    def __init__(self, path: str | os.PathLike | None = None, create: bool = True):
        """Open the registry; without `create`, a missing file is an error and nothing is made."""
        self.path = default_path(path)
        if not create and not self.path.exists():
            raise RegistryError(
                f"registry {self.path}: no such file, so the registry has no runs yet "
                "(hpcrl submit records runs; --registry or $HPCRL_REGISTRY picks another)"
            )
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if not self.path.exists():
                _create_file(self.path)
        except OSError as exc:
            raise RegistryError(f"registry {self.path}: cannot create it ({exc.strerror})") from None
        except sqlite3.Error as exc:
            raise RegistryError(f"registry {self.path}: cannot create it ({exc})") from None
        self._conn = self._connect()

    def _connect(self) -> sqlite3.Connection:
        try:
            if self.path.stat().st_size == 0:
                raise damaged(self.path, "the file is empty: it was truncated")
        except OSError as exc:
            raise RegistryError(f"registry {self.path}: cannot open ({exc.strerror})") from None
        try:
            conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
        except sqlite3.Error as exc:
            raise RegistryError(f"registry {self.path}: cannot open ({exc})") from None
        conn.row_factory = sqlite3.Row
        try:
            self._retry(lambda: conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}"))
            conn.execute("PRAGMA foreign_keys=ON")
            # Switching to WAL takes a write lock; a concurrent first open may find it held.
            self._retry(lambda: conn.execute("PRAGMA journal_mode=WAL"))
            problems = [r[0] for r in self._retry(lambda: conn.execute("PRAGMA quick_check(3)").fetchall())]
            if problems != ["ok"]:
                raise damaged(self.path, "\n".join(str(p) for p in problems))
            self._retry(lambda: self._migrate(conn))
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise damaged(self.path, str(exc)) from None
        except RegistryError:
            conn.close()
            raise
        return conn

    @staticmethod
    def _migrate(conn: sqlite3.Connection) -> None:
        if conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION:
            return
        conn.execute("BEGIN IMMEDIATE")
        try:
            for stmt in filter(str.strip, _SCHEMA.split(";")):
                conn.execute(stmt)
            conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def _retry(self, fn):
        deadline, attempt = time.monotonic() + LOCK_WAIT_S, 0
        while True:
            try:
                return fn()
            except sqlite3.OperationalError as exc:
                if not _locked(exc):
                    raise RegistryError(f"registry {self.path}: {exc}") from None
                if time.monotonic() >= deadline:
                    raise locked_error(self.path, LOCK_WAIT_S) from None
                time.sleep(min(0.05 * 2**attempt, 1.0) + secrets.randbelow(50) / 1000)
                attempt += 1
            except sqlite3.DatabaseError as exc:  # malformed pages, not a database, ...
                raise damaged(self.path, str(exc)) from None

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        conn = self._conn
        self._retry(lambda: conn.execute("BEGIN IMMEDIATE"))
        try:
            yield conn
        except sqlite3.DatabaseError as exc:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            if isinstance(exc, (sqlite3.IntegrityError, sqlite3.OperationalError)):
                raise
            raise damaged(self.path, str(exc)) from None
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise
        self._retry(lambda: conn.execute("COMMIT"))

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        try:
            yield self._conn
        except sqlite3.OperationalError as exc:
            if _locked(exc):  # a read waits BUSY_TIMEOUT_MS only: the lock, not damage
                raise locked_error(self.path, LOCK_WAIT_S) from None
            raise damaged(self.path, str(exc)) from None
        except sqlite3.DatabaseError as exc:
            raise damaged(self.path, str(exc)) from None

    def close(self) -> None:
        self._conn.close()

    # ------------------------------------------------------------------ writes

    def create_run(
        self,
        *,
        name: str,
        cluster: str,
        config_hash: str,
        script_path: str,
        run_dir: str,
        state: str,
        max_restarts: int | None,
        reason: str = "",
        claim_run_dir: bool = False,
    ) -> str:
        """Insert a run under a fresh id and return the id. With claim_run_dir, the check that no
        live run uses run_dir and the insert are one transaction: of two submits into one run dir
        at the same moment, exactly one gets it (a row in a live state then holds the run dir)."""
        stamp = now()
        for _ in range(20):
            run_id = new_run_id(name)
            try:
                with self._write() as c:
                    if claim_run_dir:
                        _refuse_busy_run_dir(c, run_dir)
                    c.execute(
                        "INSERT INTO runs VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                        (
                            run_id,
                            name,
                            cluster,
                            config_hash,
                            script_path,
                            run_dir,
                            stamp,
                            state,
                            reason,
                            max_restarts,
                            stamp,
                        ),
                    )
                return run_id
            except sqlite3.IntegrityError:
                continue  # the 6 hex digits collided; draw again
        raise RegistryError(f"registry {self.path}: could not find a free run id for {name!r}")

    def forget_run(self, run_id: str) -> None:
        """Remove a run that has no job, such as a dry run whose script could not be written: a command
        that fails leaves no row behind."""
        with self._write() as c:
            c.execute(
                "DELETE FROM runs WHERE run_id=? AND NOT EXISTS (SELECT 1 FROM jobs WHERE jobs.run_id=runs.run_id)",
                (run_id,),
            )

    def set_run(self, run_id: str, *, state: str | None = None, reason: str | None = None) -> None:
        with self._write() as c:
            c.execute(
                "UPDATE runs SET state=COALESCE(?, state), reason=COALESCE(?, reason), updated=? WHERE run_id=?",
                (state, reason, now(), run_id),
            )

    def add_job(
        self,
        run_id: str,
        job_id: str,
        *,
        state: str = "PENDING",
        submitted: str | None = None,
        run_state: str | None = None,
    ) -> int:
        """Append a job to the run's chain (no-op if the job is already there); returns its seq.
        With run_state, the run's state changes in the same transaction (a submit's job and its
        `pending` are recorded together or not at all)."""
        with self._write() as c:
            row = c.execute("SELECT seq FROM jobs WHERE run_id=? AND job_id=?", (run_id, job_id)).fetchone()
            if row:
                return int(row[0])
            seq = c.execute("SELECT COALESCE(MAX(seq)+1, 0) FROM jobs WHERE run_id=?", (run_id,)).fetchone()[0]
            c.execute(
                "INSERT INTO jobs VALUES (?,?,?,?,?,?,?,?)",
                (run_id, seq, job_id, state, "", None, submitted or now(), None),
            )
            c.execute("UPDATE runs SET updated=?, state=COALESCE(?, state) WHERE run_id=?", (now(), run_state, run_id))
            return int(seq)

    def update_jobs(self, rows: list[Job]) -> None:
        """Write back states, reasons, exit codes and end times of jobs (one transaction)."""
        if not rows:
            return
        with self._write() as c:
            c.executemany(
                "UPDATE jobs SET state=?, reason=?, exit_code=?, ended=? WHERE run_id=? AND seq=?",
                [(j.state, j.reason, j.exit_code, j.ended, j.run_id, j.seq) for j in rows],
            )

    # ------------------------------------------------------------------ reads

    def _jobs(self, run_ids: list[str]) -> dict[str, list[Job]]:
        out: dict[str, list[Job]] = {r: [] for r in run_ids}
        if not run_ids:
            return out
        marks = ",".join("?" * len(run_ids))
        with self._read() as c:
            for row in c.execute(f"SELECT * FROM jobs WHERE run_id IN ({marks}) ORDER BY run_id, seq", run_ids):
                out[row["run_id"]].append(Job(**dict(row)))
        return out

    def _with_jobs(self, rows: list[sqlite3.Row]) -> list[Run]:
        jobs = self._jobs([r["run_id"] for r in rows])
        return [Run(**dict(r), jobs=tuple(jobs[r["run_id"]])) for r in rows]

    def list_runs(self, limit: int | None = None, *, live_only: bool = False) -> list[Run]:
        """Runs, newest first."""
        where = f"WHERE state IN ({','.join(repr(s) for s in sorted(LIVE_RUN_STATES))})" if live_only else ""
        sql = f"SELECT * FROM runs {where} ORDER BY created DESC, rowid DESC"
        if limit:
            sql += f" LIMIT {int(limit)}"
        with self._read() as c:
            rows = c.execute(sql).fetchall()
        return self._with_jobs(rows)

    def get(self, run_id: str) -> Run:
        with self._read() as c:
            rows = c.execute("SELECT * FROM runs WHERE run_id=?", (run_id,)).fetchall()
        if not rows:
            raise self._unknown(run_id)
        return self._with_jobs(rows)[0]

    def find(self, ref: str) -> Run:
        """A run by id, unique id prefix, or the id of one of its Slurm jobs."""
        ref = ref.strip()
        with self._read() as c:
            rows = c.execute("SELECT * FROM runs WHERE run_id=?", (ref,)).fetchall()
            if not rows:
                escaped = ref.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
                rows = c.execute(
                    "SELECT * FROM runs WHERE run_id LIKE ? ESCAPE '\\' ORDER BY created DESC", (escaped + "%",)
                ).fetchall()
            if not rows and ref.isdigit():
                rows = c.execute(
                    "SELECT runs.* FROM runs JOIN jobs USING (run_id) WHERE jobs.job_id=?", (ref,)
                ).fetchall()
        if len(rows) > 1 and any(r["state"] != "dry-run" for r in rows):
            rows = [r for r in rows if r["state"] != "dry-run"]  # a prefix means a real run before a dry run
        if len(rows) > 1:
            ids = ", ".join(r["run_id"] for r in rows[:8])
            raise RegistryError(f"run id {ref!r} is ambiguous: it matches {ids}; give more of the id")
        if not rows:
            raise self._unknown(ref)
        return self._with_jobs(rows)[0]

    def _unknown(self, ref: str) -> RegistryError:
        with self._read() as c:
            recent = [
                r["run_id"] for r in c.execute("SELECT run_id FROM runs ORDER BY created DESC, rowid DESC LIMIT 5")
            ]
        known = f"recent runs: {', '.join(recent)}" if recent else "the registry has no runs yet"
        return RegistryError(f"unknown run {ref!r} in {self.path}; {known}")


__all__ = [
    "DirIdentity",
    "Job",
    "LIVE_RUN_STATES",
    "RUN_STATES",
    "Registry",
    "Run",
    "default_path",
    "dir_identity",
    "new_run_id",
    "now",
]
