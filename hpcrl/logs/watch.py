"""`hpcrl watch`: a run directory read into one Snapshot per refresh, each file from where the last read stopped (pure).

The chain comes from `hpcrl/jobs.tsv` (the registry's jobs, then their continuations), each job's state from
the one Slurm query of the refresh (SlurmView, asked by hpcrl/jobs/watch.py), the steps and metrics from the
chain's job logs through the watchdog's own step parser, step and checkpoint times from `hpcrl/step-times.jsonl`,
GPU memory from the monitor's CSVs, the plan from `hpcrl/plan.json`. Nothing is written.
"""

from __future__ import annotations

import json
from collections import deque
from datetime import datetime, timezone
from pathlib import Path

from hpcrl import contract as C
from hpcrl.errors import RunDirUnreadable
from hpcrl.logs.driver_log import ANSI, Step, StepFormat, StepParser
from hpcrl.logs.log_format import plan_format
from hpcrl.logs.metric_keys import ROLES, backend_name, metric_keys, pick
from hpcrl.logs.report import Event, chain_ids, fmt_duration, parse_time, predictions, read_breaker, read_events
from hpcrl.logs.report_timing import step_band
from hpcrl.logs.step_times import step_seconds, summarize
from hpcrl.logs.tail import Tail
from hpcrl.logs.watch_model import (
    SCHEMA_VERSION,
    Allocation,
    Breaker,
    CheckpointTime,
    Disk,
    Gpu,
    JobRow,
    Metric,
    Metrics,
    Progress,
    SlurmView,
    Snapshot,
    StepTime,
)
from hpcrl.logs.watch_sources import GpuTails, dir_bytes, fs_space

LOG_START_BYTES = 8 << 20  # a log first seen larger is read from its last 8 MiB
RECENT_STEPS = 60  # the reward and loss history the live view's sparklines draw
WATCHDOG_LINES = 4
DISK_EVERY_S = 60.0  # the run directory's walk is repeated at most this often
RATE_WINDOW_S = 3600.0  # steps per hour over the newest job's last hour
WATCHDOG_MARK = "hpcrl-watchdog:"


def iso(t: float | None) -> str | None:
    return None if t is None else datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="seconds")


class _Log:
    def __init__(self, path: Path, fmt: StepFormat, reward_keys: list[str], loss_keys: list[str]) -> None:
        self.tail = Tail(path, LOG_START_BYTES)
        self.parser = StepParser(fmt, reward_keys, loss_keys=loss_keys)


class RunReader:
    """One run directory, read a little at every `snapshot`; `run` is its registry row (Run.to_dict()) when known."""

    def __init__(self, run_dir: Path, run: dict | None = None) -> None:
        self.run_dir, self.run = run_dir, run
        self.hp = run_dir / C.META
        self.plan = self._read_plan()
        self.keys = metric_keys(self.plan)
        self.fmt = plan_format(self.plan)  # the format its logs are read in
        self._logs: dict[Path, _Log] = {}
        self._times = Tail(self.hp / C.STEP_TIMES)
        self.records: list[dict] = []
        self.gpu = GpuTails(self.hp)
        self._disk_at: tuple[float, int] | None = None  # (when, bytes) of the last walk
        self.watchdog: deque[str] = deque(maxlen=WATCHDOG_LINES)
        self.last: tuple[Step, str] | None = None  # the newest step read, and its log
        self.recent: dict[str, deque[list[float]]] = {r: deque(maxlen=RECENT_STEPS) for r in ("reward", "loss")}
        self.events: list[Event] = []

    def _read_plan(self) -> dict | None:
        try:
            plan = json.loads((self.hp / C.PLAN).read_text())
        except (FileNotFoundError, ValueError):
            return None
        return plan if isinstance(plan, dict) else None

    def chain(self) -> tuple[list[str], set[str]]:
        """The chain's job ids in order (the registry's, then the continuations jobs.tsv names), and those that wrote
        an end line."""
        try:
            self.events = read_events(self.hp / C.JOBS_TSV)
        except OSError as exc:
            raise RunDirUnreadable(self.hp / C.JOBS_TSV, exc) from None
        known = [str(j["job_id"]) for j in (self.run or {}).get("jobs", [])]
        return chain_ids(self.events, known), {e.job for e in self.events if e.event == "end"}

    def snapshot(self, views: dict[str, SlurmView], now: float, slurm_note: str | None = None) -> Snapshot:
        """What the run is doing now; `views` holds Slurm's answer for the jobs it was asked about."""
        try:
            return self._snapshot(views, now, slurm_note)
        except OSError as exc:  # EIO under a file of the run: one line, not a traceback
            raise RunDirUnreadable(exc.filename or self.run_dir, exc) from None

    # ------------------------------------------------------------------ the parts

    def _rows(self, ids: list[str], views: dict[str, SlurmView]) -> list[JobRow]:
        first: dict[tuple[str, str], Event] = {}
        for e in self.events:
            first.setdefault((e.job, e.event), e)
        rows = []
        for seq, jid in enumerate(ids):
            start, end, nxt = (first.get((jid, k)) for k in ("start", "end", "continue"))
            view = views.get(jid)
            reason, _, code = end.detail.partition(":") if end else ("", "", "")
            if not end and view is not None and view.phase == "ended":  # killed before it wrote its end
                reason, _, code = (
                    view.comment_end or C.SLURM_STATE_REASONS.get(view.state, view.state.lower())
                ).partition(":")
            rows.append(
                JobRow(
                    seq=seq,
                    job_id=jid,
                    slurm_state=view.state if view else None,
                    head_node=start.detail if start else None,
                    started=start.stamp if start else None,
                    ended=end.stamp if end else None,
                    end_reason=reason or None,
                    exit_code=int(code) if code.lstrip("-").isdigit() else None,
                    next_job=nxt.detail if nxt and nxt.detail.isdigit() else None,
                )
            )
        return rows

    def _state(self, rows: list[JobRow], view: SlurmView | None) -> tuple[str, str | None, bool]:
        """(state, reason, ended): Slurm's word on the newest job where it answered, else what jobs.tsv says."""
        if not rows:
            state = (self.run or {}).get("state")
            if state in ("pending", "submitting", "running"):
                return "pending", "no job recorded in hpcrl/jobs.tsv yet", False
            return "not-started", (self.run or {}).get("reason") or "no job recorded in hpcrl/jobs.tsv", True
        last = rows[-1]
        done_by_slurm = view is not None and view.phase in ("completing", "ended")
        if last.end_reason and not last.next_job and (done_by_slurm or view is None):
            reason = last.end_reason
        elif view is not None and view.phase == "ended":
            reason = last.end_reason or "unknown"
        elif view is not None and view.phase == "pending":
            return "pending", view.reason or None, False
        elif view is not None:
            # The end line comes before the script's last steps (a failure continuation is submitted after it).
            return "running", f"ending: {last.end_reason}" if last.end_reason else None, False
        else:  # Slurm did not answer: what the files say
            return ("running" if last.started else "pending"), None, False
        if (self.hp / C.CANCEL).exists() and reason != C.COMPLETED:
            reason = "cancelled"
        return "ended", reason, True

    def _read_logs(self, ids: list[str]) -> list[str]:
        missing = []
        for jid in ids:
            logs = self.run_dir / C.LOGS
            path = next(
                (p for p in (logs / C.JOB_LOG.format(job=jid), logs / C.SLURM_LOG.format(job=jid)) if p.exists()), None
            )
            if path is None:
                missing.append(jid)
                continue
            log = self._logs.get(path)
            if log is None:
                log = self._logs[path] = _Log(
                    path,
                    self.fmt,
                    list((self.plan or {}).get("reward_keys") or ()),
                    list((self.plan or {}).get("loss_keys") or ()),
                )
            rel = str(path.relative_to(self.run_dir))
            for line in log.tail.lines():
                if WATCHDOG_MARK in line:
                    self.watchdog.append(ANSI.sub("", line[line.index(WATCHDOG_MARK) :]).strip())
                step = log.parser.feed(line)
                if step is None:
                    continue
                self.last = (step, rel)
                for role, series in self.recent.items():
                    if (key := pick(step, self.keys[role])) is not None:
                        series.append([step.number, step.values[key]])
        return missing

    def _read_times(self) -> None:
        for line in self._times.lines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and rec.get("kind") in ("step", "checkpoint", "interval"):
                self.records.append(rec)

    def _progress(self, steps: list[dict], median: float | None) -> Progress:
        number = steps[-1].get("step") if steps else None
        if self.last is not None and (not isinstance(number, int) or self.last[0].number > number):
            number = self.last[0].number
        rate, basis = None, None
        if steps:
            job = steps[-1].get("job")
            mine = [s for s in steps if s.get("job") == job]
            window = [s for s in mine if s["time"] >= mine[-1]["time"] - RATE_WINDOW_S] or mine
            window = window if len(window) >= 2 else mine[-2:]
            span = window[-1]["time"] - window[0]["time"] if len(window) >= 2 else 0.0
            if span > 0:
                rate = round((len(window) - 1) / span * 3600, 1)
                basis = f"{len(window) - 1} steps in the last {fmt_duration(span)} of job {job}"
        if rate is None and median:
            rate, basis = round(3600 / median, 1), "3600 s / the median step"
        total = ((self.plan or {}).get("disk") or {}).get("total_steps")
        to_go = (
            (total - number) / rate * 3600
            if isinstance(total, int) and isinstance(number, int) and rate and total >= number
            else None
        )
        return Progress(
            step=number,
            total_steps=total,
            steps_per_hour=rate,
            rate_basis=basis,
            to_go_s=round(to_go) if to_go is not None else None,
            last_step_at=iso(steps[-1]["time"]) if steps else None,
            steps_recorded=len(steps),
        )

    def _step_time(self, recs: list[dict]) -> StepTime:
        s = summarize(recs)
        spread, source = s["step_s"], s["step_source"]
        steps = [r for r in recs if r["kind"] == "step"]
        timed = [v for v, src in map(step_seconds, steps) if v is not None and src == source]
        layout = (self.plan or {}).get("layout") or {}
        plan_s = layout.get("step_time_s")
        low, high, _ = step_band(layout)
        median = spread["median"] if spread else None
        return StepTime(
            last_s=timed[-1] if timed else None,
            median_s=median,
            n=spread["n"] if spread else 0,
            source=source,
            plan_s=plan_s,
            plan_low_s=low,
            plan_high_s=high,
            ratio=round(median / plan_s, 3) if median is not None and plan_s else None,
            in_band=None if median is None or low is None or high is None else low <= median <= high,
        )

    def _metrics(self) -> Metrics:
        step, log = self.last if self.last else (None, None)
        values: dict[str, Metric | None] = {}
        for role in ROLES:
            key = pick(step, self.keys[role]) if step is not None else None
            values[role] = Metric(key, step.values[key], step.text[key]) if step is not None and key else None
        return Metrics(
            step=step.number if step else None,
            log=log,
            values=values,
            recent={role: list(s) for role, s in self.recent.items()},
        )

    def _disk(self, now: float) -> Disk:
        if self._disk_at is None or now - self._disk_at[0] >= DISK_EVERY_S:
            self._disk_at = (now, dir_bytes(self.run_dir))
        plan = (self.plan or {}).get("disk") or {}
        free, total = fs_space(self.run_dir)
        return Disk(
            used_bytes=self._disk_at[1],
            measured=iso(self._disk_at[0]),
            run_dir_peak_gib=plan.get("run_dir_peak_gib"),
            peak_gib=plan.get("peak_gib"),
            quota_gib=plan.get("quota_gib"),
            fs_free_bytes=free,
            fs_total_bytes=total,
        )

    def _checkpoint(
        self, recs: list[dict], job: Allocation | None, step: int | None, median: float | None, running: bool
    ) -> CheckpointTime:
        cad = (self.plan or {}).get("cadence") or {}
        every, every_from = None, None
        mine = [r for r in recs if r["kind"] == "interval" and job and str(r.get("job")) == job.job_id]
        if mine and job is not None and mine[-1].get("every_steps"):
            every, every_from = int(mine[-1]["every_steps"]), f"job {job.job_id}"
        elif cad.get("every_steps"):
            every, every_from = int(cad["every_steps"]), "plan"
        writes = [r for r in recs if r["kind"] == "checkpoint"]
        nxt = (step // every + 1) * every if every and every > 0 and isinstance(step, int) else None
        eta = (nxt - step) * median if nxt is not None and isinstance(step, int) and median else None
        lead = cad.get("lead_s")
        left = job.time_left_s if job and running else None
        warning_in = left - lead if left is not None and lead is not None else None
        verdict = None
        if running and eta is not None and left is not None:
            at = f"step {nxt} in ~{fmt_duration(eta)}"
            if warning_in is not None and eta <= warning_in:
                verdict = f"{at}, before the time-limit warning (in {fmt_duration(warning_in)})"
            elif eta <= left:
                verdict = (
                    f"{at}, after the time-limit warning (in {fmt_duration(max(warning_in or 0, 0))}): "
                    "the job waits for it, then stops"
                )
            else:
                since = f"step {writes[-1]['step']}" if writes else "this job's start"
                verdict = (
                    f"{at}: not before the time limit ({fmt_duration(left)} left); the training since "
                    f"{since} is redone by the continuation"
                )
        return CheckpointTime(
            key=cad.get("key"),
            every_steps=every,
            every_from=every_from,
            last_step=writes[-1].get("step") if writes else None,
            last_at=iso(writes[-1]["time"]) if writes else None,
            next_step=nxt,
            eta_s=round(eta, 1) if eta is not None else None,
            warning_in_s=warning_in,
            lead_s=lead,
            verdict=verdict,
        )

    # ------------------------------------------------------------------ the whole

    def _snapshot(self, views: dict[str, SlurmView], now: float, slurm_note: str | None) -> Snapshot:
        ids, _ = self.chain()
        self.plan = self._read_plan() or self.plan
        rows = self._rows(ids, views)
        last = rows[-1] if rows else None
        view = views.get(last.job_id) if last else None
        state, reason, ended = self._state(rows, view)
        missing = [] if slurm_note is None else [f"Slurm: {slurm_note} (states from hpcrl/jobs.tsv alone)"]
        if not (self.hp / C.JOBS_TSV).exists():
            missing.append(f"{C.META}/{C.JOBS_TSV}: no job recorded yet")
        if self.plan is None:
            missing.append(f"{C.META}/{C.PLAN}: missing or unreadable, so nothing to compare with the plan")
        no_log = self._read_logs(ids)
        if last and last.job_id in no_log and state != "pending":
            missing.append(
                f"{C.LOGS}/{C.JOB_LOG.format(job=last.job_id)}: not written"
                + (" yet" if not ended else " (the job failed before its log began)")
            )
        self._read_times()
        if not (self.hp / C.STEP_TIMES).exists() and state != "pending":
            missing.append(f"{C.META}/{C.STEP_TIMES}: no step recorded yet (the watchdog writes it at each step)")
        chain = set(ids)
        recs = [r for r in self.records if str(r.get("job")) in chain]
        steps = [r for r in recs if r["kind"] == "step" and isinstance(r.get("time"), (int, float))]
        step_time = self._step_time(recs)
        starts = [t for r in rows if (t := parse_time(r.started))]
        since = min(starts) if starts else parse_time((self.run or {}).get("created"))
        self.gpu.read(since)
        job = None
        if last is not None:
            running = view is not None and view.phase == "running"
            job = Allocation(
                job_id=last.job_id,
                seq=last.seq,
                state=view.state if view else None,
                reason=(view.reason or None) if view else None,
                nodes=(view.nodes if view and view.nodes else last.head_node),
                node_count=view.node_count if view else None,
                time_left_s=view.time_left_s if running and view else None,
                time_limit_s=view.time_limit_s if view else None,
                started=last.started or (view.started if view else None),
            )
        progress = self._progress(steps, step_time.median_s)
        breaker = read_breaker(self.hp, since)
        return Snapshot(
            schema_version=SCHEMA_VERSION,
            time=iso(now) or "",
            run_id=(self.run or {}).get("run_id"),
            name=(self.run or {}).get("name") or self.run_dir.name,
            run_dir=str(self.run_dir),
            cluster=(self.run or {}).get("cluster") or (self.plan or {}).get("cluster"),
            backend=backend_name(self.plan),
            state=state,
            reason=reason,
            ended=ended,
            job=job,
            jobs=rows,
            progress=progress,
            step_time=step_time,
            metrics=self._metrics(),
            gpu=Gpu(
                nodes=self.gpu.nodes(predictions(self.plan), now),
                note=self.gpu.note(),
                since=since.isoformat(timespec="seconds") if since else None,
            ),
            disk=self._disk(now),
            checkpoint=self._checkpoint(
                recs, job, progress.step, step_time.median_s, running=view is not None and view.phase == "running"
            ),
            breaker=Breaker(tripped=True, **{k: breaker.get(k) for k in ("reason", "exit_code", "step", "message")})
            if breaker
            else Breaker(tripped=False, reason=None, exit_code=None, step=None, message=None),
            watchdog=list(self.watchdog),
            missing=missing,
        )


__all__ = ["RunReader", "iso"]
