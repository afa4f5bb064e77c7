"""`hpcrl plan`: ranked layouts for N nodes, with the numbers behind each rank."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from hpcrl.cli.app import app
from hpcrl.cli.output import console, print_json, table, warn


@app.command("plan")
def plan_cmd(
    nodes: Optional[int] = typer.Option(None, "--nodes", "-N", help="Nodes in the job (default: the config's)"),
    gpus: Optional[int] = typer.Option(None, "--gpus", help="GPUs of one node for a job smaller than a node (1 up to the node's; default: the config's hpcrl.gpus, else whole nodes)"),
    cluster: Optional[str] = typer.Option(None, "--cluster", "-c", help="Cluster profile; name:variant picks a node type"),
    cluster_file: Optional[Path] = typer.Option(None, "--cluster-file", help="Load this profile file instead"),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Model to plan (default: the config's)"),
    config: Optional[str] = typer.Option(None, "--config", help="Run config file or shipped name (default grpo-olmo3-32b)"),
    sets: List[str] = typer.Option([], "--set", help="Override a config field: key=value (hpcrl.key=value for the hpcrl section)"),
    pins: List[str] = typer.Option([], "--pin", help="Fix a choice: learners=N, learner_nodes=N, tp=N, engines=N, util=F"),
    top: int = typer.Option(5, "--top", min=1, help="How many layouts to show"),
    allow_over_limit: bool = typer.Option(False, "--allow-over-limit", help="Warn instead of failing past partition/QOS limits"),
    as_json: bool = typer.Option(False, "--json", help="Print layouts as JSON"),
) -> None:
    """Rank the layouts of N nodes: learners per node, vLLM engines, TP, memory use."""
    from hpcrl.planning.run_plan import make_run_plan

    rp = make_run_plan(config, nodes=nodes, cluster=cluster, cluster_file=str(cluster_file) if cluster_file else None,
                       model=model, sets=sets, pins=pins, allow_over_limit=allow_over_limit, gpus=gpus)
    shown = rp.layouts[:top]
    if as_json:
        print_json({
            "cluster": rp.profile.name if not rp.profile.variant else f"{rp.profile.name}:{rp.profile.variant}",
            "nodes": rp.nodes,
            "model": rp.workload.model.name,
            "gpus_per_node": rp.profile.gpu.count_per_node,
            "warnings": list(rp.warnings),
            "layouts_considered": len(rp.layouts),
            "layouts": [dict(rank=i + 1, **lay.to_dict()) for i, lay in enumerate(shown)],
        } | ({"backend": rp.backend.name, "backend_args": rp.backend.layout_args(rp)}
             if rp.backend.plan_shows_layout_args else {}))
        return
    for w in rp.warnings:
        warn(w)
    w = rp.workload
    console.print(
        f"[bold]{w.model.name}[/] on {rp.nodes} x {rp.profile.name} "
        f"({rp.profile.gpu.count_per_node} x {rp.profile.gpu.model}, {rp.profile.gpu.memory_gib:.1f} GiB): "
        f"{w.seqs} sequences of {w.seq_len} tokens per step, {rp.backend.tokens_text(rp)}"
    )
    t = table(f"Top {len(shown)} of {len(rp.layouts)} layouts that fit")
    for col in ("#", "num_learners_per_node", "engines x TP", "util", "idle", "learner GiB", "KV GiB/GPU",
                "gen s", "train s"):
        t.add_column(col, overflow="fold")
    for i, lay in enumerate(shown, 1):
        d = lay.to_dict()
        learners = f"[{lay.learners_per_node}] x {lay.learner_nodes}"
        t.add_row(str(i), learners, f"{lay.engines} x {lay.tp}", f"{lay.gpu_memory_utilization:.2f}",
                  str(lay.idle_gpus), f"{d['learner_peak_gib']:.1f}/{d['gpu_usable_gib']:.1f}",
                  f"{d['engine_kv_cache_gib']:.1f}", f"{lay.gen_time_s:.0f}", f"{lay.train_time_s:.0f}")
    console.print(t)
    for i, lay in enumerate(shown, 1):
        console.print(f"  {i}: {lay.reason()}; learner headroom {lay.learner_headroom:.0%}")
    console.print(
        "Ranked by: no idle GPU, then estimated step time (generation: decode bound by HBM bandwidth; "
        "training: 6-10 x params x tokens at 40% of bf16 peak), steps within 10% going to fewer learners "
        "per node, then more headroom; see docs/plan.md."
    )
