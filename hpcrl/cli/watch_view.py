"""`hpcrl watch`'s frame: a snapshot (hpcrl/logs/watch_model.py) drawn as one screen of Rich text and a table."""

from __future__ import annotations

from typing import Any

from hpcrl.logs.report import fmt_bytes, fmt_duration
from hpcrl.logs.watch_model import Snapshot

SPARKS = "▁▂▃▄▅▆▇█"
_STATE_STYLE = {"running": "green", "pending": "yellow", "ended": "bold", "not-started": "red", "unknown": "red"}
_END_STYLE = {"completed": "green", "timeout": "yellow", "preempted": "yellow"}


def sparkline(values: list[float]) -> str:
    """One character per value, from the lowest (▁) to the highest (█) of them."""
    if not values:
        return ""
    lo, hi = min(values), max(values)
    if hi == lo:
        return SPARKS[3] * len(values)
    return "".join(SPARKS[min(int((v - lo) / (hi - lo) * len(SPARKS)), len(SPARKS) - 1)] for v in values)


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:,.1f} s"


def _gib(v: float | None) -> str:
    return "-" if v is None else f"{v:,.1f}"


def end_line(s: Snapshot) -> str:
    """The one line `watch` ends with: how the run ended."""
    last = s.jobs[-1] if s.jobs else None
    code = f", exit code {last.exit_code}" if last and last.exit_code is not None else ""
    job = f" (job {last.job_id}, {len(s.jobs)} job{'s' if len(s.jobs) != 1 else ''} in the chain{code})" if last else ""
    return f"run {s.run_id or s.name} ended: {s.reason or 'unknown'}{job}"


def _header(s: Snapshot) -> str:
    style = _END_STYLE.get(s.reason or "", "red") if s.ended else _STATE_STYLE.get(s.state, "")
    reason = f" ({s.reason})" if s.reason else ""
    where = f"{s.backend}" + (f" on {s.cluster}" if s.cluster else "")
    from rich.markup import escape

    return (
        f"[bold]{escape(s.run_id or s.name)}[/]  [{style}]{escape(s.state + reason)}[/]  {escape(where)}  "
        f"[dim]{s.time[11:19]} UTC[/]"
    )


def _job(s: Snapshot) -> str:
    j = s.job
    if j is None:
        return "job: none recorded in hpcrl/jobs.tsv"
    last = s.jobs[-1]
    if s.ended or last.end_reason:
        what = f"ended {last.end_reason}" if last.end_reason else f"ended ({j.state or 'state unknown'})"
        if not s.ended:
            what += f", {j.state or 'state unknown'} in Slurm"
    else:
        what = j.state or "state unknown (Slurm did not answer)"
    text = f"job {j.job_id} ({j.seq + 1} of the chain) {what}"
    if j.nodes:
        text += f" on {j.nodes}" + (f" ({j.node_count} node{'s' if j.node_count != 1 else ''})" if j.node_count else "")
    if j.time_left_s is not None:
        limit = f" of {fmt_duration(j.time_limit_s)}" if j.time_limit_s is not None else ""
        text += f", {fmt_duration(j.time_left_s)} left{limit}"
    elif j.reason and s.state == "pending":
        text += f" ({j.reason})"
    return text


def _progress(s: Snapshot) -> str:
    p = s.progress
    if p.step is None:
        return "step: none yet" + (" (the job has not started)" if s.state == "pending" else "")
    text = f"step {p.step}" + (f" of {p.total_steps}" if p.total_steps else "")
    if p.steps_per_hour is not None:
        text += f", {p.steps_per_hour:g} steps/h"
    if p.to_go_s is not None and not s.ended:
        text += f", ~{fmt_duration(p.to_go_s)} to go"
    return text


def _step_time(s: Snapshot) -> str:
    t = s.step_time
    if t.n == 0:
        plan = f"; plan {_s(t.plan_s)}" if t.plan_s is not None else ""
        return f"step time: none recorded yet{plan}"
    src = "framework timer" if t.source == "framework" else "watchdog clock"
    text = f"step time: last {_s(t.last_s)}, median {_s(t.median_s)} ({src}, {t.n} steps)"
    if t.plan_s is not None:
        band = f" (band {t.plan_low_s:,.1f}-{t.plan_high_s:,.1f})" if t.plan_low_s is not None else ""
        ratio = f": {t.ratio:.2f}x" if t.ratio is not None else ""
        inside = "" if t.in_band is None else " [green]inside the band[/]" if t.in_band else " [red]outside the band[/]"
        text += f"; plan {_s(t.plan_s)}{band}{ratio}{inside}"
    return text


def _metrics(s: Snapshot) -> list[str]:
    m = s.metrics
    if m.step is None:
        return ["metrics: no training step in the job logs yet"]
    lines = []
    for role, name in (("reward", "reward"), ("loss", "loss")):
        v = m.values.get(role)
        if v is None:
            lines.append(f"{name}: not logged")
            continue
        text = f"{name} ({v.key}) {v.text}"
        if role == "reward" and (std := m.values.get("reward_std")) is not None:
            text += f" ± {std.text} ({std.key})"
        spark = [x[1] for x in m.recent.get(role, [])]
        if len(spark) > 1:  # in log order: a continuation's steps after the ones it repeats
            text += f"  {sparkline(spark)}  (the last {len(spark)} steps logged)"
        lines.append(text)
    extra = [
        f"{role.replace('_', ' ')} ({v.key}) {v.text}"
        for role in ("kl", "grad_norm")
        if (v := m.values.get(role)) is not None
    ]
    if extra:
        lines.append("; ".join(extra))
    return lines


def _gpu(s: Snapshot, table: Any) -> Any:
    if not s.gpu.nodes:
        return f"GPU memory: {s.gpu.note}"
    t = table("GPU memory per node, GiB (the node's fullest GPU)")
    for col in ("node", "roles", "GPUs", "now", "peak", "plan/GPU", "of", "util", "sampled"):
        t.add_column(col, justify="left" if col in ("node", "roles") else "right")
    for n in s.gpu.nodes:
        over = n.plan_gib is not None and n.peak_gib is not None and n.peak_gib > n.plan_gib
        peak = f"[red]{_gib(n.peak_gib)}[/]" if over else _gib(n.peak_gib)
        t.add_row(
            n.node,
            ",".join(n.roles),
            str(n.gpus),
            _gib(n.now_gib),
            peak,
            _gib(n.plan_gib),
            _gib(n.total_gib),
            "-" if n.util_pct is None else f"{n.util_pct:.0f}%",
            (n.sampled or "-") if s.ended or n.age_s is None else f"{fmt_duration(n.age_s)} ago",
        )
    return t


def _disk(s: Snapshot) -> str:
    d = s.disk
    used = "-" if d.used_bytes is None else fmt_bytes(d.used_bytes)
    text = f"disk: {used} in the run directory"
    if d.run_dir_peak_gib is not None:
        share = (
            f", {d.used_bytes / 2**30 / d.run_dir_peak_gib:.0%} of" if d.used_bytes and d.run_dir_peak_gib else " of"
        )
        text += f"{share} the plan's {d.run_dir_peak_gib:,.1f} GiB at peak"
    if d.quota_gib is not None:
        text += f"; quota {d.quota_gib:,.0f} GiB"
    if d.fs_free_bytes is not None:
        text += f"; {fmt_bytes(d.fs_free_bytes)} free on its file system"
    return text


def _checkpoint(s: Snapshot) -> str:
    c = s.checkpoint
    if c.every_steps is None:
        return "checkpoint: no interval known (plan.json has no cadence)"
    text = f"checkpoint: every {c.every_steps} steps ({c.key or 'interval'}, from {c.every_from})"
    text += f"; last written after step {c.last_step}" if c.last_step is not None else "; none written yet"
    if c.verdict:
        text += f"; next: {c.verdict}"
    elif c.next_step is not None and not s.ended:
        text += f"; next at step {c.next_step}"
    return text


def _breaker(s: Snapshot) -> list[str]:
    from rich.markup import escape

    b = s.breaker
    lines = [
        f"[red]breaker: tripped ({b.reason}, exit {b.exit_code}, step {b.step}):[/] {escape(b.message or '')}"
        if b.tripped
        else "breaker: not tripped"
    ]
    lines += [f"[yellow]{escape(w)}[/]" for w in s.watchdog[-2:] if not (b.tripped and "tripped" in w)]
    return lines


def frame(s: Snapshot, table: Any) -> Any:
    """The whole screen: header, job, progress, times, metrics, GPU table, disk, checkpoint, breaker, notes."""
    from rich.console import Group
    from rich.text import Text

    def line(markup: str) -> Any:
        return Text.from_markup(markup, overflow="fold")

    parts: list[Any] = [line(_header(s)), Text(_job(s)), Text(_progress(s)), line(_step_time(s))]
    parts += [Text(m) for m in _metrics(s)]
    gpu = _gpu(s, table)
    parts.append(Text(gpu) if isinstance(gpu, str) else gpu)
    parts += [Text(_disk(s)), Text(_checkpoint(s))] + [line(b) for b in _breaker(s)]
    parts += [Text(f"missing: {m}", style="dim") for m in s.missing]
    if s.ended:
        parts.append(Text(end_line(s), style="bold"))
    return Group(*parts)


__all__ = ["end_line", "frame", "sparkline"]
