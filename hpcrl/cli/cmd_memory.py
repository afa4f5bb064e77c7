"""`hpcrl plan-memory`: per-GPU memory of a learner and an engine, with a verdict."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import List, Optional

import typer

from hpcrl.cli.app import app
from hpcrl.cli.output import console, print_json, table


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


class KvCacheDtype(str, Enum):
    auto = "auto"
    fp8 = "fp8"


class RolloutOffload(str, Enum):
    none = "none"
    optimizer = "optimizer"
    all = "all"


@app.command("plan-memory")
def plan_memory_cmd(
    config: Optional[str] = typer.Option(None, "--config", help="Run config file or shipped name: answer for that run"),
    sets: List[str] = typer.Option([], "--set", help="Override a config field: key=value (with --config)"),
    model: Optional[str] = typer.Option(
        None,
        "--model",
        "-m",
        help="Catalog name, alias (7b, 32b, ...), config.json path or cached HF repo id (default: the config's, else 32b)",
    ),
    cluster: Optional[str] = typer.Option(
        None,
        "--cluster",
        "-c",
        help="Cluster profile (default: the config's, else isambard-ai); name:variant picks a node type",
    ),
    cluster_file: Optional[Path] = typer.Option(None, "--cluster-file", help="Load this profile file instead"),
    gpus: Optional[int] = typer.Option(
        None,
        "--gpus",
        help="A job with this many GPUs of one node: its share of host RAM (default: the config's hpcrl.gpus)",
    ),
    learner_gpus: Optional[int] = typer.Option(
        None, "--learner-gpus", help="Learner GPUs (ZeRO world size); default: fewest that fit"
    ),
    tokens_per_gpu: Optional[int] = typer.Option(
        None, "--tokens-per-gpu", help="Packed tokens in one learner micro-batch (default: the config's, else 8192)"
    ),
    gc: Optional[bool] = typer.Option(
        None,
        "--gradient-checkpointing/--no-gradient-checkpointing",
        help="Recompute activations in the backward (default: the framework's, or the "
        "config's); --no-gradient-checkpointing keeps every activation",
    ),
    ref_policy: Optional[bool] = typer.Option(
        None,
        "--ref-policy/--no-ref-policy",
        help="A frozen reference copy on each learner (default: the framework's, or the config's)",
    ),
    zpg: Optional[int] = typer.Option(
        None, "--zpg", help="ZeRO++ secondary partition size (default: the framework's; 1 is off)"
    ),
    offload: Optional[OffloadChoice] = typer.Option(None, "--offload", help="ZeRO offload: none, optimizer, params"),
    zero_stage: Optional[int] = typer.Option(None, "--zero-stage", help="0, 2 or 3 (DeepSpeed learners; default 3)"),
    micro_batches: Optional[int] = typer.Option(
        None,
        "--micro-batches",
        help="FSDP learners: micro-batches per optimizer step on one GPU (default: the config's mini-batch / micro-batch ratio, else 2)",
    ),
    fsdp_version: Optional[int] = typer.Option(
        None,
        "--fsdp-version",
        help="FSDP learners: 1 or 2, the framework's fsdp / fsdp2 strategy (default: the config's, else the framework's)",
    ),
    lora_rank: Optional[int] = typer.Option(
        None, "--lora-rank", min=0, help="LoRA rank (0: full fine-tuning), where the framework applies LoRA"
    ),
    load_in_4bit: Optional[bool] = typer.Option(
        None, "--load-in-4bit/--no-load-in-4bit", help="4-bit base weights (QLoRA), where the framework loads them"
    ),
    logprob_impl: Optional[LogprobChoice] = typer.Option(
        None, "--logprob-impl", help="Default: the backend's (docs/backends.md)"
    ),
    grad_dtype: Optional[GradDtype] = typer.Option(
        None, "--grad-accum-dtype", help="ZeRO gradient partitions (default: the framework's)"
    ),
    vllm_tp: Optional[int] = typer.Option(
        None, "--vllm-tp", help="Engine tensor-parallel size; default: smallest that fits"
    ),
    vllm_util: Optional[float] = typer.Option(
        None,
        "--vllm-gpu-memory-utilization",
        help="Default: the config's, else the framework's (shown under 'assumes')",
    ),
    max_seq_len: Optional[int] = typer.Option(
        None, "--max-seq-len", help="Engine sequence length (default: prompt + response)"
    ),
    backend: Optional[str] = typer.Option(
        None, "--backend", help="Framework whose learner to model, without --config (default: hpcrl.backend's default)"
    ),
    framework_version: Optional[str] = typer.Option(
        None,
        "--framework-version",
        help="Without --config: the framework version whose learner to model (name or commit; default the newest hpcrl knows)",
    ),
    colocated: Optional[bool] = typer.Option(
        None, "--colocated/--separate", help="Learner and engine share every GPU (default: the framework's)"
    ),
    rollout_offload: RolloutOffload = typer.Option(
        RolloutOffload.none,
        "--rollout-offload",
        help="Colocated, without --config: training state in host RAM while vLLM generates",
    ),
    keep_grads: Optional[bool] = typer.Option(
        None,
        "--keep-grads/--free-grads",
        help="Colocated, without --config: gradients stay on the GPU between steps (DeepSpeed yes, FSDP no)",
    ),
    weight_sync: Optional[WeightSync] = typer.Option(
        None,
        "--weight-sync",
        help="Learner -> vLLM weight sync: whole-model, per-param, auto (pick as the framework does), none",
    ),
    # vLLM's own engine arguments (issue 25): what changes how vLLM sizes its KV pool.
    vllm_max_num_seqs: Optional[int] = typer.Option(
        None, "--vllm-max-num-seqs", help="vLLM max_num_seqs (default: the vLLM version's; sampler warm-up rows)"
    ),
    vllm_max_num_batched_tokens: Optional[int] = typer.Option(
        None,
        "--vllm-max-num-batched-tokens",
        help="vLLM max_num_batched_tokens (default: the vLLM version's; profiling forward)",
    ),
    vllm_enforce_eager: bool = typer.Option(False, "--vllm-enforce-eager", help="No CUDA graphs (vLLM enforce_eager)"),
    vllm_version: Optional[str] = typer.Option(
        None,
        "--vllm-version",
        help="vLLM whose memory accounting to follow (default: the backend's pinned or required vLLM)",
    ),
    kv_cache_dtype: KvCacheDtype = typer.Option(
        KvCacheDtype.auto, "--kv-cache-dtype", help="vLLM kv_cache_dtype: auto (the model's bf16) or fp8"
    ),
    sequences: Optional[int] = typer.Option(
        None,
        "--sequences",
        help="Also the engine's generation time for N sequences (with --prompt-len and --response-len)",
    ),
    prompt_len: Optional[int] = typer.Option(None, "--prompt-len", help="Prompt tokens of each of the --sequences"),
    response_len: Optional[int] = typer.Option(
        None, "--response-len", help="Generated tokens of each of the --sequences"
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON"),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Write a stacked bar chart (PNG)"),
) -> None:
    """Will it fit? Per-GPU memory of a learner and an engine, and host RAM, for a run config or a framework's defaults."""
    from hpcrl.cli.outfile import output_target, write_output
    from hpcrl.planning import memory_question as mq

    if plot is not None:
        output_target(plot, "--plot", stdout_ok=False)  # refused before any planning
    from hpcrl.planning.memory_answer import EngineOptions, GenerationAsk, MemoryRequest, plan_memory_data

    given = mq.Overrides(
        model=model,
        tokens_per_gpu=tokens_per_gpu,
        ref_policy=ref_policy,
        zpg=zpg,
        offload=offload.value if offload else None,
        lora_rank=lora_rank,
        load_in_4bit=load_in_4bit,
        logprob_impl=logprob_impl.value if logprob_impl else None,
        grad_accum_dtype=grad_dtype.value if grad_dtype else None,
        gradient_checkpointing=gc,
        util=vllm_util,
        weight_sync=weight_sync.value.replace("-", "_") if weight_sync else None,
        micro_batches=micro_batches,
        fsdp_version=fsdp_version,
        zero_stage=zero_stage,
        framework_version=framework_version,
    )
    data = plan_memory_data(
        MemoryRequest(
            config=config,
            sets=tuple(sets),
            cluster=cluster,
            cluster_file=cluster_file,
            gpus=gpus,
            learner_gpus=learner_gpus,
            backend=backend,
            colocated=colocated,
            rollout_offload=rollout_offload.value,
            keep_grads=keep_grads,
            vllm_tp=vllm_tp,
            max_seq_len=max_seq_len,
            given=given,
            engine=EngineOptions(
                vllm_max_num_seqs, vllm_max_num_batched_tokens, vllm_enforce_eager, vllm_version, kv_cache_dtype.value
            ),
            generation=GenerationAsk.read(sequences, prompt_len, response_len),
        )
    )
    if data.get("learner", {}).get("kind") == "hf-trl":  # the backend's own memory model (a custom script's)
        print_json(data) if as_json else _print_hf(data)
        return
    if plot is not None:
        import io

        from hpcrl.logs.plots import plot_memory

        png = io.BytesIO()
        plot_memory(data, png)
        write_output(plot, png.getvalue(), "--plot", stdout_ok=False)
    if as_json:
        print_json(data)
        return
    _print_plan(data)
    if plot is not None:
        console.print(f"plot written to {plot}")


def _print_plan(d: dict) -> None:
    from hpcrl.memory.sharding import from_plan

    lr, en, host, gpu = d["learner"], d["engine"], d["host"], d["gpu"]
    console.print(
        f"[bold]{d['model']['name']}[/] on [bold]{gpu['cluster']}[/] "
        f"({gpu['name']}, {gpu['usable_gib']:.1f} GiB usable per GPU)"
    )
    for line in d["assumptions"]:
        console.print(f"  assumes: {line}", soft_wrap=True)
    for note in d["notes"]:
        console.print(f"  note: {note}", soft_wrap=True)
    sharding = from_plan(lr)
    t = table(f"Learner GPU: {sharding.summary(lr)}, peak at {lr['peak_phase']}")
    t.add_column("term")
    t.add_column("GiB", justify="right")
    for term, gib in lr["breakdown"].items():
        t.add_row(term, f"{gib:.2f}")
    t.add_row("[bold]peak allocated[/]", f"[bold]{lr['peak_allocated_gib']:.2f}[/]")
    t.add_row("peak reserved (allocator)" + sharding.reserved_note, f"{lr['peak_reserved_gib']:.2f}")
    if lr.get("reserved_need_gib", lr["peak_reserved_gib"]) < lr["peak_reserved_gib"] - 0.005:
        t.add_row("reserved the update needs (the allocator gives cache back)", f"{lr['reserved_need_gib']:.2f}")
    t.add_row(
        "CUDA context + NCCL" + (" + the reference's process" if lr.get("reference_process_gib") else ""),
        f"{lr['non_torch_gib']:.2f}",
    )
    t.add_row("[bold]on the GPU[/]", f"[bold]{lr['device_total_gib']:.2f}[/] / {gpu['usable_gib']:.1f}")
    t.add_row(
        f"allocator margin kept free (measured spread{sharding.margin_rows})", f"{lr['allocator_margin_gib']:.2f}"
    )
    if sharding.shows_deepspeed_estimate:
        t.add_row("DeepSpeed's own estimate", f"{lr['deepspeed_estimate_gib']:.2f}")
    console.print(t)
    _print_time(lr["time"], lr["tokens_per_gpu"])
    e = table(
        f"Engine GPU: vLLM {en['vllm_version']} TP={en['tp']}, gpu_memory_utilization="
        f"{en['gpu_memory_utilization']}, max_num_seqs {en['max_num_seqs']}, "
        f"max_num_batched_tokens {en['max_num_batched_tokens']}"
    )
    e.add_column("term (derived / measured from vLLM logs)")
    e.add_column("GiB", justify="right")
    e.add_row("weights (derived)", f"{en['weights_gib']:.2f}")
    e.add_row(
        "profiling peak: forward or sampler warm-up (derived; sampler bytes fitted to logs where unread)",
        f"{en['activation_peak_gib']:.2f}",
    )
    e.add_row("non-torch growth over vLLM's start snapshot (measured from logs)", f"{en['non_torch_gib']:.2f}")
    e.add_row(
        "CUDA graph pool (measured from logs), "
        + ("inside the budget" if en["cuda_graphs_in_budget"] else "outside the budget"),
        f"{en['cuda_graphs_gib']:.2f}",
    )
    e.add_row("[bold]KV cache[/]", f"[bold]{en['kv_cache_gib']:.2f}[/]")
    e.add_row("KV tokens (whole blocks)", f"{en['kv_tokens']:,} ({en['kv_bytes_per_token']:,} B/token)")
    e.add_row(f"maximum concurrency for {en['max_seq_len']} tokens per request", f"{en['concurrency']:.2f}x")
    e.add_row("engine's real footprint (budget + outside it)", f"{en['footprint_gib']:.2f}")
    console.print(e)
    if "time" in en:
        _print_generation(en["time"])
    if "colocated" in d:
        _print_colocated(d["colocated"], gpu["usable_gib"])
    console.print(
        f"Host RAM on a learner node: {host['peak_gib']:.0f} GiB of {host['ram_per_node_gib']:.0f} GiB "
        + (
            f"(Ray kills at {host['kill_threshold']:.0%})"
            if host.get("ray", True)
            else "(no Ray: the node's RAM is the limit)"
        )
    )
    style = "green" if d["fits"] else "red"
    console.print(f"[bold {style}]Verdict:[/] {d['verdict']}")


def _print_generation(t: dict) -> None:
    console.print(
        f"Engine generation time for {t['sequences']} sequences of {t['prompt_len']} + {t['response_len']} "
        f"tokens: {t['generation_s']:,.1f} s (band {t['generation_low_s']:,.1f}-{t['generation_high_s']:,.1f} s; "
        f"{t['concurrency']} at once, limited by {t['concurrency_limited_by']}; decode {t['decode_s']:,.1f} s "
        f"over {t['decode_steps']:,} steps, {t['decode_bound']}-bound; prefill {t['prefill_s']:,.1f} s in "
        f"{t['prefill_passes']:,} chunks of {t['max_num_batched_tokens']:,} tokens; {t['basis']})",
        soft_wrap=True,
    )


def _print_time(lt: dict, tokens: int) -> None:
    console.print(
        f"Learner time per GPU: {lt['micro_batch_s']:.2f} s per micro-batch of {tokens} tokens + "
        f"{lt['optimizer_step_s']:.2f} s optimizer step (band x{lt['low']}-x{lt['high']}; {lt['basis']})",
        soft_wrap=True,
    )


def _print_colocated(c: dict, usable: float) -> None:
    for phase in ("training", "rollout"):
        t = table(f"Colocated GPU during {phase}" + (" (vLLM asleep)" if phase == "training" else ""))
        t.add_column("term")
        t.add_column("GiB", justify="right")
        for term, gib in c[f"{phase}_breakdown"].items():
            t.add_row(term, f"{gib:.2f}")
        t.add_row("[bold]on the GPU[/]", f"[bold]{c[f'{phase}_gib']:.2f}[/] / {usable:.1f}")
        console.print(t)


def _print_hf(d: dict) -> None:
    lr, gpu = d["learner"], d["gpu"]
    console.print(
        f"[bold]{d['model']['name']}[/] on [bold]{gpu['cluster']}[/] ({gpu['name']}, {gpu['usable_gib']:.1f} "
        f"GiB usable per GPU, {gpu['job_gpus']} GPU(s) in the job): {d['backend']} {lr['algorithm']} learner, "
        f"{lr['weights']} base, LoRA r{lr['lora_rank']}, HF generate"
    )
    for line in d["assumptions"]:
        console.print(f"  assumes: {line}", soft_wrap=True)
    for note in d["notes"]:
        console.print(f"  note: {note}", soft_wrap=True)
    t = table(
        title=f"Learner GPU ({lr['processes']} process(es)): resident, then each moment's transient terms; "
        f"peak at {lr['peak_phase']}"
    )
    t.add_column("term (derived / fitted / measured)")
    t.add_column("GiB", justify="right")
    for term, gib in lr["resident"].items():
        t.add_row(term, f"{gib:.3f}")
    for phase, p in lr["phases"].items():
        t.add_row(f"[bold]{phase}[/]", f"[bold]{p['allocated_gib']:.2f}[/] allocated, {p['reserved_gib']:.2f} reserved")
        for term, gib in p["transient"].items():
            t.add_row(f"  {term}", f"{gib:.3f}")
    for term, gib in lr["non_torch"].items():
        t.add_row(term, f"{gib:.2f}")
    t.add_row("[bold]on the GPU[/]", f"[bold]{lr['device_total_gib']:.2f}[/] / {gpu['usable_gib']:.1f}")
    t.add_row("allocator margin kept free (measured spread, DeepSpeed rows)", f"{lr['allocator_margin_gib']:.2f}")
    console.print(t)
    _print_time(lr["time"], lr["tokens_per_micro_batch"])
    host = d["host"]
    console.print(f"Host RAM: {host['peak_gib']:.0f} GiB of the job's {host['ram_gib']:.0f} GiB")
    style = "green" if d["fits"] else "red"
    console.print(f"[bold {style}]Verdict:[/] {d['verdict']}")
