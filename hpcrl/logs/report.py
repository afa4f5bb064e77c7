"""`hpcrl report RUN`: what a run did, read from its run directory (docs/run-dir.md).

Pure: files in, a dict with a stable schema out (plus its Markdown and a plot); Slurm is never
asked. The job chain and reasons come from `hpcrl/jobs.tsv` (the registry row, when the caller
has one, adds Slurm's states), the breaker from `hpcrl/breaker.json`, GPU memory from the
monitor's `hpcrl/gpu-<node>.csv`, the prediction from `hpcrl/plan.json`, the last metrics from
the newest job log through the watchdog's step parser, checkpoints through hpcrl.logs.checkpoints.
"""

from __future__ import annotations

import csv
import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, NamedTuple

from hpcrl import contract as C
from hpcrl.errors import RunDirUnreadable
from hpcrl.logs.checkpoints import find_checkpoints
from hpcrl.logs.driver_log import StepFormat, StepParser, reward_unseen
from hpcrl.logs.log_format import plan_format, union_format
from hpcrl.logs.metric_keys import summary_keys
from hpcrl.logs.report_timing import timing

SCHEMA_VERSION = 1
MIB_PER_GIB = 1024.0
# A run directory is reused by a later run of the same name, and jobs.tsv and the GPU CSVs are
# appended to: rows older than the chain's first start (less this slack for node clocks) are
# an earlier run's.
CLOCK_SLACK = timedelta(seconds=120)
# The roles a GPU can have, in the order tables and the plot list them (and the plot's colours).
ROLE_COLORS = {
    "learner": "tab:blue",
    "engine": "tab:orange",
    "mixed": "tab:purple",
    "head": "tab:green",
    "idle": "tab:gray",
}
NO_PLAN = "No prediction: plan.json holds no memory plan (a run submitted as a bare script)."


class Event(NamedTuple):
    job: str
    event: str
    stamp: str
    detail: str


def parse_time(stamp: str | None) -> datetime | None:
    """ISO 8601 as jobs.tsv, the registry, gpumon and the watchdog write it; None if unreadable."""
    try:
        t = datetime.fromisoformat(stamp.strip().replace("Z", "+00:00"))  # type: ignore[union-attr]
    except (AttributeError, ValueError):
        return None
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def _seconds(a: datetime | None, b: datetime | None) -> float | None:
    return (b - a).total_seconds() if a and b else None


def fmt_duration(seconds: float | None) -> str:
    """1h 02m 03s; '-' for unknown."""
    if seconds is None:
        return "-"
    s = int(round(seconds))
    sign, s = ("-", -s) if s < 0 else ("", s)
    h, m, sec = s // 3600, s // 60 % 60, s % 60
    return sign + (f"{h}h {m:02d}m {sec:02d}s" if h else f"{m}m {sec:02d}s" if m else f"{sec}s")


def fmt_bytes(n: int | float) -> str:
    unit, size = next(((u, s) for u, s in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)) if n >= s), ("B", 1))
    return f"{n / size:,.2f} {unit}" if size > 1 else f"{int(n)} B"


def read_events(path: Path) -> list[Event]:
    """Every well-formed jobs.tsv line; a torn last line is skipped."""
    try:
        rows = [[p.strip() for p in line.split("\t")] for line in path.read_text(errors="replace").splitlines()]
    except FileNotFoundError:
        return []
    except OSError as exc:  # EIO and the like: the run's file system failed, in one line
        raise RunDirUnreadable(path, exc) from None
    return [Event(*parts) for parts in rows if len(parts) == 4 and parts[0]]


def chain_ids(events: list[Event], known: list[str]) -> list[str]:
    """The run's jobs in order: `known` (the registry's) else the newest chain in jobs.tsv, then its continuations."""
    nxt = {e.job: e.detail for e in events if e.event == "continue" and e.detail.isdigit()}
    ids = list(known)
    if not ids:
        targets = set(nxt.values())
        roots = [j for j in dict.fromkeys(e.job for e in events) if j not in targets]
        ids = roots[-1:]
    while ids and ids[-1] in nxt and nxt[ids[-1]] not in ids:
        ids.append(nxt[ids[-1]])
    return ids


def _job_rows(events: list[Event], ids: list[str], reg_jobs: dict[str, dict], run_dir: Path) -> list[dict]:
    first: dict[tuple[str, str], Event] = {}
    for e in events:
        first.setdefault((e.job, e.event), e)  # each event once per job; were one repeated, the first counts
    continued = {e.detail: e for e in events if e.event == "continue"}
    rows = []
    for seq, jid in enumerate(ids):
        reg, start, end, nxt = reg_jobs.get(jid, {}), *(first.get((jid, k)) for k in ("start", "end", "continue"))
        sub = first.get((jid, "submitted")) or continued.get(jid)
        submitted = sub.stamp if sub else reg.get("submitted")
        started, ended = (start.stamp if start else None), (end.stamp if end else reg.get("ended"))
        # The registry's reason of a job that has not ended is Slurm's pending reason: not an end.
        reg_reason = (reg.get("ended") and reg.get("reason")) or None
        reason, _, code = end.detail.partition(":") if end else (reg_reason, "", "")
        exit_code = int(code) if code.lstrip("-").isdigit() else reg.get("exit_code")
        logs = run_dir / C.LOGS
        log = next(
            (p for p in (logs / C.JOB_LOG.format(job=jid), logs / C.SLURM_LOG.format(job=jid)) if p.exists()), None
        )
        rows.append(
            {
                "seq": seq,
                "job_id": jid,
                "slurm_state": reg.get("state"),
                "head_node": start.detail if start else None,
                "submitted": submitted,
                "started": started,
                "ended": ended,
                "queued_s": _seconds(parse_time(submitted), parse_time(started)),
                "duration_s": _seconds(parse_time(started), parse_time(ended)),
                "end_reason": reason,
                "exit_code": exit_code,
                "next_job": nxt.detail if nxt else None,
                "failure": _failure(first.get((jid, "failure"))),
                "stack_check": (lambda e: e.detail if e else None)(first.get((jid, C.STACK_EVENT))),
                **_ray_logs(run_dir, jid, start.detail if start else None),
                "log": str(log.relative_to(run_dir)) if log else None,
            }
        )
    return rows


def _ray_logs(run_dir: Path, jid: str, head: str | None) -> dict:
    """The nodes whose Ray logs the job kept (logs/ray/<job>/<node>/), those a later job of the user
    recovered there (its sweep of the node-local dirs a dead job left), and those it ran on (the head,
    each worker's log) that kept none: a node lost, or KILLed before its cleanup."""
    kept_dir = run_dir / C.LOGS / "ray" / jid
    kept = sorted(d.name for d in kept_dir.iterdir() if not d.name.startswith(".")) if kept_dir.is_dir() else []
    recovered: list[dict[str, Any]] = []
    lost: list[dict[str, Any]] = []
    for node in kept:
        mark = kept_dir / node / C.RAY_LOGS_RECOVERED
        by, when, *rest = (mark.read_text(errors="replace").split() if mark.is_file() else []) + ["", ""]
        if by:
            # "<job> <time> none": that job's sweep found the directory the job left, with no Ray logs in it.
            (lost if rest[0] == "none" else recovered).append({"node": node, "by_job": by, "time": when or None})
    ran = {head} if head else set()
    ran |= {p.name[len("worker-") : -len(f"-{jid}.log")] for p in (run_dir / C.LOGS).glob(f"worker-*-{jid}.log")}
    gone = {r["node"] for r in lost}
    return {
        "ray_logs": [n for n in kept if n not in gone],
        "ray_logs_missing": sorted(ran - set(kept)),
        "ray_logs_recovered": recovered,
        "ray_logs_lost": lost,
    }


def failure_detail(detail: str) -> tuple[str, list[str]]:
    """A jobs.tsv `failure` line's detail, `<reason> <node,node|->`: the reason and the blamed nodes."""
    why, _, nodes = detail.partition(" ")
    return why, [n for n in nodes.split(",") if n and n != "-"]


def _failure(event: Event | None) -> dict | None:
    """A failure continuation's reason and the nodes it excluded (jobs.tsv `failure` line)."""
    if event is None:
        return None
    why, nodes = failure_detail(event.detail)
    return {"reason": why, "excluded": nodes}


def read_gpu_csvs(hp_dir: Path, since: datetime | None = None, series: bool = False) -> dict:
    """Samples of every gpu-*.csv: per-GPU peaks, nodes without GPUs, and (series=True) the time series."""
    gpus: dict[tuple[str, int, str], dict] = {}
    points: dict[tuple[str, int, str], list[tuple[datetime, float]]] = {}
    no_gpu: dict[str, set[str]] = {}
    files, samples, earlier = [], 0, 0
    for path in sorted(hp_dir.glob("gpu-*.csv")):
        files.append(path.name)
        fallback_node = path.stem.removeprefix("gpu-")
        with open(path, newline="", errors="replace") as f:
            for row in csv.DictReader(f):
                t = parse_time(row.get("timestamp"))
                if t is None:
                    continue  # a torn line, or a header repeated by a later job
                if since is not None and t < since - CLOCK_SLACK:
                    earlier += 1
                    continue
                node, role = row.get("node") or fallback_node, row.get("role") or "mixed"
                if (row.get("flag") or "") == "no_gpu_found":
                    no_gpu.setdefault(node, set()).add(role)
                    continue
                try:
                    gpu, used = int(row["gpu"]), float(row["memory_used_mib"])
                except (KeyError, TypeError, ValueError):
                    continue  # NVML could not read this GPU's memory this round
                samples += 1
                g = gpus.setdefault(
                    (node, gpu, role),
                    {
                        "node": node,
                        "gpu": gpu,
                        "role": role,
                        "samples": 0,
                        "peak_mib": -1.0,
                        "peak_time": None,
                        "total_mib": None,
                    },
                )
                g["samples"] += 1
                if used > g["peak_mib"]:
                    g["peak_mib"], g["peak_time"] = used, t.isoformat(timespec="seconds")
                try:
                    g["total_mib"] = float(row["memory_total_mib"])
                except (KeyError, TypeError, ValueError):
                    pass
                if series:
                    points.setdefault((node, gpu, role), []).append((t, used))
    out = {
        "files": files,
        "samples": samples,
        "earlier_run_samples": earlier,
        "no_gpu_nodes": sorted(set(no_gpu) - {g["node"] for g in gpus.values()}),
        "no_gpu_roles": {k: sorted(v) for k, v in sorted(no_gpu.items())},
        "gpus": [gpus[k] for k in sorted(gpus)],
    }
    if series:
        out["series"] = {k: sorted(v) for k, v in sorted(points.items())}
    return out


def predictions(plan: dict | None) -> dict | None:
    """The planner's per-GPU peaks from plan.json; None for a run submitted as a bare script."""
    mem = (plan or {}).get("memory") or {}
    learner, engine, gpu = mem.get("learner") or {}, mem.get("engine") or {}, mem.get("gpu") or {}
    if not learner and not engine:
        return None
    total, util = gpu.get("usable_gib"), engine.get("gpu_memory_utilization")
    return {
        "model": (mem.get("model") or {}).get("name") or (plan or {}).get("model"),
        "gpu_total_gib": total,
        "learner_peak_gib": learner.get("device_total_gib"),
        "engine_weights_gib": engine.get("weights_gib"),
        "engine_kv_cache_gib": engine.get("kv_cache_gib"),
        "gpu_memory_utilization": util,
        # vLLM takes gpu_memory_utilization x total up front: weights, activations, graphs, KV cache.
        "engine_reserved_gib": round(util * total, 3) if util is not None and total is not None else None,
    }


def predicted_for(role: str, pred: dict | None) -> tuple[float | None, str]:
    """The plan's per-GPU figure for a GPU of `role`, and what it is."""
    if not pred:
        return None, ""
    learner, engine = pred.get("learner_peak_gib"), pred.get("engine_reserved_gib")
    if role == "learner":
        return learner, "learner device total"
    if role == "engine":
        return engine, "vLLM reservation (utilization x total)"
    if role == "idle":
        return None, ""
    both = [v for v in (learner, engine) if v is not None]
    return (max(both), "larger of learner and vLLM (node holds both)") if both else (None, "")


def _memory_rows(gpus: list[dict], pred: dict | None) -> list[dict]:
    """Measured peak per role (the highest GPU of that role) next to the plan's prediction."""
    rows: dict[str, dict] = {r: {} for r in ROLE_COLORS if pred and r in ("learner", "engine")}
    for g in sorted(gpus, key=lambda g: -g["peak_mib"]):
        p = rows.setdefault(g["role"], {})
        if not p:
            p.update(
                measured_peak_gib=round(g["peak_mib"] / MIB_PER_GIB, 3),
                node=g["node"],
                gpu=g["gpu"],
                time=g["peak_time"],
            )
        p["gpus"], p["samples"] = p.get("gpus", 0) + 1, p.get("samples", 0) + g["samples"]
    out = []
    for role in sorted(rows, key=lambda r: list(ROLE_COLORS).index(r) if r in ROLE_COLORS else len(ROLE_COLORS)):
        p, (predicted, basis) = rows[role], predicted_for(role, pred)
        measured = p.get("measured_peak_gib")
        out.append(
            {
                "role": role,
                "measured_peak_gib": measured,
                "predicted_gib": predicted,
                "predicted_as": basis,
                "ratio": round(measured / predicted, 3) if measured is not None and predicted else None,
                **{k: p.get(k) for k in ("node", "gpu", "time")},
                "gpus": p.get("gpus", 0),
                "samples": p.get("samples", 0),
            }
        )
    return out


# The watchdog's --zero-reward-steps when the plan does not record it (the run config's default).
WATCHDOG_STEPS = C.ZERO_REWARD_STEPS


def last_metrics(
    run_dir: Path,
    logs: list[str],
    reward_keys: list[str] | None = None,
    within: int | None = None,
    fmt: StepFormat | None = None,
) -> dict | None:
    """The last training step of the newest job log that has one (then hpcrl/driver.log), read in the run's format
    (`fmt`; None: every backend's) with the run's own reward keys, when its plan names them; `reward_note` says,
    as the watchdog warns, that `within` steps passed without a reward key."""
    fmt = fmt or union_format()
    candidates = [run_dir / p for p in reversed(logs)] + [run_dir / C.META / C.DRIVER_LOG]
    for path in candidates:
        if not path.is_file():
            continue
        parser, last, count = StepParser(fmt, reward_keys or ()), None, 0
        with open(path, errors="replace") as f:
            for line in f:
                if (step := parser.feed(line)) is not None:
                    last, count = step, count + 1
        if last is not None:
            return {
                "log": str(path.relative_to(run_dir)),
                "step": last.number,
                "steps_in_log": count,
                "reward_key": last.reward_key,
                "loss_key": last.loss_key,
                "grad_norm_key": (last.grad_norm() or (None,))[0],
                "reward_note": reward_unseen(parser, count, within or WATCHDOG_STEPS),
                "values": dict(last.values),
                "text": dict(last.text),
            }
    return None


def read_breaker(hp_dir: Path, since: datetime | None) -> dict | None:
    """breaker.json, unless it is older than this chain (an earlier run's)."""
    try:
        data = json.loads((hp_dir / C.BREAKER).read_text())
    except (OSError, ValueError):
        return None
    when = parse_time(data.get("time"))
    if since is not None and when is not None and when < since - CLOCK_SLACK:
        return None
    return {k: data.get(k) for k in ("reason", "exit_code", "step", "message", "time")}


def build_report(run_dir: Path, run: dict | None = None) -> dict:
    """The report of the run in `run_dir`; `run` is its registry row (Run.to_dict()) when known."""
    try:
        return _build_report(run_dir, run)
    except OSError as exc:  # EIO and the like under any of its files: one line, not a traceback
        raise RunDirUnreadable(exc.filename or run_dir, exc) from None


def _build_report(run_dir: Path, run: dict | None) -> dict:
    hp = run_dir / C.META
    events = read_events(hp / C.JOBS_TSV)
    reg_jobs = {j["job_id"]: j for j in (run or {}).get("jobs", [])}
    ids = chain_ids(events, list(reg_jobs))
    jobs = _job_rows(events, ids, reg_jobs, run_dir)
    starts = [t for j in jobs if (t := parse_time(j["started"]))]
    since = min(starts) if starts else parse_time((run or {}).get("created"))  # a run not started yet
    other = sorted({e.job for e in events} - set(ids), key=lambda j: (len(j), j))
    try:
        plan = json.loads((hp / C.PLAN).read_text())
    except (OSError, ValueError):
        plan = None
    pred = predictions(plan if isinstance(plan, dict) else None)
    gpu = read_gpu_csvs(hp, since)
    breaker = read_breaker(hp, since)
    last = jobs[-1] if jobs else None
    reason = (last and last["end_reason"]) or (run or {}).get("reason") or None
    if breaker and not reason:
        reason = C.breaker_end_reason(breaker.get("reason") or "") or breaker.get("reason")
    ended = bool(last and last["end_reason"] and not last["next_job"])
    state = run.get("state") if run else ("ended" if ended else "unknown")  # no Slurm query here
    nodes: dict[str, dict] = {}

    def node(name: str) -> dict:
        return nodes.setdefault(name, {"head_of_jobs": [], "roles": set(), "gpus": set()})

    for j in (j for j in jobs if j["head_node"]):
        node(j["head_node"])["head_of_jobs"].append(j["job_id"])
    for g in gpu["gpus"]:
        node(g["node"])["roles"].add(g["role"])
        node(g["node"])["gpus"].add(g["gpu"])
    for name, roles in gpu["no_gpu_roles"].items():
        node(name)["roles"].update(roles)
    checkpoints = [
        {
            "path": str(c.path.relative_to(run_dir)),
            "kind": c.kind,
            "step": c.step,
            "bytes": c.bytes,
            "complete": c.complete,
        }
        for c in find_checkpoints(run_dir)
    ]
    durations = [j["duration_s"] for j in jobs if j["duration_s"] is not None]
    ends = [t for j in jobs if (t := parse_time(j["ended"]))]
    return {
        "schema_version": SCHEMA_VERSION,
        "run_id": (run or {}).get("run_id"),
        "name": (run or {}).get("name") or run_dir.name,
        "cluster": (run or {}).get("cluster") or (plan.get("cluster") if isinstance(plan, dict) else None),
        "run_dir": str(run_dir),
        "state": state,
        "reason": reason,
        "breaker": breaker,
        "jobs": jobs,
        "other_jobs_in_run_dir": other,
        "run_time_s": sum(durations) if durations else None,
        "elapsed_s": _seconds(min(starts), max(ends)) if starts and ends else None,
        "nodes": [
            {
                "node": k,
                "head_of_jobs": v["head_of_jobs"],
                "roles": sorted(v["roles"]),
                "gpus": len(v["gpus"]),
                "no_gpu": k in gpu["no_gpu_nodes"],
            }
            for k, v in sorted(nodes.items())
        ],
        "checkpoints": checkpoints,
        "checkpoint_bytes": sum(c["bytes"] for c in checkpoints),
        "metrics": last_metrics(
            run_dir,
            [j["log"] for j in jobs if j["log"]],
            *((plan.get("reward_keys"), plan.get("zero_reward_steps")) if isinstance(plan, dict) else (None, None)),
            plan_format(plan if isinstance(plan, dict) else None),
        ),
        "plan": pred,
        "gpu": {
            "samples": gpu["samples"],
            "files": gpu["files"],
            "no_gpu_nodes": gpu["no_gpu_nodes"],
            "earlier_run_samples": gpu["earlier_run_samples"],
            "note": None if gpu["samples"] else gpu_note(gpu),
            "per_gpu": gpu["gpus"],
        },
        "memory": _memory_rows(gpu["gpus"], pred),
        "timing": timing(
            run_dir,
            plan if isinstance(plan, dict) else None,
            jobs,
            {j["job_id"]: t.timestamp() for j in jobs if (t := parse_time(j["ended"]))},
        ),
    }


def gpu_note(gpu: dict) -> str:
    """Why there is nothing to compare: no CSV, or only no-GPU markers."""
    if not gpu["files"]:
        return "no GPU samples (no hpcrl/gpu-*.csv in the run directory)"
    if gpu["no_gpu_nodes"]:
        return f"no GPU samples (the monitor found no NVIDIA GPU on {', '.join(gpu['no_gpu_nodes'])})"
    return "no GPU samples (the monitor's CSVs hold no readable rows)"


def headline(metrics: dict | None) -> list[tuple[str, str]]:
    """(key, value as printed) of the summary's metrics: the step's number, reward, loss and gradient norm
    (each framework's own key), then the others every backend's summary names (MetricFacts.summary)."""
    if not metrics:
        return []
    first = [*union_format().step_keys] + [metrics.get(k) for k in ("reward_key", "loss_key", "grad_norm_key")]
    keys = dict.fromkeys(
        [k for k in first if k is not None and k in metrics["text"]]
        + [k for k in summary_keys() if k in metrics["text"]]
    )
    return [(k, metrics["text"][k]) for k in keys]


def end_text(job: dict) -> str:
    if not job["end_reason"]:
        return "-"
    text = job["end_reason"] + ("" if job["exit_code"] is None else f":{job['exit_code']}")
    failure = job.get("failure")
    if failure and not job.get("next_job"):  # the failure was recorded, the continuation's sbatch then failed
        text += " (the continuation's sbatch failed: resubmit by hand)"
    elif failure:
        text += f" (continued without {', '.join(failure['excluded'])})" if failure["excluded"] else " (continued)"
    return text


def gib(v: float | None) -> str:
    return "-" if v is None else f"{v:,.2f}"


def pct(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio * 100:.1f}%"


def where_text(row: dict) -> str:
    if row["node"] is None:
        return "-"
    return f"{row['node']} GPU {row['gpu']} ({row['gpus']} GPUs, {row['samples']} samples)"
