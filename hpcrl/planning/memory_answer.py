"""plan-memory's whole answer as the data `--json` prints: the question, the plan, notes and assumptions (pure).

The CLI (hpcrl/cli/cmd_memory.py) and the Python API (hpcrl/api) both call `plan_memory_data`, so the
two cannot drift apart.
"""

from __future__ import annotations

from typing import Any

from dataclasses import dataclass, field
from pathlib import Path

from hpcrl.errors import HpcrlError
from hpcrl.memory.colocated import Colocation
from hpcrl.memory.constants import GIB
from hpcrl.memory import vllm_accounting as va
from hpcrl.memory.engine import kv_by_version
from hpcrl.memory.plan import MemoryPlan
from hpcrl.models.spec import ModelSpec
from hpcrl.planning import memory_question as mq
from hpcrl.planning.engine_time import engine_work, time_dict
from hpcrl.planning.generation import generation_time
from hpcrl.profiles import ClusterProfile


@dataclass(frozen=True)
class EngineOptions:
    """vLLM's own engine arguments that change how it sizes its KV pool (None: the backend's vLLM's)."""

    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enforce_eager: bool = False
    vllm_version: str | None = None
    kv_cache_dtype: str = "auto"


@dataclass(frozen=True)
class GenerationAsk:
    """`--sequences N --prompt-len P --response-len R`: the engine's generation time for that batch."""

    sequences: int
    prompt_len: int
    response_len: int

    @staticmethod
    def read(sequences: int | None, prompt_len: int | None, response_len: int | None) -> GenerationAsk | None:
        """The three flags together, or none (None); anything else is refused."""
        given = {"--sequences": sequences, "--prompt-len": prompt_len, "--response-len": response_len}
        if all(v is None for v in given.values()):
            return None
        missing = [k for k, v in given.items() if v is None]
        if missing:
            raise HpcrlError(
                f"{', '.join(missing)} missing: the generation time needs --sequences N --prompt-len P "
                "--response-len R together"
            )
        for flag, value in given.items():
            if value is not None and value < (0 if flag == "--prompt-len" else 1):
                what = "a whole number, 0 or more" if flag == "--prompt-len" else "a positive whole number"
                raise HpcrlError(f"{flag} {value}: valid: {what}")
        return GenerationAsk(int(sequences), int(prompt_len), int(response_len))  # type: ignore[arg-type]


@dataclass(frozen=True)
class MemoryRequest:
    """What plan-memory is asked: a config (with --set words) or a backend's defaults, where, and the flags."""

    config: str | None = None
    sets: tuple[str, ...] = ()
    cluster: str | None = None
    cluster_file: Path | None = None
    gpus: int | None = None
    learner_gpus: int | None = None
    backend: str | None = None
    colocated: bool | None = None
    rollout_offload: str = "none"  # none, optimizer or all (colocated, without a config)
    keep_grads: bool | None = None
    vllm_tp: int | None = None
    max_seq_len: int | None = None
    given: mq.Overrides = field(default_factory=mq.Overrides)
    engine: EngineOptions = field(default_factory=EngineOptions)
    generation: GenerationAsk | None = None  # also ask the engine's generation time for this batch


# A KV pool that moves by more than this fraction across the vLLM versions hpcrl has read gets a note
# when the version was assumed (a choice of how loud to be, not a measurement).
VERSION_SPREAD = 0.10


def _spread(by_version: dict[str, float]) -> float:
    """How far apart the versions' pools are, as a fraction of the largest (a version where the engine
    cannot start counts 0: the widest spread)."""
    top = max(by_version.values())
    return (top - min(by_version.values())) / top if top > 0 else 0.0


def engine_generation(
    plan: MemoryPlan, model: ModelSpec, profile: ClusterProfile, ask: GenerationAsk
) -> dict[str, Any]:
    """`engine.time`: the sized engine's seconds for the asked batch (hpcrl/planning/generation.py)."""
    w = engine_work(
        plan.engine,
        model,
        plan.engine_setup.tp,
        ask.sequences,
        ask.prompt_len,
        ask.response_len,
        profile.gpu.hbm_bandwidth_tbs,
        profile.gpu.bf16_tflops,
    )
    return time_dict(generation_time(w), w)


def plan_memory_data(r: MemoryRequest) -> dict[str, Any]:
    """The answer `hpcrl plan-memory --json` prints for request `r`."""
    from hpcrl.planning.backends import get_backend
    from hpcrl.planning.node_share import job_profile
    from hpcrl.profiles import resolve_profile

    if r.sets and not r.config:
        raise HpcrlError("--set changes a run config: give --config NAME|FILE as well")
    if r.config and r.backend is not None:
        raise HpcrlError("--backend is the config's hpcrl.backend when --config is given; drop one of them")
    if r.given.zpg is not None and r.given.zpg < 1:  # 0 was read as 1 (off) without a word
        raise HpcrlError(f"--zpg must be a positive integer (1: no ZeRO++ secondary copy), got {r.given.zpg}")
    if r.rollout_offload not in ("none", "optimizer", "all"):
        raise HpcrlError(f"rollout_offload {r.rollout_offload!r}: valid: none, optimizer, all")
    given = r.given
    if r.config:
        from hpcrl.planning.inputs import resolve_config_profile

        cfg, profile = resolve_config_profile(r.config, list(r.sets), r.cluster, r.cluster_file, r.gpus)
        own = mq.own_answer(cfg, profile, given, r.learner_gpus)
        if own is not None:  # the backend's own memory model (the custom script's HF learner)
            if r.generation is not None:
                raise HpcrlError(
                    f"--sequences: the {cfg.hpcrl.backend} config generates with its own script, not "
                    "a vLLM engine; valid with a config of a vLLM backend or without --config"
                )
            return own
        question = mq.from_config(cfg, given)
    else:
        from hpcrl.planning.backends import DEFAULT_BACKEND

        question = mq.from_defaults(r.backend or DEFAULT_BACKEND, given)
        profile = job_profile(resolve_profile(r.cluster, r.cluster_file), r.gpus)
    question.check_features()
    machine = (profile.slurm.system_nodes or 0) * profile.gpu.count_per_node
    if r.learner_gpus is not None and machine and r.learner_gpus > machine:
        raise HpcrlError(
            f"--learner-gpus {r.learner_gpus:,}: {profile.name} has {machine:,} GPUs in all; valid: 1 to {machine:,}"
        )
    colocation = None
    if question.config is None and (question.colocated if r.colocated is None else r.colocated):
        keep = question.grads_resident if r.keep_grads is None else r.keep_grads
        offload_all = r.rollout_offload == "all"
        colocation = Colocation(
            param_offload=offload_all,
            optimizer_offload=r.rollout_offload != "none",
            grads_resident=keep and not offload_all,
            sleep_level=get_backend(question.backend).sleep_level(),
        )
    elif question.config is not None and r.colocated is not None and r.colocated != question.colocated:
        raise HpcrlError(
            f"--{'colocated' if r.colocated else 'separate'}: the config's {question.backend} run is "
            f"{'colocated' if question.colocated else 'separate'}; change the config instead"
        )
    facts, e = question.workload.vllm, r.engine  # the backend's vLLM and scheduler sizes (its MemoryFacts.vllm)
    engine_options = {
        "max_num_seqs": facts.max_num_seqs if e.max_num_seqs is None else e.max_num_seqs,
        "max_num_batched_tokens": facts.max_num_batched_tokens
        if e.max_num_batched_tokens is None
        else e.max_num_batched_tokens,
        "enforce_eager": e.enforce_eager or facts.enforce_eager,
        "vllm_version": e.vllm_version or facts.version,
        "kv_cache_dtype": e.kv_cache_dtype,
        "logprobs_mode": facts.logprobs_mode,
    }
    assumed = [
        f"{name} {engine_options[key]}"
        for name, key, value in (
            ("vLLM", "vllm_version", e.vllm_version),
            ("max_num_seqs", "max_num_seqs", e.max_num_seqs),
            ("max_num_batched_tokens", "max_num_batched_tokens", e.max_num_batched_tokens),
        )
        if value is None
    ]
    engine_assumption = [f"{', '.join(assumed)}: {facts.source}"] if assumed else []
    ask = r.generation
    # Asked for a batch without a config, the engine is sized for its sequences (prompt + response) unless
    # --max-seq-len says; a config's engine stays the run's.
    max_seq_len = r.max_seq_len or (ask.prompt_len + ask.response_len if ask and not r.config else None)
    plan, notes = mq.answer(
        question,
        profile,
        learner_gpus=r.learner_gpus,
        zero_stage=given.zero_stage or 3,
        vllm_tp=r.vllm_tp,
        max_seq_len=max_seq_len,
        colocation=colocation,
        engine_options=engine_options,
    )
    if not plan.engine.fits:
        raise HpcrlError(
            f"the vLLM engine does not fit (TP={plan.engine_setup.tp}, vLLM "
            f"{plan.engine.vllm_version}): {plan.engine.reason}"
        )
    data = plan.to_dict()
    if ask is not None:
        if ask.prompt_len + ask.response_len > plan.engine_setup.max_seq_len:
            raise HpcrlError(
                f"--prompt-len {ask.prompt_len} + --response-len {ask.response_len} exceed the engine's "
                f"max_model_len {plan.engine_setup.max_seq_len}; valid: at most that, or a larger "
                "--max-seq-len"
            )
        data["engine"]["time"] = engine_generation(plan, question.workload.model, profile, ask)
    by_version = {v: round(kv / GIB, 2) for v, kv in kv_by_version(plan.engine_setup).items()}
    data["kv_cache_gib_by_vllm_version"] = by_version
    if e.vllm_version is None and _spread(by_version) > VERSION_SPREAD:
        notes = [
            *notes,
            f"the KV pool rests on the vLLM version, assumed {plan.engine.vllm_version}: "
            + ", ".join(f"{v} {gib:.2f}" for v, gib in by_version.items())
            + " GiB with these scheduler sizes; --vllm-version names yours",
        ]
    read_as = va.read_release(str(engine_options["vllm_version"]))[1]
    if read_as:
        notes = [*notes, read_as]
    data["notes"] = notes
    data["assumptions"] = list(question.assumptions) + engine_assumption
    data["backend"] = question.backend
    data["config"] = question.config.source if question.config else None
    return data


__all__ = ["EngineOptions", "GenerationAsk", "MemoryRequest", "engine_generation", "plan_memory_data"]
