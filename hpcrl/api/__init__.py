"""hpcrl's Python API: the commands' results as objects, for scripted sweeps (docs/api.md).

Each function takes the command's options as keyword arguments (the flag's name, `-` as `_`) and
returns a Result: the same data the command's `--json` prints, read as attributes
(`plan_memory(model="32b").learner.peak_allocated_gib`) or as the dict itself (`.to_dict()`).
Errors a user can cause raise hpcrl.errors.HpcrlError subclasses, with the CLI's one-line message.

    import hpcrl.api as h
    for nodes in (4, 8, 16):
        best = h.plan(config="grpo-olmo3-32b", nodes=nodes).layouts[0]
        print(nodes, best.step_time_s)

`submit`, `status`, `runs`, `repair_runs`, `cancel` and `logs` take `registry=` (default $HPCRL_REGISTRY, else the user
data dir) as the commands' `--registry` does.
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hpcrl.planning.job_spec import JobSpec

__all__ = [
    "Result",
    "cancel",
    "describe",
    "logs",
    "plan",
    "plan_disk",
    "plan_memory",
    "render",
    "repair_runs",
    "runs",
    "status",
    "submit",
]


class Result:
    """A command's JSON result with attribute access; lists and nested objects are Results too."""

    def __init__(self, data: dict[str, Any]) -> None:
        self._data = data

    def __getattr__(self, name: str) -> Any:
        try:
            return _wrap(self._data[name])
        except KeyError:
            raise AttributeError(f"no {name!r} in this result; it has: {', '.join(self._data)}") from None

    def __getitem__(self, key: str) -> Any:
        return _wrap(self._data[key])

    def __dir__(self) -> list[str]:
        return list(self._data)

    def __repr__(self) -> str:
        return f"Result({', '.join(self._data)})"

    def to_dict(self) -> dict[str, Any]:
        """The data exactly as `--json` prints it."""
        return self._data


def _wrap(value: Any) -> Any:
    if isinstance(value, dict):
        return Result(value)
    if isinstance(value, list):
        return [_wrap(v) for v in value]
    return value


def plan_memory(
    *,
    config: str | None = None,
    sets: list[str] | tuple[str, ...] = (),
    cluster: str | None = None,
    cluster_file: str | Path | None = None,
    gpus: int | None = None,
    learner_gpus: int | None = None,
    backend: str | None = None,
    colocated: bool | None = None,
    rollout_offload: str = "none",
    keep_grads: bool | None = None,
    vllm_tp: int | None = None,
    max_seq_len: int | None = None,
    vllm_max_num_seqs: int | None = None,
    vllm_max_num_batched_tokens: int | None = None,
    vllm_enforce_eager: bool = False,
    vllm_version: str | None = None,
    kv_cache_dtype: str = "auto",
    no_gradient_checkpointing: bool = False,
    vllm_gpu_memory_utilization: float | None = None,
    **learner: Any,
) -> Result:
    """`hpcrl plan-memory`: per-GPU memory of a learner and an engine, with the verdict. `learner` takes the
    learner flags by name: model, tokens_per_gpu, ref_policy, zpg, offload, lora_rank, load_in_4bit,
    logprob_impl, grad_accum_dtype, weight_sync, micro_batches, fsdp_version, zero_stage."""
    from hpcrl.errors import HpcrlError
    from hpcrl.planning.memory_answer import EngineOptions, MemoryRequest, plan_memory_data
    from hpcrl.planning.memory_question import Overrides

    known = {f.name for f in fields(Overrides)} - {"util", "gradient_checkpointing"}
    if unknown := sorted(set(learner) - known):
        raise HpcrlError(
            f"plan_memory: unknown argument {unknown[0]!r}; valid learner arguments: {', '.join(sorted(known))}"
        )
    if "weight_sync" in learner and learner["weight_sync"]:
        learner["weight_sync"] = learner["weight_sync"].replace("-", "_")
    given = Overrides(
        **learner, util=vllm_gpu_memory_utilization, gradient_checkpointing=False if no_gradient_checkpointing else None
    )
    return Result(
        plan_memory_data(
            MemoryRequest(
                config=config,
                sets=tuple(sets),
                cluster=cluster,
                cluster_file=Path(cluster_file) if cluster_file else None,
                gpus=gpus,
                learner_gpus=learner_gpus,
                backend=backend,
                colocated=colocated,
                rollout_offload=rollout_offload,
                keep_grads=keep_grads,
                vllm_tp=vllm_tp,
                max_seq_len=max_seq_len,
                given=given,
                engine=EngineOptions(
                    vllm_max_num_seqs, vllm_max_num_batched_tokens, vllm_enforce_eager, vllm_version, kv_cache_dtype
                ),
            )
        )
    )


def _request(**kw: Any) -> Any:
    from hpcrl.planning.request import RunRequest

    for many in ("sets", "pins"):
        kw[many] = tuple(kw.get(many) or ())
    if kw.get("cluster_file") is not None:
        kw["cluster_file"] = str(kw["cluster_file"])
    return RunRequest(**kw)


def plan(
    *,
    config: str | None = None,
    nodes: int | None = None,
    cluster: str | None = None,
    cluster_file: str | Path | None = None,
    gpus: int | None = None,
    sets: list[str] | tuple[str, ...] = (),
    pins: list[str] | tuple[str, ...] = (),
    quota_gib: float | None = None,
    allow_over_limit: bool = False,
    model: str | None = None,
    top: int = 5,
) -> Result:
    """`hpcrl plan`: the ranked layouts of a run on `nodes` nodes (the best `top`)."""
    from hpcrl.jobs.run_script import plan as make_plan
    from hpcrl.planning.request import plan_data

    planned = make_plan(
        _request(
            config=config,
            nodes=nodes,
            cluster=cluster,
            cluster_file=cluster_file,
            gpus=gpus,
            sets=sets,
            pins=pins,
            quota_gib=quota_gib,
            allow_over_limit=allow_over_limit,
            model=model,
        )
    )
    return Result(plan_data(planned.plan, top, planned.job))


def render(
    *,
    config: str | None = None,
    nodes: int | None = None,
    cluster: str | None = None,
    cluster_file: str | Path | None = None,
    gpus: int | None = None,
    sets: list[str] | tuple[str, ...] = (),
    pins: list[str] | tuple[str, ...] = (),
    quota_gib: float | None = None,
    allow_over_limit: bool = False,
    smoke: bool = False,
) -> str:
    """`hpcrl render`: the job script's text (nothing is written or submitted)."""
    from hpcrl.jobs.run_script import build

    return build(
        _request(
            config=config,
            nodes=nodes,
            cluster=cluster,
            cluster_file=cluster_file,
            gpus=gpus,
            sets=sets,
            pins=pins,
            quota_gib=quota_gib,
            allow_over_limit=allow_over_limit,
            smoke=smoke,
        )
    ).text


def describe(
    *,
    config: str | None = None,
    nodes: int | None = None,
    cluster: str | None = None,
    cluster_file: str | Path | None = None,
    gpus: int | None = None,
    sets: list[str] | tuple[str, ...] = (),
    pins: list[str] | tuple[str, ...] = (),
    quota_gib: float | None = None,
    allow_over_limit: bool = False,
    smoke: bool = False,
) -> JobSpec:
    """The job description `render` formats (hpcrl/planning/job_spec.py): what the job will do, typed."""
    from hpcrl.jobs.run_script import build

    return build(
        _request(
            config=config,
            nodes=nodes,
            cluster=cluster,
            cluster_file=cluster_file,
            gpus=gpus,
            sets=sets,
            pins=pins,
            quota_gib=quota_gib,
            allow_over_limit=allow_over_limit,
            smoke=smoke,
        )
    ).job


def plan_disk(
    *,
    config: str | None = None,
    nodes: int | None = None,
    sets: list[str] | tuple[str, ...] = (),
    backend: str | None = None,
    cluster: str | None = None,
    cluster_file: str | Path | None = None,
    quota_gib: float | None = None,
    hf_cache: bool | None = None,
    dataset_gib: float = 0.0,
    rollout_tokens_per_step: int = 0,
    **run: Any,
) -> Result:
    """`hpcrl plan-disk`: what the run writes under its quota, at peak, and the verdict. `run` takes the
    run's settings by flag name when no config is given: model, learners, lora_rank, zero_stage, save_freq,
    checkpoint_state_freq, keep_last_n_checkpoints, total_steps, save_hf, disable_ds, lora_hf_save."""
    from hpcrl.errors import HpcrlError
    from hpcrl.planning.disk_answer import DiskRequest, plan_disk as budget, plan_disk_data

    known = {f.name for f in fields(DiskRequest)}
    if unknown := sorted(set(run) - known):
        raise HpcrlError(f"plan_disk: unknown argument {unknown[0]!r}; valid: {', '.join(sorted(known))}")
    b, quota_from = budget(
        DiskRequest(
            config=config,
            nodes=nodes,
            sets=tuple(sets),
            backend=backend,
            cluster=cluster,
            cluster_file=None if cluster_file is None else str(cluster_file),
            quota_gib=quota_gib,
            hf_cache=hf_cache,
            dataset_gib=dataset_gib,
            rollout_tokens_per_step=rollout_tokens_per_step,
            **run,
        )
    )
    return Result(plan_disk_data(b, quota_from))


def submit(
    *,
    config: str | None = None,
    nodes: int | None = None,
    cluster: str | None = None,
    cluster_file: str | Path | None = None,
    gpus: int | None = None,
    sets: list[str] | tuple[str, ...] = (),
    pins: list[str] | tuple[str, ...] = (),
    quota_gib: float | None = None,
    allow_over_limit: bool = False,
    smoke: bool = False,
    script: str | Path | None = None,
    run_dir: str | None = None,
    dry_run: bool = False,
    keep_exclusions: bool = False,
    registry: str | Path | None = None,
) -> Result:
    """`hpcrl submit`: render as `render` does (or take a rendered `script`), write the run dir, sbatch it,
    record the run; `dry_run` records it and writes the script beside the registry, nothing goes to Slurm."""
    from hpcrl.jobs import run_results

    req = _request(
        config=config,
        nodes=nodes,
        cluster=cluster,
        cluster_file=cluster_file,
        gpus=gpus,
        sets=sets,
        pins=pins,
        quota_gib=quota_gib,
        allow_over_limit=allow_over_limit,
        smoke=smoke,
    )
    return Result(
        run_results.submit(
            req,
            script=script,
            run_dir=run_dir,
            dry_run=dry_run,
            keep_exclusions=keep_exclusions,
            registry=registry,
            given=req.given(but=("cluster",)),
        )
    )


def status(run: str | None = None, *, all_runs: bool = False, registry: str | Path | None = None) -> Result:
    """`hpcrl status`: refresh the states of `run` (an id, a unique prefix or a job id), else of the live
    runs (`all_runs`: ended ones too), from one Slurm query, and return them."""
    from hpcrl.jobs import run_results

    return Result(run_results.status(run, all_runs=all_runs, registry=registry))


def runs(*, limit: int = 20, registry: str | Path | None = None) -> Result:
    """`hpcrl runs`: the recorded runs, newest first (`limit` 0: all), as recorded (no Slurm query)."""
    from hpcrl.jobs import run_results

    return Result(run_results.runs(limit=limit, registry=registry))


def repair_runs(*, registry: str | Path | None = None) -> Result:
    """`hpcrl runs --repair`: rebuild a damaged registry from what can be read (the damaged file kept,
    renamed: `moved_to`) and say how many runs and jobs were kept."""
    from hpcrl.jobs import run_results

    return Result(run_results.repair(registry=registry))


def cancel(run: str, *, registry: str | Path | None = None) -> Result:
    """`hpcrl cancel`: write the run's cancel marker (no continuation), then scancel its live jobs."""
    from hpcrl.jobs import run_results

    return Result(run_results.cancel(run, registry=registry))


def logs(run: str, *, registry: str | Path | None = None) -> Result:
    """`hpcrl logs`: each job's log path and text, in chain order (`missing`: why a job has none)."""
    from hpcrl.jobs import run_results

    return Result(run_results.logs(run, registry=registry))
