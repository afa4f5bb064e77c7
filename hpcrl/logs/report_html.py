"""`hpcrl report RUN --html FILE`: the report as one self-contained HTML page with its plots inline (pure).

The page holds the plan against what happened (memory per GPU, step, generation and training times),
reward, loss and KL over steps, step times over steps, GPU memory over time per node, the jobs of the
chain with their end reasons, checkpoints and disk. Plots are SVG drawn by hpcrl.logs.svg; the page
has no script and fetches nothing, so it opens in a browser anywhere after `scp`.
"""

from __future__ import annotations

import json
import math
from datetime import datetime
from html import escape
from pathlib import Path

from hpcrl import contract as C
from hpcrl.logs import report as rp
from hpcrl.logs import report_timing as rt
from hpcrl.logs import svg
from hpcrl.logs.driver_log import StepParser
from hpcrl.logs.log_format import plan_format
from hpcrl.logs.metric_keys import ROLES, backend_name, metric_keys
from hpcrl.logs.step_times import read_records, step_seconds
from hpcrl.logs.watch_sources import dir_bytes

GAP_S = 300.0  # the GPU monitor writes every 5 s: a longer silence (between the jobs of a chain) breaks the line
_ROLE_NAMES = {"reward": "reward", "reward_std": "reward spread", "kl": "KL", "loss": "loss", "grad_norm": "grad norm"}

CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 24px auto; max-width: 980px;
       color: #222; line-height: 1.4; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 18px; margin-top: 28px; border-bottom: 1px solid #ddd; }
h3 { font-size: 15px; margin-top: 18px; }
table { border-collapse: collapse; margin: 8px 0; font-size: 13px; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; } th { background: #f4f4f4; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
.muted { color: #666; } .warn { color: #a15c00; } .bad { color: #b00020; } .ok { color: #1b7a1b; }
svg.chart { display: block; margin: 10px 0; }
"""


def _plan(run_dir: Path) -> dict | None:
    try:
        plan = json.loads((run_dir / C.META / C.PLAN).read_text())
    except (OSError, ValueError):
        return None
    return plan if isinstance(plan, dict) else None


def series(run_dir: Path, report: dict) -> dict:
    """What the page plots, read from the run directory: each metric over steps (the chain's job logs),
    step times over steps (step-times.jsonl), GPU memory over time per node (the monitor's CSVs)."""
    plan = _plan(run_dir)
    keys, fmt = metric_keys(plan), plan_format(plan)
    by_step: dict[int, dict[str, float]] = {}  # a step a continuation repeats keeps its later value
    logs = []
    for job in report["jobs"]:
        if not job["log"]:
            continue
        logs.append(job["log"])
        parser = StepParser(
            fmt, list((plan or {}).get("reward_keys") or ()), loss_keys=list((plan or {}).get("loss_keys") or ())
        )
        with open(run_dir / job["log"], errors="replace") as f:
            for line in f:
                if (step := parser.feed(line)) is not None:
                    by_step[step.number] = step.values
    metrics = {}
    for role in ROLES:
        key = next((k for k in keys[role] if any(k in v for v in by_step.values())), None)
        if key is not None:
            metrics[role] = {
                "key": key,
                "points": [
                    (float(n), v[key]) for n, v in sorted(by_step.items()) if key in v and math.isfinite(v[key])
                ],
            }
    ids = {j["job_id"] for j in report["jobs"]}
    recs = [
        r
        for r in read_records(run_dir / C.META / C.STEP_TIMES)
        if str(r.get("job")) in ids and r["kind"] == "step" and isinstance(r.get("step"), int)
    ]
    times: dict[str, list[tuple[float, float]]] = {"step": [], "generation": [], "training": []}
    for r in recs:
        s, _ = step_seconds(r)
        for name, v in (("step", s), ("generation", r.get("generation_s")), ("training", r.get("training_s"))):
            if v is not None:
                times[name].append((float(r["step"]), float(v)))
    starts = [t for j in report["jobs"] if (t := rp.parse_time(j["started"]))]
    gpu = rp.read_gpu_csvs(run_dir / C.META, min(starts) if starts else None, series=True)
    per_node: dict[str, dict[float, float]] = {}
    for (node, _gpu, _role), points in gpu["series"].items():
        mine = per_node.setdefault(node, {})
        for t, used in points:
            at = float(int(t.timestamp()))
            mine[at] = max(mine.get(at, 0.0), used / rp.MIB_PER_GIB)
    return {
        "metrics": metrics,
        "logs": logs,
        "times": {k: v for k, v in times.items() if v},
        "gpu": {node: sorted(p.items()) for node, p in sorted(per_node.items())},
        "backend": backend_name(plan),
        "disk_plan": (plan or {}).get("disk"),
        "run_dir_bytes": dir_bytes(run_dir),
    }


def _table(head: list[str], rows: list[list[str]], numeric: frozenset[int] | set[int] = frozenset()) -> str:
    th = "".join(f"<th>{escape(h)}</th>" for h in head)
    num = ' class="n"'
    body = "".join(
        "<tr>" + "".join(f"<td{num if i in numeric else ''}>{escape(c)}</td>" for i, c in enumerate(r)) + "</tr>"
        for r in rows
    )
    return f"<table><tr>{th}</tr>{body}</table>"


def _p(text: str, cls: str = "") -> str:
    attr = f' class="{cls}"' if cls else ""
    return f"<p{attr}>{escape(text)}</p>"


def _memory(report: dict, s: dict) -> str:
    out = ["<h3>Peak GPU memory per role, GiB</h3>"]
    if report["gpu"]["note"]:
        out.append(_p(report["gpu"]["note"], "muted"))
    if report["memory"]:
        out.append(
            _table(
                ["role", "measured peak", "where", "predicted", "prediction", "measured/predicted"],
                [
                    [
                        x["role"],
                        rp.gib(x["measured_peak_gib"]),
                        rp.where_text(x),
                        rp.gib(x["predicted_gib"]),
                        x["predicted_as"] or "-",
                        rp.pct(x["ratio"]),
                    ]
                    for x in report["memory"]
                ],
                {1, 3, 5},
            )
        )
    if report["plan"] is None:
        out.append(_p(rp.NO_PLAN, "muted"))
    chart = svg.Chart(
        "GPU memory over time, per node (its fullest GPU)",
        "time (UTC)",
        "GiB",
        [svg.Line(node, points) for node, points in s["gpu"].items()],
        _memory_levels(report["plan"]),
        time_axis=True,
        gap=GAP_S,
    )
    out.append(
        svg.render(chart)
        if s["gpu"]
        else _p("No GPU memory over time to plot: " + (report["gpu"]["note"] or "no samples"), "muted")
    )
    return "\n".join(out)


def _memory_levels(plan: dict | None) -> list[svg.Level]:
    levels = []
    if plan and plan.get("learner_peak_gib") is not None:
        levels.append(
            svg.Level(plan["learner_peak_gib"], f"predicted learner peak {plan['learner_peak_gib']:.1f}", "#1f77b4")
        )
    if plan and plan.get("engine_reserved_gib") is not None:
        levels.append(
            svg.Level(
                plan["engine_reserved_gib"], f"predicted vLLM reservation {plan['engine_reserved_gib']:.1f}", "#ff7f0e"
            )
        )
    return levels


def _timing(report: dict, s: dict) -> str:
    tm = report["timing"]
    out = ["<h3>Step, generation and training times, seconds</h3>"]
    if tm["note"]:
        return "\n".join(out + [_p(tm["note"], "muted")])
    out.append(
        _table(
            ["", "plan", "plan band", "real (median)", "real min-max", "n", "real/plan"],
            [
                [
                    x["what"],
                    rt.seconds(x["plan_s"]) + (" (derived)" if x.get("plan_basis") == "derived" else ""),
                    rt.band_text(x),
                    rt.seconds(x["real_s"]),
                    "-" if x["real_min_s"] is None else f"{x['real_min_s']:,.1f}-{x['real_max_s']:,.1f}",
                    str(x["n"]),
                    "-" if x["ratio"] is None else f"{x['ratio']:.2f}x",
                ]
                for x in tm["rows"]
            ],
            {1, 3, 5, 6},
        )
    )
    if tm["interval"]:
        out.append(_p(rt.interval_text(tm["interval"])))
    out.append(_p(rt.lost_text(tm["last_stop"])))
    out += [_p(f"warning: {w}", "warn") for w in tm["warnings"]]
    step = tm["rows"][0]
    levels = [svg.Level(step["plan_s"], f"plan {step['plan_s']:,.1f} s", "#d62728")] if step["plan_s"] else []
    if step.get("plan_low_s") is not None and step.get("plan_high_s") is not None:
        levels += [
            svg.Level(step["plan_low_s"], f"plan band low {step['plan_low_s']:,.1f}", "#999999"),
            svg.Level(step["plan_high_s"], f"plan band high {step['plan_high_s']:,.1f}", "#999999"),
        ]
    if s["times"]:
        out.append(
            svg.render(
                svg.Chart(
                    "Step times over steps",
                    "training step",
                    "seconds",
                    [svg.Line(k, v) for k, v in s["times"].items()],
                    levels,
                    x_integer=True,
                )
            )
        )
    return "\n".join(out)


def _metrics(report: dict, s: dict) -> str:
    out = ["<h2>Reward, loss and KL over steps</h2>"]
    m = s["metrics"]
    if not m:
        return "\n".join(
            out
            + [
                _p(
                    "No training step in the job logs"
                    + (f" ({', '.join(s['logs'])})" if s["logs"] else " (no job log)"),
                    "muted",
                )
            ]
        )
    for roles, title in ((("reward", "reward_std"), "Reward"), (("loss", "kl", "grad_norm"), "Loss, KL, grad norm")):
        lines = [svg.Line(f"{_ROLE_NAMES[r]} ({m[r]['key']})", m[r]["points"]) for r in roles if r in m]
        if lines:
            out.append(
                svg.render(
                    svg.Chart(f"{title} over steps ({s['backend']})", "training step", "value", lines, x_integer=True)
                )
            )
    last = report["metrics"]
    if last:
        out.append(f"<h3>Last metrics: step {last['step']} ({escape(last['log'])})</h3>")
        out.append(_table(["metric", "value"], [[k, v] for k, v in rp.headline(last)], {1}))
        if last.get("reward_note"):
            out.append(_p(f"warning: {last['reward_note']}", "warn"))
    return "\n".join(out)


def _jobs(report: dict) -> str:
    rows = [
        [
            str(j["seq"]),
            j["job_id"],
            j["head_node"] or "-",
            j["slurm_state"] or "-",
            j["started"] or "-",
            j["ended"] or "-",
            rp.fmt_duration(j["queued_s"]),
            rp.fmt_duration(j["duration_s"]),
            rp.end_text(j),
            j["next_job"] or "-",
        ]
        for j in report["jobs"]
    ]
    out = [
        "<h2>Jobs of the chain</h2>",
        _p(
            f"run time {rp.fmt_duration(report['run_time_s'])} in {len(report['jobs'])} job(s); first start to "
            f"last end {rp.fmt_duration(report['elapsed_s'])}"
        ),
    ]
    out.append(
        _table(["#", "job", "head node", "slurm", "started", "ended", "queued", "ran", "end", "next"], rows)
        if rows
        else _p("No job recorded in hpcrl/jobs.tsv: the run never started.", "muted")
    )
    if b := report["breaker"]:
        out.append(
            _p(f"circuit breaker: {b['reason']} (exit {b['exit_code']}, step {b['step']}): {b['message']}", "bad")
        )
    return "\n".join(out)


def _disk(report: dict, s: dict) -> str:
    out = ["<h2>Checkpoints and disk</h2>"]
    if report["checkpoints"]:
        out.append(
            _table(
                ["kind", "step", "size", "complete", "path"],
                [
                    [c["kind"], str(c["step"]), rp.fmt_bytes(c["bytes"]), "yes" if c["complete"] else "no", c["path"]]
                    for c in report["checkpoints"]
                ],
                {1, 2},
            )
        )
    else:
        out.append(_p("No checkpoint in the run directory.", "muted"))
    plan = s["disk_plan"] or {}
    text = (
        f"The run directory holds {rp.fmt_bytes(s['run_dir_bytes'])} on disk, checkpoints "
        f"{rp.fmt_bytes(report['checkpoint_bytes'])}"
    )
    if plan.get("run_dir_peak_gib") is not None:
        text += f"; the plan's peak in the run directory is {plan['run_dir_peak_gib']:,.1f} GiB"
    if plan.get("quota_gib") is not None:
        text += f" (all of the plan's peak {plan['peak_gib']:,.1f} GiB, the quota {plan['quota_gib']:,.0f} GiB)"
    out.append(_p(text + "." if plan else text + "; plan.json holds no disk plan."))
    return "\n".join(out)


def to_html(report: dict, s: dict, generated: datetime) -> str:
    """The page: one HTML document, styles and plots inline."""
    name = report["run_id"] or report["name"]
    state = report["state"] + (f" ({report['reason']})" if report["reason"] else "")
    cls = "ok" if report["reason"] == C.COMPLETED else "bad" if report["state"] == "ended" else ""
    model = (report["plan"] or {}).get("model")
    facts = [
        f"cluster {report['cluster']}" if report["cluster"] else "",
        f"backend {s['backend']}",
        f"model {model}" if model else "",
        f"run dir {report['run_dir']}",
    ]
    body = [
        f"<h1>hpcrl report: {escape(name)}</h1>",
        f'<p><span class="{cls}"><b>{escape(state)}</b></span> &middot; '
        + " &middot; ".join(escape(f) for f in facts if f)
        + "</p>",
        _p(f"generated {generated.isoformat(timespec='seconds')} by hpcrl report --html", "muted"),
        "<h2>The plan against what happened</h2>",
        _memory(report, s),
        _timing(report, s),
        _metrics(report, s),
        _jobs(report),
        _disk(report, s),
    ]
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>hpcrl report: {escape(name)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n"
        + "\n".join(body)
        + "\n</body>\n</html>\n"
    )


__all__ = ["series", "to_html"]
