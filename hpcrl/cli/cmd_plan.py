"""`hpcrl plan`: ranked layouts for N nodes, with the numbers behind each rank."""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

import typer

from hpcrl.cli.app import app
from hpcrl.cli.output import assumed, console, print_json, progress, table, warn
from hpcrl.cli.request import RunRequest, run_request_options


@app.command("plan")
@run_request_options(smoke=False)
def plan_cmd(
    request: RunRequest,
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Model to plan (default: the config's)"),
    top: int = typer.Option(5, "--top", min=1, help="How many layouts to show"),
    as_json: bool = typer.Option(False, "--json", help="Print layouts as JSON"),
) -> None:
    """Rank the layouts of N nodes: learners per node, vLLM engines, TP, memory use."""
    from hpcrl.jobs.run_script import plan

    progress(not as_json)
    planned = plan(replace(request, model=model))
    rp = planned.plan
    shown = rp.layouts[:top]
    if as_json:
        from hpcrl.planning.request import plan_data

        print_json(plan_data(rp, top, planned.job))
        return
    for a in rp.assumptions:
        assumed(a)
    for message in rp.warnings:
        warn(message)
    w = rp.workload
    console.print(
        f"[bold]{w.model.name}[/] on {rp.nodes} x {rp.profile.name} "
        f"({rp.profile.gpu.count_per_node} x {rp.profile.gpu.model}, {rp.profile.gpu.memory_gib:.1f} GiB): "
        f"{w.seqs} sequences of {w.seq_len} tokens per step, {rp.backend.tokens_text(rp)}"
    )
    t = table(f"Top {len(shown)} of {len(rp.layouts)} layouts that fit")
    for col in (
        "#",
        "num_learners_per_node",
        "engines x TP",
        "util",
        "idle",
        "learner GiB",
        "KV GiB/GPU",
        "gen s",
        "train s",
    ):
        t.add_column(col, overflow="fold")
    for i, lay in enumerate(shown, 1):
        d = lay.to_dict()
        learners = f"[{lay.learners_per_node}] x {lay.learner_nodes}"
        t.add_row(
            str(i),
            learners,
            f"{lay.engines} x {lay.tp}",
            f"{lay.gpu_memory_utilization:.2f}",
            str(lay.idle_gpus),
            f"{d['learner_peak_gib']:.1f}/{d['gpu_usable_gib']:.1f}",
            f"{d['engine_kv_cache_gib']:.1f}",
            f"{d['generation_time_s']:.0f}",
            f"{d['training_time_s']:.0f}",
        )
    console.print(t)
    for i, lay in enumerate(shown, 1):
        console.print(f"  {i}: {lay.reason()}; learner headroom {lay.learner_headroom:.0%}")
    console.print(
        "Ranked by estimated step time (mid), steps within 10% going to fewer idle GPUs, then fewer learners "
        "per node, then more headroom; see docs/plan.md."
    )
    if shown:
        console.print(f"Step basis: {shown[0].step.basis}")
