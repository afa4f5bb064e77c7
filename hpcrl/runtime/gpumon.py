"""Per-node GPU monitor: `python -m hpcrl.runtime.gpumon --out D/gpu-{node}.csv --role learner`.

Samples NVML (nvidia-ml-py) every --interval seconds and appends one CSV row per GPU:

    timestamp,node,role,gpu,memory_used_mib,memory_total_mib,utilization_pct,power_w,mean_power_w,flag

role is --role, or with --detect-roles what the GPU's compute processes are (NVML lists them,
/proc names them): "learner" (open-instruct's PolicyTrainerRayProcess, OpenRLHF's model
actors), "engine" (vLLM: LLMRayActor, RayWorkerWrapper, VLLM:: processes), "mixed" (both, or
verl's WorkerDict, which holds actor, rollout and reference), "idle" (no process), else --role.
mean_power_w is the GPU's running mean since the monitor started. flag is empty, or
"idle_risk" once the grace period is over and that mean is under the cluster's idle-GPU
threshold (Berzelius cancels jobs whose GPUs average under 100 W after their first hour; its
exact averaging is not documented, see docs/safety.md), or "no_gpu_found" on the single marker
row written when NVML has no GPU to show. A field NVML cannot read is left empty.
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import signal
import socket
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import pynvml
from hpcrl.runtime.job_log import say

HEADER = [
    "timestamp",
    "node",
    "role",
    "gpu",
    "memory_used_mib",
    "memory_total_mib",
    "utilization_pct",
    "power_w",
    "mean_power_w",
    "flag",
]
ROLES = ("learner", "engine", "mixed", "head")
# Process names (Ray sets an actor's title to ray::<Class>[.<method>]).
LEARNER_PROCS = re.compile(r"PolicyTrainerRayProcess|(?:Actor|Reference|Critic|Reward)ModelRayActor")
ENGINE_PROCS = re.compile(r"LLMRayActor|RayWorkerWrapper|VLLM::|EngineCore")
COLOCATED_PROCS = re.compile(r"WorkerDict")


def node_name() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def _read(fn: Callable[[], float]) -> float | None:
    try:
        return fn()
    except pynvml.NVMLError:
        return None


def open_nvml() -> int:
    """Number of GPUs NVML sees; 0 when there is no driver or no device."""
    try:
        pynvml.nvmlInit()
    except (pynvml.NVMLError, OSError):
        return 0
    try:
        return int(pynvml.nvmlDeviceGetCount())
    except pynvml.NVMLError:
        return 0


def sample(index: int) -> dict[str, float | None]:
    """One reading of GPU `index`: memory in MiB, utilisation in %, power in W."""
    h = pynvml.nvmlDeviceGetHandleByIndex(index)
    mem = _read(lambda: pynvml.nvmlDeviceGetMemoryInfo(h))
    return {
        "memory_used_mib": None if mem is None else mem.used / 2**20,  # type: ignore[attr-defined]
        "memory_total_mib": None if mem is None else mem.total / 2**20,  # type: ignore[attr-defined]
        "utilization_pct": _read(lambda: float(pynvml.nvmlDeviceGetUtilizationRates(h).gpu)),
        "power_w": _read(lambda: pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0),
    }


def process_role(cmdline: str) -> str | None:
    """learner, engine or mixed for a process name of a known framework; None otherwise."""
    if COLOCATED_PROCS.search(cmdline):
        return "mixed"
    if LEARNER_PROCS.search(cmdline):
        return "learner"
    if ENGINE_PROCS.search(cmdline):
        return "engine"
    return None


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""  # ended, or in another PID namespace


def gpu_role(index: int, fallback: str) -> str:
    """The role of GPU `index` from its compute processes; `fallback` when none is recognised."""
    try:
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(index))
    except pynvml.NVMLError:
        return fallback
    if not procs:
        return "idle"
    known = {role for p in procs if (role := process_role(_cmdline(p.pid))) is not None}
    if not known:
        return fallback
    return known.pop() if len(known) == 1 else "mixed"


class IdleRule:
    """Running mean power per GPU against a threshold, checked after a grace period."""

    def __init__(self, min_mean_power_w: float | None, grace_s: float, start: float):
        self.min_w, self.grace_s, self.start = min_mean_power_w, grace_s, start
        self.sums: dict[int, tuple[float, int]] = {}
        self.warned: set[int] = set()

    def add(self, gpu: int, power_w: float | None, now: float) -> tuple[float | None, bool]:
        """(running mean, at risk) after adding a reading."""
        total, n = self.sums.get(gpu, (0.0, 0))
        if power_w is not None:
            total, n = total + power_w, n + 1
            self.sums[gpu] = (total, n)
        mean = total / n if n else None
        risk = bool(self.min_w and mean is not None and now - self.start >= self.grace_s and mean < self.min_w)
        return mean, risk


def _fmt(v: float | None) -> str:
    return "" if v is None else f"{v:.1f}"


def _write_samples(
    w: Any, rule: IdleRule, n_gpus: int, node: str, label: str, now_s: float, detect_roles: bool
) -> None:
    stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
    for i in range(n_gpus):
        s = sample(i)
        role = gpu_role(i, label) if detect_roles else label
        mean, risk = rule.add(i, s["power_w"], now_s)
        w.writerow(
            [
                stamp,
                node,
                role,
                i,
                _fmt(s["memory_used_mib"]),
                _fmt(s["memory_total_mib"]),
                _fmt(s["utilization_pct"]),
                _fmt(s["power_w"]),
                _fmt(mean),
                "idle_risk" if risk else "",
            ]
        )
        if risk and i not in rule.warned:  # warn once per GPU each time it becomes at risk
            rule.warned.add(i)
            say(
                f"gpumon: WARNING {node} GPU {i} ({role}) averages {mean:.0f} W since start, under the cluster's "
                f"{rule.min_w:g} W idle-GPU threshold: the job risks cancellation"
            )
        elif not risk:
            rule.warned.discard(i)


def monitor(
    out: Path,
    role: str,
    interval: float,
    *,
    node: str | None = None,
    min_mean_power_w: float | None = None,
    grace_minutes: float = 0.0,
    count: int | None = None,
    keep_running: bool = False,
    detect_roles: bool = False,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Sample until SIGTERM/SIGINT (or `count` rounds); returns the exit status."""
    node = node or node_name()
    out = Path(str(out).replace("{node}", node))
    out.parent.mkdir(parents=True, exist_ok=True)
    fresh = not out.exists() or out.stat().st_size == 0
    n_gpus = open_nvml()
    stop: list[int] = []
    previous = {sig: signal.signal(sig, lambda s, _f: stop.append(s)) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        with open(out, "a", newline="") as f:
            w = csv.writer(f, lineterminator="\n")
            if fresh:
                w.writerow(HEADER)
            if n_gpus == 0:
                stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
                w.writerow([stamp, node, role, "", "", "", "", "", "", "no_gpu_found"])
                f.flush()
                say(f"gpumon: no NVIDIA GPU found on {node}")
                while keep_running and not stop:  # stay up so the job script treats every node alike
                    sleep(min(interval, 1.0))
                return 0
            rule = IdleRule(min_mean_power_w, grace_minutes * 60, clock())
            rounds = 0
            while not stop and (count is None or rounds < count):
                _write_samples(w, rule, n_gpus, node, role, clock(), detect_roles)
                f.flush()
                rounds += 1
                if count is None or rounds < count:
                    sleep(interval)
            return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if n_gpus:
            try:
                pynvml.nvmlShutdown()
            except pynvml.NVMLError:
                pass


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hpcrl.runtime.gpumon", description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, type=Path, help="CSV to append to; {node} becomes the node name")
    p.add_argument("--interval", type=float, default=5.0)
    p.add_argument("--role", choices=ROLES, default="mixed", help="label (with --detect-roles: for unrecognised GPUs)")
    p.add_argument("--detect-roles", action="store_true", help="label each GPU by its compute processes")
    p.add_argument("--node", default=None, help="default: $SLURMD_NODENAME or the host name")
    p.add_argument("--cluster", default=None, help="take the idle-GPU rule from this hpcrl profile")
    p.add_argument("--min-mean-power-w", type=float, default=None)
    p.add_argument("--grace-minutes", type=float, default=None)
    p.add_argument("--count", type=int, default=None, help="stop after this many rounds")
    p.add_argument("--keep-running", action="store_true", help="without GPUs, stay up until signalled")
    a = p.parse_args(argv)
    if a.interval <= 0:
        p.error("--interval must be positive")
    min_w, grace = a.min_mean_power_w, a.grace_minutes
    if a.cluster:
        from hpcrl.errors import HpcrlError  # noqa: PLC0415 - only with --cluster
        from hpcrl.profiles import load_profile  # noqa: PLC0415

        try:
            rule = load_profile(a.cluster).idle_gpu_policy
        except HpcrlError as exc:
            say(f"gpumon: error: {exc}")
            return 2
        if rule is not None:
            min_w = rule.min_mean_power_w if min_w is None else min_w
            grace = rule.grace_minutes if grace is None else grace
    return monitor(
        a.out,
        a.role,
        a.interval,
        node=a.node,
        min_mean_power_w=min_w,
        grace_minutes=grace or 0.0,
        count=a.count,
        keep_running=a.keep_running,
        detect_roles=a.detect_roles,
    )


if __name__ == "__main__":
    sys.exit(main())
