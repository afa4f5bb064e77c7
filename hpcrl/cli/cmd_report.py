"""`hpcrl report RUN`: a run's jobs, nodes, end, checkpoints, metrics and GPU memory against the plan."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Optional

import typer

from hpcrl.cli.app import app
from hpcrl.cli.outfile import output_target, write_output
from hpcrl.cli.output import console, err_console, print_json, table

_STATE_STYLE = {"completed": "green", "timeout": "yellow", "preempted": "yellow"}


def _resolve(run: str, registry: Optional[Path]) -> tuple[Path, dict | None]:
    from hpcrl.jobs.run_lookup import find_run_dir

    path, row = find_run_dir(run, registry)
    return path, row.to_dict() if row else None


@app.command("report")
def report_cmd(
    run: str = typer.Argument(..., help="Run id (or a unique prefix, or one of its job ids), or a run directory"),
    markdown: Optional[Path] = typer.Option(None, "--markdown", help="Also write the report as Markdown to this file"),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Write GPU memory over time to this PNG (matplotlib)"),
    html: Optional[Path] = typer.Option(
        None,
        "--html",
        help="Also write the report as one self-contained HTML page with its plots inline (SVG) to this file",
    ),
    registry: Optional[Path] = typer.Option(None, "--registry", help="Registry file (default $HPCRL_REGISTRY)"),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON (stable schema)"),
) -> None:
    """What a run did: jobs and durations, nodes, final state and reason, checkpoints, last metrics, peak GPU memory."""
    from hpcrl.logs import report as rp

    for flag, target in (("--markdown", markdown), ("--plot", plot), ("--html", html)):
        if target is not None:
            output_target(target, flag, stdout_ok=False)  # refused before the run is read
    run_dir, row = _resolve(run, registry)
    r = rp.build_report(run_dir, row)
    if html is not None:
        from datetime import datetime, timezone

        from hpcrl.logs import report_html

        write_output(
            html,
            report_html.to_html(r, report_html.series(run_dir, r), datetime.now(timezone.utc)),
            "--html",
            stdout_ok=False,
        )
    if plot is not None:
        from hpcrl.logs.report_plot import plot_gpu_memory

        png = io.BytesIO()
        plot_gpu_memory(r, png)
        write_output(plot, png.getvalue(), "--plot", stdout_ok=False)
    if markdown is not None:
        from hpcrl.logs.report_markdown import to_markdown

        write_output(markdown, to_markdown(r) + "\n", "--markdown", stdout_ok=False)
    if as_json:
        print_json(r)
    else:
        _print(r, rp)
    out = err_console if as_json else console
    for what, target in (("markdown", markdown), ("plot", plot), ("html", html)):
        if target is not None:
            out.print(f"{what}: {target}", soft_wrap=True, highlight=False)


def _print(r: dict, rp) -> None:
    style = _STATE_STYLE.get(r["reason"] or "", "red" if r["state"] == "ended" else "cyan")
    head = f"[bold]{r['run_id'] or r['name']}[/] {r['state']}"
    head += f" ([{style}]{r['reason']}[/])" if r["reason"] else ""
    console.print(head + (f"  cluster {r['cluster']}" if r["cluster"] else ""), soft_wrap=True)
    console.print(f"run dir: {r['run_dir']}", soft_wrap=True, highlight=False)
    if b := r["breaker"]:
        console.print(
            f"[red]circuit breaker:[/] {b['reason']} (exit {b['exit_code']}, step {b['step']}): {b['message']}",
            soft_wrap=True,
        )
    console.print(
        f"run time {rp.fmt_duration(r['run_time_s'])} in {len(r['jobs'])} job(s); first start to last "
        f"end {rp.fmt_duration(r['elapsed_s'])}",
        highlight=False,
    )
    t = table("Jobs")
    for col in ("#", "job", "head node", "slurm", "started", "ended", "queued", "ran", "end", "next"):
        t.add_column(col, overflow="fold")
    for j in r["jobs"]:
        t.add_row(
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
        )
    console.print(t)
    for j in r["jobs"]:
        if j.get("stack_check"):
            console.print(f"job {j['job_id']}: stack check: {j['stack_check']}", soft_wrap=True, highlight=False)
        for rec in j["ray_logs_recovered"]:
            console.print(
                f"job {j['job_id']}: Ray logs of {rec['node']} recovered later, by job {rec['by_job']}"
                f"{' at ' + rec['time'] if rec['time'] else ''} (the node was lost, or killed before its "
                "cleanup)",
                soft_wrap=True,
                highlight=False,
            )
        for rec in j["ray_logs_lost"]:
            console.print(
                f"job {j['job_id']}: Ray logs of {rec['node']} lost: job {rec['by_job']} found none left on "
                f"the node{' at ' + rec['time'] if rec['time'] else ''}",
                soft_wrap=True,
                highlight=False,
            )
        if missing := j["ray_logs_missing"]:
            console.print(
                f"job {j['job_id']}: no Ray logs kept from {', '.join(missing)} (the node was "
                "lost, or killed before its cleanup; see its worker log); still missing: the next job of "
                f"yours on {'that node' if len(missing) == 1 else 'each'} recovers them",
                soft_wrap=True,
                highlight=False,
            )
    if r["other_jobs_in_run_dir"]:
        console.print(f"(jobs.tsv also holds earlier runs' jobs: {', '.join(r['other_jobs_in_run_dir'])})")
    nodes = [
        f"{n['node']}"
        + (f" (head of {', '.join(n['head_of_jobs'])})" if n["head_of_jobs"] else "")
        + (f": {', '.join(n['roles'])}" if n["roles"] else "")
        + (", no GPU found" if n["no_gpu"] else f", {n['gpus']} GPUs" if n["gpus"] else "")
        for n in r["nodes"]
    ]
    console.print("nodes: " + ("; ".join(nodes) or "-"), soft_wrap=True, highlight=False)
    if r["checkpoints"]:
        t = table(f"Checkpoints ({rp.fmt_bytes(r['checkpoint_bytes'])})")
        for col in ("kind", "step", "size", "complete", "path"):
            t.add_column(col, overflow="fold", justify="right" if col in ("step", "size") else "left")
        for c in r["checkpoints"]:
            t.add_row(c["kind"], str(c["step"]), rp.fmt_bytes(c["bytes"]), "yes" if c["complete"] else "no", c["path"])
        console.print(t)
    else:
        console.print("checkpoints: none")
    m = r["metrics"]
    if m:
        t = table(f"Last metrics: step {m['step']} ({m['log']})")
        t.add_column("metric")
        t.add_column("value", justify="right")
        for k, v in rp.headline(m):
            t.add_row(k, v)
        console.print(t)
        if (more := len(m["values"]) - len(rp.headline(m))) > 0:
            console.print(f"({more} more metrics in --json and --markdown)")
        if m.get("reward_note"):
            console.print(f"warning: {m['reward_note']}", highlight=False)
    else:
        console.print("last metrics: no training step in the job logs")
    if r["gpu"]["note"]:
        console.print(r["gpu"]["note"], highlight=False)
    if r["memory"]:
        t = table("Peak GPU memory per role (GiB)")
        for col in ("role", "measured peak", "where", "predicted", "prediction", "measured/predicted"):
            t.add_column(col, overflow="fold")
        for x in r["memory"]:
            t.add_row(
                x["role"],
                rp.gib(x["measured_peak_gib"]),
                rp.where_text(x),
                rp.gib(x["predicted_gib"]),
                x["predicted_as"] or "-",
                rp.pct(x["ratio"]),
            )
        console.print(t)
    if r["plan"] is None:
        console.print(rp.NO_PLAN)
    _print_timing(r["timing"])


def _print_timing(tm: dict) -> None:
    from hpcrl.logs import report_timing as rt

    if tm["note"]:
        console.print(tm["note"], highlight=False)
        return
    t = table(f"Plan vs real, seconds ({tm['file']}, {tm['records']} records)")
    for col in ("", "plan", "plan band", "real (median)", "real min-max", "n", "real/plan", "real from"):
        t.add_column(col, overflow="fold")
    for x in tm["rows"]:
        src = x.get("source")
        t.add_row(
            x["what"],
            rt.seconds(x["plan_s"]) + (" (derived)" if x.get("plan_basis") == "derived" else ""),
            rt.band_text(x),
            rt.seconds(x["real_s"]),
            "-" if x["real_min_s"] is None else f"{x['real_min_s']:,.1f}-{x['real_max_s']:,.1f}",
            str(x["n"]),
            "-" if x["ratio"] is None else f"{x['ratio']:.2f}x",
            (", ".join(src) if isinstance(src, list) else src) or "-",
        )
    console.print(t)
    if (step := tm["rows"][0]).get("plan_basis") not in (None, "-"):
        console.print(f"plan band basis: {step['plan_basis']}", soft_wrap=True, highlight=False)
    if i := tm["interval"]:
        console.print(rt.interval_text(i), soft_wrap=True, highlight=False)
    console.print(rt.lost_text(tm["last_stop"]), soft_wrap=True, highlight=False)
    for w in tm["warnings"]:
        console.print(f"[yellow]warning:[/] {w}", soft_wrap=True, highlight=False)
