"""`hpcrl plan-memory`: per-GPU memory of a learner and an engine, with a verdict."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from hpcrl.cli.app import app
from hpcrl.cli.output import console, print_json
from hpcrl.memory.colocated import Colocation
from hpcrl.memory.planner_defaults import choose_memory_plan
from hpcrl.profiles import resolve_profile


class OffloadChoice(str, Enum):
    none = "none"
    optimizer = "optimizer"
    params = "params"


class LogprobChoice(str, Enum):
    eager = "eager"
    compiled = "compiled"


class GradDtype(str, Enum):
    bf16 = "bf16"
    fp32 = "fp32"


class WeightSync(str, Enum):
    auto = "auto"
    whole_model = "whole-model"
    per_param = "per-param"
    none = "none"


class BackendChoice(str, Enum):
    open_instruct = "open-instruct"
    verl = "verl"
    openrlhf = "openrlhf"


class RolloutOffload(str, Enum):
    none = "none"
    optimizer = "optimizer"
    all = "all"


# What each framework's learner looks like to the memory model, where the flags are left out:
# (colocated, gradient dtype, log-prob path, out-of-place logits / temperature).
BACKEND_DEFAULTS = {
    "open-instruct": (False, "bf16", "compiled", True),
    "verl": (True, "fp32", "compiled", False),  # hybrid engine; FSDP reduces in fp32; in-place div_
    "openrlhf": (False, "bf16", "eager", False),  # DeepSpeed default bf16 grads; fp32-upcast logits
}


@app.command("plan-memory")
def plan_memory_cmd(
    model: str = typer.Option("32b", "--model", "-m", help="Catalog name, alias (7b, 32b, ...), config.json path or cached HF repo id"),
    cluster: Optional[str] = typer.Option(None, "--cluster", "-c", help="Cluster profile (default isambard-ai); name:variant picks a node type"),
    cluster_file: Optional[Path] = typer.Option(None, "--cluster-file", help="Load this profile file instead"),
    learner_gpus: Optional[int] = typer.Option(None, "--learner-gpus", help="Learner GPUs (ZeRO world size); default: fewest that fit"),
    tokens_per_gpu: int = typer.Option(8192, "--tokens-per-gpu", help="Packed tokens in one learner micro-batch"),
    no_gc: bool = typer.Option(False, "--no-gradient-checkpointing", help="Keep every activation"),
    offload: OffloadChoice = typer.Option(OffloadChoice.none, "--offload"),
    zero_stage: int = typer.Option(3, "--zero-stage", help="0, 2 or 3"),
    lora_rank: int = typer.Option(0, "--lora-rank", help="LoRA rank (0: full fine-tuning)"),
    load_in_4bit: bool = typer.Option(False, "--load-in-4bit", help="4-bit base weights (QLoRA)"),
    logprob_impl: Optional[LogprobChoice] = typer.Option(None, "--logprob-impl", help="Default: the backend's (compiled; openrlhf eager)"),
    grad_dtype: Optional[GradDtype] = typer.Option(None, "--grad-accum-dtype", help="ZeRO gradient partitions (default bf16; verl fp32; open-instruct's config sets fp32)"),
    vllm_tp: Optional[int] = typer.Option(None, "--vllm-tp", help="Engine tensor-parallel size; default: smallest that fits"),
    vllm_util: float = typer.Option(0.9, "--vllm-gpu-memory-utilization"),
    max_seq_len: Optional[int] = typer.Option(None, "--max-seq-len", help="Engine sequence length (default: tokens per GPU)"),
    backend: BackendChoice = typer.Option(BackendChoice.open_instruct, "--backend", help="Framework whose learner to model; verl is colocated"),
    colocated: Optional[bool] = typer.Option(None, "--colocated/--separate", help="Learner and engine share every GPU (default: verl yes, others no)"),
    rollout_offload: RolloutOffload = typer.Option(RolloutOffload.none, "--rollout-offload", help="Colocated: training state moved to host RAM while vLLM generates (verl param/optimizer_offload; OpenRLHF ds.enable_sleep = all)"),
    keep_grads: Optional[bool] = typer.Option(None, "--keep-grads/--free-grads", help="Colocated: gradient partitions stay on the GPU between steps (DeepSpeed yes, verl's FSDP no)"),
    weight_sync: Optional[WeightSync] = typer.Option(None, "--weight-sync", help="Learner -> vLLM weight sync after each step: whole-model (open-instruct's gather_whole_model), per-param, auto (whole where it fits; open-instruct's default here), none (verl, openrlhf: not modelled)"),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON"),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Write a stacked bar chart (PNG)"),
) -> None:
    """Will it fit? Per-GPU memory of a learner and an engine, and host RAM, with a verdict."""
    sync = weight_sync.value.replace("-", "_") if weight_sync else ("auto" if backend.value == "open-instruct" else "none")
    profile = resolve_profile(cluster, cluster_file)
    b_colocated, b_grad, b_logprob, logits_copy = BACKEND_DEFAULTS[backend.value]
    colocation = None
    if b_colocated if colocated is None else colocated:
        keep = backend.value != "verl" if keep_grads is None else keep_grads
        offload_all = rollout_offload is RolloutOffload.all
        colocation = Colocation(param_offload=offload_all, optimizer_offload=rollout_offload is not RolloutOffload.none,
                                grads_resident=keep and not offload_all)
    plan, notes = choose_memory_plan(
        profile,
        model=model,
        learner_gpus=learner_gpus,
        tokens_per_gpu=tokens_per_gpu,
        gradient_checkpointing=not no_gc,
        offload=offload.value,
        zero_stage=zero_stage,
        lora_rank=lora_rank,
        load_in_4bit=load_in_4bit,
        logprob_impl=logprob_impl.value if logprob_impl else b_logprob,
        grad_accum_dtype=grad_dtype.value if grad_dtype else b_grad,
        vllm_tp=vllm_tp,
        vllm_gpu_memory_utilization=vllm_util,
        max_seq_len=max_seq_len,
        colocation=colocation,
        logits_copy=logits_copy,
        weight_sync=sync,
    )
    data = plan.to_dict()
    data["notes"] = notes
    if plot is not None:
        from hpcrl.plots import plot_memory

        plot_memory(data, plot)
    if as_json:
        print_json(data)
        return
    _print_plan(data)
    if plot is not None:
        console.print(f"plot written to {plot}")


def _print_plan(d: dict) -> None:
    lr, en, host, gpu = d["learner"], d["engine"], d["host"], d["gpu"]
    console.print(
        f"[bold]{d['model']['name']}[/] on [bold]{gpu['cluster']}[/] "
        f"({gpu['name']}, {gpu['usable_gib']:.1f} GiB usable per GPU)"
    )
    for note in d["notes"]:
        console.print(f"  note: {note}")
    t = Table(title=f"Learner GPU: ZeRO-{lr['zero_stage']} over {lr['gpus']} GPUs, {lr['tokens_per_gpu']} tokens, "
              f"log-prob {lr['logprob_impl']}, peak at {lr['peak_phase']}")
    t.add_column("term")
    t.add_column("GiB", justify="right")
    for term, gib in lr["breakdown"].items():
        t.add_row(term, f"{gib:.2f}")
    t.add_row("[bold]peak allocated[/]", f"[bold]{lr['peak_allocated_gib']:.2f}[/]")
    t.add_row("peak reserved (allocator)", f"{lr['peak_reserved_gib']:.2f}")
    t.add_row("CUDA context + NCCL", f"{lr['non_torch_gib']:.2f}")
    t.add_row("[bold]on the GPU[/]", f"[bold]{lr['device_total_gib']:.2f}[/] / {gpu['usable_gib']:.1f}")
    t.add_row("DeepSpeed's own estimate", f"{lr['deepspeed_estimate_gib']:.2f}")
    console.print(t)
    e = Table(title=f"Engine GPU: vLLM TP={en['tp']}, gpu_memory_utilization={en['gpu_memory_utilization']}")
    e.add_column("term")
    e.add_column("GiB", justify="right")
    e.add_row("weights", f"{en['weights_gib']:.2f}")
    e.add_row("profiling activation peak", f"{en['activation_peak_gib']:.2f}")
    e.add_row("CUDA graphs", f"{en['cuda_graphs_gib']:.2f}")
    e.add_row("CUDA context + NCCL", f"{en['non_torch_gib']:.2f}")
    e.add_row("[bold]KV cache[/]", f"[bold]{en['kv_cache_gib']:.2f}[/]")
    e.add_row("KV tokens", f"{en['kv_tokens']:,} ({en['kv_bytes_per_token']:,} B/token)")
    e.add_row(f"sequences of {en['max_seq_len']} tokens at once", f"{en['concurrent_seqs']:,}")
    console.print(e)
    if "colocated" in d:
        _print_colocated(d["colocated"], gpu["usable_gib"])
    console.print(
        f"Host RAM on a learner node: {host['peak_gib']:.0f} GiB of {host['ram_per_node_gib']:.0f} GiB "
        f"(Ray kills at {host['kill_threshold']:.0%})"
    )
    style = "green" if d["fits"] else "red"
    console.print(f"[bold {style}]Verdict:[/] {d['verdict']}")


def _print_colocated(c: dict, usable: float) -> None:
    for phase in ("training", "rollout"):
        t = Table(title=f"Colocated GPU during {phase}" + (" (vLLM asleep)" if phase == "training" else ""))
        t.add_column("term")
        t.add_column("GiB", justify="right")
        for term, gib in c[f"{phase}_breakdown"].items():
            t.add_row(term, f"{gib:.2f}")
        t.add_row("[bold]on the GPU[/]", f"[bold]{c[f'{phase}_gib']:.2f}[/] / {usable:.1f}")
        console.print(t)
