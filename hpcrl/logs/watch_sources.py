"""The GPU monitor's CSVs and the run directory's size as `hpcrl watch` reads them, a little at a time (pure).

GpuTails keeps, per node and GPU, the newest sample and the peak of the rows read so far (each CSV read
incrementally, from its last START_BYTES the first time); `dir_bytes` walks the run directory once.
"""

from __future__ import annotations

import csv
import os
from datetime import datetime
from pathlib import Path

from hpcrl.logs.report import CLOCK_SLACK, MIB_PER_GIB, parse_time, predicted_for
from hpcrl.logs.tail import Tail
from hpcrl.logs.watch_model import NodeGpu

# A GPU monitor row is ~90 bytes, one per GPU every 5 s: 16 MiB is more than a day of an 8-GPU node.
START_BYTES = 16 << 20


class _Csv:
    def __init__(self, path: Path) -> None:
        self.tail = Tail(path, START_BYTES)
        self.header: list[str] | None = None

    def rows(self) -> list[dict[str, str]]:
        if self.header is None:
            try:
                with open(self.tail.path, newline="", errors="replace") as f:
                    first = f.readline()
            except FileNotFoundError:
                return []
            if not first.endswith("\n"):
                return []  # the header is still being written
            self.header = next(csv.reader([first]))
        lines = self.tail.lines()
        return [dict(zip(self.header, r)) for r in csv.reader(lines) if r and r != self.header]


class GpuTails:
    """Per node and GPU: its newest sample and its peak, from every hpcrl/gpu-*.csv of the run."""

    def __init__(self, hp_dir: Path) -> None:
        self.hp_dir = hp_dir
        self.since: datetime | None = None
        self._reset()

    def _reset(self) -> None:
        self._files: dict[str, _Csv] = {}
        self.gpus: dict[tuple[str, int], dict] = {}
        self.no_gpu: set[str] = set()

    def read(self, since: datetime | None) -> None:
        """Read what the monitors appended; rows older than `since` (less the clock slack) are an earlier run's."""
        if since != self.since:  # the chain's start became known (or changed): read again under it
            self.since = since
            self._reset()
        for path in sorted(self.hp_dir.glob("gpu-*.csv")):
            src = self._files.setdefault(path.name, _Csv(path))
            fallback = path.stem.removeprefix("gpu-")
            for row in src.rows():
                self._take(row, fallback)

    def _take(self, row: dict[str, str], fallback_node: str) -> None:
        t = parse_time(row.get("timestamp"))
        if t is None or (self.since is not None and t < self.since - CLOCK_SLACK):
            return
        node = row.get("node") or fallback_node
        if (row.get("flag") or "") == "no_gpu_found":
            self.no_gpu.add(node)
            return
        try:
            gpu, used = int(row["gpu"]), float(row["memory_used_mib"])
        except (KeyError, TypeError, ValueError):
            return  # NVML could not read this GPU's memory this round
        g = self.gpus.setdefault((node, gpu), {"peak": -1.0, "time": None})
        g["peak"] = max(g["peak"], used)
        if g["time"] is None or t >= g["time"]:
            g.update(
                time=t,
                used=used,
                role=row.get("role") or "mixed",
                total=_float(row.get("memory_total_mib")),
                util=_float(row.get("utilization_pct")),
            )

    def nodes(self, pred: dict | None, now: float) -> list[NodeGpu]:
        """One row per node: its fullest GPU now and at peak, against the plan's per-GPU figure."""
        by_node: dict[str, list[dict]] = {}
        for (node, _), g in sorted(self.gpus.items()):
            by_node.setdefault(node, []).append(g)
        out = []
        for node, gs in by_node.items():
            newest = max(g["time"] for g in gs)
            current = [g for g in gs if (newest - g["time"]).total_seconds() <= 60]  # this round's rows
            roles = sorted({g["role"] for g in gs})
            planned = [p for p in (predicted_for(r, pred) for r in roles) if p[0] is not None]
            top = max(planned, default=(None, ""))
            utils = [g["util"] for g in current if g["util"] is not None]
            totals = [g["total"] for g in gs if g["total"] is not None]
            out.append(
                NodeGpu(
                    node=node,
                    roles=roles,
                    gpus=len(gs),
                    now_gib=round(max(g["used"] for g in current) / MIB_PER_GIB, 2),
                    peak_gib=round(max(g["peak"] for g in gs) / MIB_PER_GIB, 2),
                    total_gib=round(max(totals) / MIB_PER_GIB, 2) if totals else None,
                    util_pct=round(sum(utils) / len(utils), 1) if utils else None,
                    plan_gib=top[0],
                    plan_as=top[1],
                    sampled=newest.isoformat(timespec="seconds"),
                    age_s=round(max(now - newest.timestamp(), 0.0), 1),
                )
            )
        return out

    def note(self) -> str | None:
        if self.gpus:
            return None
        if not self._files:
            return "no GPU samples yet (no hpcrl/gpu-*.csv: the GPU monitor starts with the job)"
        if self.no_gpu:
            return f"no GPU samples (the monitor found no NVIDIA GPU on {', '.join(sorted(self.no_gpu))})"
        return "no GPU samples yet (the monitor's CSVs hold no readable rows)"


def _float(text: str | None) -> float | None:
    try:
        return float(text) if text not in (None, "") else None
    except ValueError:
        return None


def dir_bytes(path: Path) -> int:
    """The bytes a directory tree holds on disk (allocated blocks; symlinks not followed)."""
    total, stack = 0, [str(path)]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            continue
        for e in entries:
            try:
                st = e.stat(follow_symlinks=False)
            except (FileNotFoundError, PermissionError):
                continue  # removed meanwhile (a pruned checkpoint), or not ours to read
            total += getattr(st, "st_blocks", 0) * 512 or st.st_size
            if e.is_dir(follow_symlinks=False):
                stack.append(e.path)
    return total


def fs_space(path: Path) -> tuple[int | None, int | None]:
    """(free for this user, total) bytes of the file system holding `path`."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None, None
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


__all__ = ["START_BYTES", "GpuTails", "dir_bytes", "fs_space"]
