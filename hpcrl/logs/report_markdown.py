"""`hpcrl report RUN --markdown FILE`: the report (hpcrl/logs/report.py) as a Markdown document. Pure."""

from __future__ import annotations

from typing import Any

from hpcrl.logs.report import NO_PLAN, end_text, fmt_bytes, fmt_duration, gib, pct, where_text
from hpcrl.logs.report_timing import band_text, interval_text, lost_text, seconds


def _md_row(cells: list[Any]) -> str:
    return "| " + " | ".join(str(c if c is not None else "-").replace("|", "\\|") for c in cells) + " |"


def _md_table(head: list[str], rows: list[list[Any]]) -> list[str]:
    return [_md_row(head), "|" + "|".join(" --- " for _ in head) + "|", *(_md_row(r) for r in rows), ""]


def to_markdown(r: dict) -> str:
    """The report as a Markdown document."""
    out = [f"# Run {r['run_id'] or r['name']}", "", f"- run directory: `{r['run_dir']}`"]
    if r["cluster"]:
        out.append(f"- cluster: {r['cluster']}")
    out.append(f"- state: **{r['state']}**" + (f", reason **{r['reason']}**" if r["reason"] else ""))
    if b := r["breaker"]:
        out.append(f"- circuit breaker: {b['reason']} (exit {b['exit_code']}, step {b['step']}): {b['message']}")
    out.append(
        f"- run time: {fmt_duration(r['run_time_s'])} in {len(r['jobs'])} job(s); "
        f"first start to last end {fmt_duration(r['elapsed_s'])}"
    )
    if r["other_jobs_in_run_dir"]:
        out.append(f"- jobs.tsv also holds earlier runs' jobs: {', '.join(r['other_jobs_in_run_dir'])}")
    out += ["", "## Jobs", ""]
    out += _md_table(
        ["#", "job", "head node", "submitted", "started", "ended", "queued", "ran", "end", "next"],
        [
            [
                j["seq"],
                j["job_id"],
                j["head_node"],
                j["submitted"],
                j["started"],
                j["ended"],
                fmt_duration(j["queued_s"]),
                fmt_duration(j["duration_s"]),
                end_text(j),
                j["next_job"],
            ]
            for j in r["jobs"]
        ],
    )
    out += [f"- job {j['job_id']}: stack check: {j['stack_check']}" for j in r["jobs"] if j.get("stack_check")]
    if any(j.get("stack_check") for j in r["jobs"]):
        out.append("")
    out += ["## Nodes", ""]
    out += _md_table(
        ["node", "head of jobs", "roles", "GPUs"],
        [
            [
                n["node"],
                ", ".join(n["head_of_jobs"]),
                ", ".join(n["roles"]) or "-",
                "none found" if n["no_gpu"] else n["gpus"],
            ]
            for n in r["nodes"]
        ],
    )
    out += ["## Checkpoints", ""]
    if r["checkpoints"]:
        out += _md_table(
            ["kind", "step", "size", "complete", "path"],
            [
                [c["kind"], c["step"], fmt_bytes(c["bytes"]), "yes" if c["complete"] else "no", f"`{c['path']}`"]
                for c in r["checkpoints"]
            ],
        )
        out += [f"Total: {fmt_bytes(r['checkpoint_bytes'])}", ""]
    else:
        out += ["No checkpoints.", ""]
    out += ["## Last metrics", ""]
    m = r["metrics"]
    if m:
        out += [f"Step {m['step']} from `{m['log']}` ({m['steps_in_log']} steps in that log).", ""]
        out += [f"Warning: {m['reward_note']}.", ""] if m.get("reward_note") else []
        out += _md_table(["metric", "value"], [[k, m["text"][k]] for k in sorted(m["text"])])
    else:
        out += ["No training step in the job logs.", ""]
    out += ["## Peak GPU memory per role", ""]
    if r["gpu"]["note"]:
        out += [r["gpu"]["note"] + ".", ""]
    if r["memory"]:
        out += _md_table(
            ["role", "measured peak (GiB)", "where", "predicted (GiB)", "prediction", "measured/pred."],
            [
                [
                    m["role"],
                    gib(m["measured_peak_gib"]),
                    where_text(m),
                    gib(m["predicted_gib"]),
                    m["predicted_as"] or "-",
                    pct(m["ratio"]),
                ]
                for m in r["memory"]
            ],
        )
    if r["plan"] is None:
        out += [NO_PLAN, ""]
    out += _timing_md(r["timing"])
    return "\n".join(out)


def _timing_md(tm: dict) -> list[str]:
    out = ["## Plan vs real times", ""]
    if tm["note"]:
        return out + [tm["note"] + ".", ""]
    out += _md_table(
        ["", "plan (s)", "plan band (s)", "real median (s)", "real min-max (s)", "n", "real/plan"],
        [
            [
                x["what"],
                seconds(x["plan_s"]) + (" (derived)" if x.get("plan_basis") == "derived" else ""),
                band_text(x),
                seconds(x["real_s"]),
                "-" if x["real_min_s"] is None else f"{x['real_min_s']:,.1f}-{x['real_max_s']:,.1f}",
                x["n"],
                "-" if x["ratio"] is None else f"{x['ratio']:.2f}x",
            ]
            for x in tm["rows"]
        ],
    )
    out += [f"- {interval_text(tm['interval'])}"] if tm["interval"] else []
    out += [f"- {lost_text(tm['last_stop'])}"] + [f"- **warning:** {w}" for w in tm["warnings"]]
    return out + [""]
