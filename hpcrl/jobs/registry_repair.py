"""`hpcrl runs --repair`: a new registry from what a damaged one still lets SQLite read.

A registry can be damaged by a full disk, a copy taken mid-write, or a filesystem fault. The
repair reads every row it can (the whole table at once, else row by row, skipping what a bad
page hides; under a damaged file header, through a fresh header of each page size), writes them into a fresh registry, moves the damaged file (and its WAL) aside
with a time stamp, and puts the new one in its place. Jobs whose run was lost go too: the
registry cannot name their run directory.
"""

from __future__ import annotations

import os
import sqlite3
from datetime import datetime, timezone
from pathlib import Path
from typing import NamedTuple

from hpcrl.errors import RegistryError
from hpcrl.jobs.registry import Registry, default_path

# Row-by-row probing stops after this many rowids in a row that gave nothing.
PROBE_GAP = 2000
PROBE_LIMIT = 1_000_000


class Repaired(NamedTuple):
    path: Path
    moved_to: Path | None  # where the damaged file went (None: there was nothing to move)
    runs: int
    jobs: int
    jobs_dropped: int  # readable jobs whose run row was lost


def _columns(conn: sqlite3.Connection, table: str, fallback: list[str]) -> list[str]:
    try:
        cols = [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]
    except sqlite3.DatabaseError:
        cols = []
    return cols or fallback


def _read_table(conn: sqlite3.Connection, table: str, columns: list[str]) -> list[tuple]:
    select = f"SELECT {', '.join(columns)} FROM {table}"
    try:
        return conn.execute(select).fetchall()
    except sqlite3.DatabaseError:
        pass
    rows, gap, rowid = [], 0, 0
    while gap < PROBE_GAP and rowid < PROBE_LIMIT:
        rowid += 1
        try:
            row = conn.execute(f"{select} WHERE rowid=?", (rowid,)).fetchone()
        except sqlite3.DatabaseError:
            row = None
        if row is None:
            gap += 1
        else:
            rows.append(row)
            gap = 0
    return rows


# SQLite's file header (sqlite.org/fileformat.html): 100 bytes on page 1, the page size at 16..17.
HEADER, PAGE_SIZES = 100, (4096, 1024, 2048, 8192, 16384, 32768, 65536, 512)


def _with_new_header(path: Path, page_size: int, out: Path) -> Path:
    """A copy of path whose file header is a fresh database's of that page size, with the page
    count left for SQLite to take from the file's size (a damaged header hides every row)."""
    blank = out.with_name(out.name + ".blank")
    conn = sqlite3.connect(blank)
    conn.execute(f"PRAGMA page_size={page_size}")
    conn.execute("VACUUM")
    conn.close()
    header = bytearray(blank.read_bytes()[:HEADER])
    blank.unlink()
    header[28:32] = bytes(4)  # the database size in pages: 0 makes SQLite use the file's size
    data = path.read_bytes()
    out.write_bytes(bytes(header) + data[HEADER:])
    return out


def _salvage_header(path: Path) -> tuple[list[tuple], list[tuple], list[str], list[str]]:
    """When only the header is damaged: the rows under each page size's fresh header, the most found."""
    best: tuple[list[tuple], list[tuple], list[str], list[str]] = ([], [], [], [])
    for size in PAGE_SIZES:
        if path.stat().st_size % size:
            continue
        copy = _with_new_header(path, size, path.with_name(f".{path.name}.header-{size}"))
        try:
            found = _salvage(copy, header_too=False)
        finally:
            copy.unlink(missing_ok=True)
        if len(found[0]) > len(best[0]):
            best = found
    return best


def _salvage(path: Path, header_too: bool = True) -> tuple[list[tuple], list[tuple], list[str], list[str]]:
    if not path.exists() or path.stat().st_size == 0:
        return [], [], [], []
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.DatabaseError:
        return _salvage_header(path) if header_too and path.stat().st_size > HEADER else ([], [], [], [])
    try:
        run_cols = _columns(conn, "runs", [])
        job_cols = _columns(conn, "jobs", [])
        runs = _read_table(conn, "runs", run_cols) if run_cols else []
        jobs = _read_table(conn, "jobs", job_cols) if job_cols else []
    finally:
        conn.close()
    return runs, jobs, run_cols, job_cols


def repair(path: str | os.PathLike | None = None) -> Repaired:
    """Rebuild the registry at path from what can be read; the damaged file is kept, renamed."""
    target = default_path(path)
    runs, jobs, run_cols, job_cols = _salvage(target)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    moved = target.with_name(f"{target.name}.damaged-{stamp}") if target.exists() else None
    fresh = target.with_name(f".{target.name}.repair-{stamp}")
    reg = Registry(fresh)
    conn = reg._conn
    new_run_cols = [r[1] for r in conn.execute("PRAGMA table_info(runs)")]
    new_job_cols = [r[1] for r in conn.execute("PRAGMA table_info(jobs)")]
    kept_runs: set[str] = set()
    conn.execute("BEGIN IMMEDIATE")
    for row in runs:
        rec = dict(zip(run_cols, row))
        cols = [c for c in new_run_cols if c in rec]
        try:
            conn.execute(
                f"INSERT INTO runs ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})", [rec[c] for c in cols]
            )
            kept_runs.add(rec["run_id"])
        except (sqlite3.DatabaseError, KeyError):
            continue  # a row too damaged to satisfy the schema
    kept_jobs = dropped = 0
    for row in jobs:
        rec = dict(zip(job_cols, row))
        if rec.get("run_id") not in kept_runs:
            dropped += 1
            continue
        cols = [c for c in new_job_cols if c in rec]
        try:
            conn.execute(
                f"INSERT INTO jobs ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})", [rec[c] for c in cols]
            )
            kept_jobs += 1
        except sqlite3.DatabaseError:
            dropped += 1
    conn.execute("COMMIT")
    reg.close()  # checkpoints the WAL into the file
    try:
        if moved is not None:
            os.replace(target, moved)
            for suffix in ("-wal", "-shm"):
                side = Path(f"{target}{suffix}")
                if side.exists():
                    os.replace(side, Path(f"{moved}{suffix}"))
        os.replace(fresh, target)
    except OSError as exc:
        raise RegistryError(
            f"registry {target}: cannot put the repaired file in place ({exc.strerror}); it is at {fresh}"
        ) from None
    for suffix in ("-wal", "-shm"):
        Path(f"{fresh}{suffix}").unlink(missing_ok=True)
    return Repaired(target, moved, len(kept_runs), kept_jobs, dropped)


__all__ = ["Repaired", "repair"]
