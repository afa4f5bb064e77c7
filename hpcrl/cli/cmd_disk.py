"""`hpcrl plan-disk`: will the checkpoints (and the caches beside them) fit the quota?"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from hpcrl.cli.app import app
from hpcrl.cli.output import console, print_json, table


@app.command("plan-disk")
def plan_disk_cmd(
    backend: Optional[str] = typer.Option(
        None, "--backend", "-b", help="Backend whose checkpoints to plan (default: hpcrl.backend's; docs/plan-disk.md)"
    ),
    config: Optional[str] = typer.Option(
        None, "--config", help="A run config: its backend, model and checkpoint settings, planned as render plans them"
    ),
    nodes: Optional[int] = typer.Option(None, "--nodes", "-N", help="With --config: nodes (default hpcrl.nodes)"),
    sets: Optional[list[str]] = typer.Option(None, "--set", help="With --config: override key=value (repeatable)"),
    model: Optional[str] = typer.Option(
        None, "--model", "-m", help="Catalog name, alias, config.json path or cached HF repo id (default 32b)"
    ),
    learners: Optional[int] = typer.Option(None, "--learners", help="Learner GPUs, one file set each (default 8)"),
    lora_rank: Optional[int] = typer.Option(None, "--lora-rank", help="LoRA rank (0: full fine-tuning)"),
    zero_stage: Optional[int] = typer.Option(None, "--zero-stage", help="DeepSpeed ZeRO stage (default 3)"),
    save_freq: Optional[int] = typer.Option(
        None, "--save-freq", help="A separate HF save every N steps: save_freq (200)"
    ),
    state_freq: Optional[int] = typer.Option(
        None,
        "--checkpoint-state-freq",
        "--ckpt-every",
        help="The resume state every N steps: checkpoint_state_freq, trainer.save_freq, ckpt.save_steps (200)",
    ),
    keep: Optional[int] = typer.Option(
        None,
        "--keep-last-n-checkpoints",
        "--keep",
        help="State checkpoints kept: "
        "keep_last_n_checkpoints (3; -1 all), trainer.max_actor_ckpt_to_keep (2; -1 "
        "null), ckpt.max_num (3)",
    ),
    total_steps: Optional[int] = typer.Option(None, "--total-steps", help="Training steps of the run (1000)"),
    save_hf: Optional[bool] = typer.Option(
        None,
        "--save-hf/--no-save-hf",
        help="A whole-model HF save with each checkpoint: hf_model in save_contents, ckpt.save_hf",
    ),
    disable_ds: Optional[bool] = typer.Option(None, "--disable-ds/--no-disable-ds", help="OpenRLHF: ckpt.disable_ds"),
    lora_hf_save: Optional[str] = typer.Option(
        None,
        "--lora-hf-save",
        help="OpenRLHF under LoRA: adapter (3c3be623) or full (OpenRLHF before 2d0b9854; the users' 203 GB saves)",
    ),
    hf_cache: Optional[bool] = typer.Option(
        None,
        "--hf-cache/--no-hf-cache",
        help="Count the HF model cache (default: when the profile's hf_home is beside the run root, with its quota)",
    ),
    dataset_gib: float = typer.Option(0.0, "--dataset-gib", help="HF datasets cache on the same quota"),
    rollout_tokens: int = typer.Option(
        0,
        "--rollout-tokens-per-step",
        help="Tokens a step's rollout dump holds (trainer.rollout_data_dir, save_traces)",
    ),
    cluster: Optional[str] = typer.Option(None, "--cluster", "-c", help="Profile whose run_root quota applies"),
    cluster_file: Optional[Path] = typer.Option(None, "--cluster-file", help="Load this profile file instead"),
    quota_gib: Optional[float] = typer.Option(
        None, "--quota-gib", help="Quota of the run directory (overrides the profile)"
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON"),
) -> None:
    """Will the checkpoints fit? Each kind a backend writes, the caches beside them, at peak, against the quota."""
    from hpcrl.planning.disk_answer import DiskRequest, plan_disk

    b, quota_from = plan_disk(
        DiskRequest(
            backend=backend,
            config=config,
            nodes=nodes,
            sets=tuple(sets or ()),
            model=model,
            learners=learners,
            lora_rank=lora_rank,
            zero_stage=zero_stage,
            save_freq=save_freq,
            checkpoint_state_freq=state_freq,
            keep_last_n_checkpoints=keep,
            total_steps=total_steps,
            save_hf=save_hf,
            disable_ds=disable_ds,
            lora_hf_save=lora_hf_save,
            hf_cache=hf_cache,
            dataset_gib=dataset_gib,
            rollout_tokens_per_step=rollout_tokens,
            cluster=cluster,
            cluster_file=None if cluster_file is None else str(cluster_file),
            quota_gib=quota_gib,
        )
    )
    _show(b, quota_from, as_json)


def _show(b, quota_from: str, as_json: bool) -> None:
    from hpcrl.planning.disk import GB, GIB
    from hpcrl.planning.disk_backends import settings_text

    if as_json:
        from hpcrl.planning.disk_answer import plan_disk_data

        print_json(plan_disk_data(b, quota_from))
        return
    s = b.inputs
    steps = f"{s.total_steps} steps" if s.total_steps else "steps unknown"
    console.print(
        f"[bold]{s.model.name}[/] ({b.backend}): {b.trainable:,} trainable of {s.model.total_params:,} "
        f"parameters, {s.learners} learner GPUs, {steps}",
        highlight=False,
    )
    console.print(f"settings: {settings_text(b)}", highlight=False, soft_wrap=True)
    t = table("What the run writes under the quota")
    for col, just in (
        ("kind", "left"),
        ("one (GiB)", "right"),
        ("one (GB)", "right"),
        ("written", "right"),
        ("at peak", "right"),
        ("peak (GiB)", "right"),
    ):
        t.add_column(col, justify=just, overflow="fold")  # type: ignore[arg-type]
    for i in b.items:
        t.add_row(
            i.what,
            f"{i.one_bytes / GIB:,.1f}",
            f"{i.one_bytes / GB:,.1f}",
            "?" if i.written is None else str(i.written),
            str(i.at_peak),
            f"{i.peak_bytes / GIB:,.1f}",
        )
    console.print(t)
    for i in b.items:
        if i.terms:
            console.print(
                f"  {i.what.split(' (')[0]}: " + "; ".join(f"{k} {v / GIB:,.2f} GiB" for k, v in i.terms.items()),
                highlight=False,
                soft_wrap=True,
            )
    for i in b.items:
        console.print(f"  source of {i.kind}: {i.source}", highlight=False, soft_wrap=True, style="dim")
    for note in b.notes:
        console.print(f"  note: {note}", highlight=False, soft_wrap=True)
    console.print(f"Quota from {quota_from}", highlight=False)
    style = {True: "green", False: "red", None: "yellow"}[b.fits]
    console.print(f"[bold {style}]Verdict:[/] {b.verdict()}", highlight=False, soft_wrap=True)
    if b.fits is False and not b.fixes:
        console.print("  (no single setting fits: combine them, or raise the quota)")
