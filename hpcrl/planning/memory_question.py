"""The question `hpcrl plan-memory` answers: the learner and engine the framework will really run.

Pure. With a run config, the workload is the backend's own reading of it (the same one `plan`
and `render` use), so plan-memory and plan agree by construction; without one, each
framework's defaults come from its source (backends/data/capabilities.json). Either way the
answer lists, one line each, the assumptions that set the number and where each came from:
the config, a command-line flag, or the framework's code (file and line).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from hpcrl.errors import HpcrlError, PlanError
from hpcrl.memory.colocated import Colocation, plan_colocated
from hpcrl.memory.engine import EngineSetup
from hpcrl.memory.learner import LearnerSetup, sync_modes
from hpcrl.memory.plan import MemoryPlan, plan_memory
from hpcrl.memory.sharding import flag_owner
from hpcrl.memory.planner_defaults import smallest_fitting_tp
from hpcrl.models import resolve_model
from hpcrl.planning.backends import backend_names, get_backend
from hpcrl.planning.backends.capabilities import Fact, feature, setting
from hpcrl.planning.backends.facts import MemoryFacts
from hpcrl.planning.config import RunConfig
from hpcrl.planning.layout import DEFAULT_MICRO_BATCHES, Pins, Workload, _learner_setup
from hpcrl.profiles import ClusterProfile

DEFAULT_TOKENS = 8192
MAX_LEARNER_GPUS = 1024


@dataclass(frozen=True)
class Overrides:
    """What the command line says on top of the config or the framework's defaults (None: not given)."""

    model: str | None = None
    tokens_per_gpu: int | None = None
    ref_policy: bool | None = None
    zpg: int | None = None
    offload: str | None = None
    lora_rank: int | None = None
    load_in_4bit: bool | None = None
    logprob_impl: str | None = None
    grad_accum_dtype: str | None = None
    gradient_checkpointing: bool | None = None
    util: float | None = None
    weight_sync: str | None = None
    micro_batches: int | None = None
    fsdp_version: int | None = None
    zero_stage: int | None = None
    framework_version: str | None = None  # without a config: the framework version to follow

    def workload_changes(self) -> dict[str, Any]:
        pairs = {
            "pack_length": self.tokens_per_gpu,
            "load_ref_policy": self.ref_policy,
            "hpz_partition_size": self.zpg,
            "offload": self.offload,
            "lora_rank": self.lora_rank,
            "load_in_4bit": self.load_in_4bit,
            "logprob_impl": self.logprob_impl,
            "grad_accum_dtype": self.grad_accum_dtype,
            "gradient_checkpointing": self.gradient_checkpointing,
            "weight_sync": self.weight_sync,
            "micro_batches": self.micro_batches,
            "fsdp_version": self.fsdp_version,
        }
        return {k: v for k, v in pairs.items() if v is not None}

    def flags(self) -> dict[str, Any]:
        """The learner flags given on the command line, by name."""
        pairs = {
            "--zpg": self.zpg,
            "--offload": self.offload,
            "--logprob-impl": self.logprob_impl,
            "--grad-accum-dtype": self.grad_accum_dtype,
            "--zero-stage": self.zero_stage,
            "--micro-batches": self.micro_batches,
            "--fsdp-version": self.fsdp_version,
        }
        return {k: v for k, v in pairs.items() if v is not None}


def refuse_flags(backend: str, given: Overrides) -> None:
    """Refuse, in one line, a learner flag the framework has no setting for (its MemoryFacts.refused_flags, or
    a flag only another sharding takes: Sharding.flags)."""
    facts = get_backend(backend).memory
    for flag, value in given.flags().items():
        why = facts.refused_flags.get(f"{flag} {value}") or facts.refused_flags.get(flag)
        owner = flag_owner(flag)
        if why is None and owner is not None and owner != facts.sharding:
            why = f"{backend}'s learner is {facts.sharding.family}, not {owner.family}"
        if why:
            raise HpcrlError(f"{flag} {value} is not a {backend} setting: {why}")
    if given.micro_batches is not None and given.micro_batches < 1:
        raise HpcrlError(f"--micro-batches must be at least 1, got {given.micro_batches}")
    if given.fsdp_version is not None and given.fsdp_version not in (1, 2):
        raise HpcrlError(f"--fsdp-version {given.fsdp_version} is not known; valid: 1, 2")


@dataclass(frozen=True)
class Question:
    backend: str
    workload: Workload
    util: float
    colocated: bool
    assumptions: tuple[str, ...]
    config: RunConfig | None = None
    util_pinned: bool = False

    @property
    def grads_resident(self) -> bool:
        """Colocated without a config: whether gradients stay on the GPU between steps (the framework's)."""
        resident: bool = get_backend(self.backend).memory.grads_resident
        return resident

    def check_features(self) -> None:
        """Refuse LoRA or 4-bit for a framework whose code does not apply them (capabilities.json)."""
        from hpcrl.planning.backends.capabilities import feature, unsupported

        if self.workload.lora_rank and not feature(self.backend, "lora").supported:
            raise unsupported(self.backend, "lora", f"--lora-rank {self.workload.lora_rank}")
        if self.workload.load_in_4bit and not feature(self.backend, "load_in_4bit").supported:
            raise unsupported(self.backend, "load_in_4bit", "--load-in-4bit")


# Where each assumption's value can also come from the command line.
_FLAGS = {
    "hpz_partition_size": "--zpg",
    "load_ref_policy": "--ref-policy/--no-ref-policy",
    "grad_accum_dtype": "--grad-accum-dtype",
    "gradient_checkpointing": "--gradient-checkpointing/--no-gradient-checkpointing",
    "util": "--vllm-gpu-memory-utilization",
}


def config_label(cfg: RunConfig) -> str:
    """A shipped config by its name, a user's file by its path."""
    from pathlib import Path

    from hpcrl.resources import data_dir

    path = Path(cfg.source) if cfg.source else None
    if path is None:
        return "the config"
    return path.stem if path.parent.resolve() == data_dir("configs").resolve() else str(path)


def _fact(backend: str, where: tuple[str, ...], version: str | None = None) -> Fact:
    """The fact as read at the run's framework version (None: hpcrl's table)."""
    section, name = where
    return feature(backend, name, version) if section == "features" else setting(backend, section, name, version)


def _default_value(facts: MemoryFacts, name: str, fact: Fact) -> Any:
    """A workload field's value as the framework's code sets it when nothing else does."""
    if name == "grad_accum_dtype":
        if facts.grad_dtype is not None:
            return facts.grad_dtype
        return "fp32" if fact.value == "fp32" else "bf16"  # DeepSpeed: None is the model dtype, bf16
    if name == "hpz_partition_size":
        return int(fact.value or 1)
    if name == "load_ref_policy":
        return bool(fact.value) if not isinstance(fact.value, float) else fact.value > 0
    return fact.value


def _text(name: str, value: Any, w: Workload) -> str:
    own = w.sharding.assumption(name, value, w.lora_rank)
    if own is not None:
        return own
    if name == "grad_accum_dtype":
        return f"gradient partitions in {value}"
    if name == "hpz_partition_size":
        return (
            f"ZeRO++ secondary bf16 weight copy over groups of {value} GPUs (zpg {value})"
            if int(value) > 1
            else "no ZeRO++ secondary weight copy (zpg 1)"
        )
    if name == "load_ref_policy" and value and dict(w.learner_fixed).get("reference_process"):
        return "a reference policy in its own process on every learner GPU (bf16 ZeRO-3 weights, its own CUDA context)"
    if name == "load_ref_policy":
        return "a reference policy (frozen bf16 copy) on every learner" if value else "no reference policy"
    if name == "gradient_checkpointing":
        return "gradient checkpointing on" if value else "gradient checkpointing off"
    if name == "util":
        return f"vLLM gpu_memory_utilization {value:g}"
    return f"{name} {value}"


def _version_name(backend: str, name: str | None) -> str | None:
    """The framework version a run targets (its own, else the newest hpcrl knows); None without versions."""
    from hpcrl.planning.backends import versions

    return versions.resolve(backend, name).name if versions.known(backend) else None


def _assumptions(
    backend: str, w: Workload, util: float | None, cfg: RunConfig | None, given: Overrides, version: str | None = None
) -> list[str]:
    """What the answer assumes and where each value came from (cited at the run's framework `version`);
    util None: the layout planner chooses it."""
    flags = {
        "hpz_partition_size": given.zpg,
        "load_ref_policy": given.ref_policy,
        "grad_accum_dtype": given.grad_accum_dtype,
        "gradient_checkpointing": given.gradient_checkpointing,
        "util": given.util,
    }
    out, facts = [], get_backend(backend).memory
    for name, key, where in ((d.name, d.key, d.fact) for d in facts.defaults):
        value = util if name == "util" else getattr(w, name)
        fact = _fact(backend, where, version)
        if name == "util" and value is None:
            out.append(
                "vLLM gpu_memory_utilization: chosen by hpcrl's layout planner, as `plan` chooses it (the "
                f"Engine GPU line; {key} in the config or --vllm-gpu-memory-utilization fixes it)"
            )
            continue
        if flags.get(name) is not None:
            on, _, off = _FLAGS[name].partition("/")  # the spelling given: --ref-policy or --no-ref-policy
            origin = f"{off if off and not flags[name] else on} on the command line"
        elif cfg is not None and key and key in cfg.args:
            origin = f"{key} in {config_label(cfg)}"
        else:
            origin = f"{backend}'s own default ({fact.cite()})"
            if name == "gradient_checkpointing" and key is None:
                origin = f"{backend} always enables it ({fact.cite()})"
            if name == "grad_accum_dtype" and key is None:
                origin = f"{backend}'s {facts.grad_dtype_origin} ({fact.cite()})"
        out.append(f"{_text(name, value, w)}: {origin}")
    return out + _sharding_assumptions(facts, w, cfg, given)


def _sharding_assumptions(facts: MemoryFacts, w: Workload, cfg: RunConfig | None, given: Overrides) -> list[str]:
    """The settings only the learner's sharding takes (its Sharding.flags: FSDP's version and micro-batches per
    optimizer step), and where each came from; the FSDP update's gradient sync where the backend reads it."""
    out: list[str] = []
    sharding = facts.sharding
    if "--fsdp-version" in sharding.flags:
        key = facts.fsdp_version_key
        if given.fsdp_version is not None:
            version = "--fsdp-version on the command line"
        elif cfg is not None and key and key in cfg.args:
            version = f"{key} in {config_label(cfg)}"
        else:
            version = facts.fsdp_version_origin
        out.append(f"{sharding.label(w)} actor update ({sharding.model}): {version}")
    if "--micro-batches" in sharding.flags:
        if given.micro_batches is not None:
            many = "micro-batch" if given.micro_batches == 1 else "micro-batches"
            micro = f"{given.micro_batches} {many} per optimizer step on one GPU: --micro-batches on the command line"
        elif cfg is not None:
            micro = f"micro-batches per optimizer step on one GPU as the plan sets them: {facts.micro_batches_origin}"
        else:
            micro = (
                f"{DEFAULT_MICRO_BATCHES} micro-batches per optimizer step on one GPU: ASSUMED (--micro-batches N; "
                f"in a config {facts.micro_batches_origin})"
            )
        out.append(micro)
    update = dict(w.learner_fixed).get("fsdp_update")
    if update is not None and getattr(update, "grad_sync_why", None):
        how = (
            "gradients held unsharded until the last micro-batch (no_sync)"
            if update.grad_sync == "last_micro_batch"
            else "gradients reduce-scattered into the fp32 shards after every micro-batch (no no_sync)"
        )
        out.append(f"{how}: {update.grad_sync_why}")
    return out


def from_config(cfg: RunConfig, given: Overrides = Overrides()) -> Question:
    """The run's own workload (the backend's reading of the config), with the flags on top."""
    backend = get_backend(cfg.hpcrl.backend)
    refuse_flags(backend.name, given)
    if given.framework_version is not None:
        raise HpcrlError(
            f"--framework-version {given.framework_version}: with --config the run's version is its "
            "hpcrl.framework_version (--set hpcrl.framework_version=NAME)"
        )
    if given.tokens_per_gpu is not None and given.tokens_per_gpu <= 0:
        raise HpcrlError(f"--tokens-per-gpu must be a positive integer, got {given.tokens_per_gpu}")
    w = backend.workload_from_config(cfg, given.model)
    w = replace(w, **given.workload_changes())
    if given.tokens_per_gpu is not None and w.pack_length < w.seq_len:
        raise HpcrlError(
            f"--tokens-per-gpu {given.tokens_per_gpu} is shorter than one sequence of this config ({w.seq_len} tokens)"
        )
    util_key = {d.name: d.key for d in backend.memory.defaults}.get("util")
    pinned = util_key in cfg.args if util_key else False
    util = (
        given.util
        if given.util is not None
        else float(cfg.args[util_key])
        if pinned and util_key
        else float(_fact(backend.name, ("vllm", "gpu_memory_utilization")).value)
    )
    # A colocated config is answered by the backend's planner (_colocated_run), which picks what is not fixed.
    planned = backend.colocated(cfg) and not pinned and given.util is None
    return Question(
        backend.name,
        w,
        util,
        backend.colocated(cfg),
        tuple(
            _assumptions(
                backend.name,
                w,
                None if planned else util,
                cfg,
                given,
                _version_name(backend.name, cfg.hpcrl.framework_version),
            )
        ),
        cfg,
        pinned or given.util is not None,
    )


def defaults_backends() -> list[str]:
    """The backends plan-memory answers for without a config."""
    return [name for name in backend_names() if get_backend(name).memory.defaults]


def from_defaults(backend: str, given: Overrides = Overrides()) -> Question:
    """No config: the framework's own defaults (capability table), the flags on top."""
    if backend not in defaults_backends():
        raise HpcrlError(
            f"--backend {backend!r}: without --config, valid: {', '.join(defaults_backends())} "
            "(give --config for another backend)"
        )
    refuse_flags(backend, given)
    from hpcrl.planning.backends import versions

    if given.framework_version is not None and not versions.known(backend):
        raise HpcrlError(f"--framework-version: hpcrl keeps no versions of backend {backend}; remove it")
    version, version_assumed = (
        versions.targeted(backend, given.framework_version) if versions.known(backend) else (None, None)
    )
    b = get_backend(backend)
    facts, vname = b.memory, version.name if version else None
    values: dict[str, Any] = {}
    for d in facts.defaults:
        values[d.name] = _default_value(facts, d.name, _fact(backend, d.fact, vname))
    util = float(values.pop("util"))
    tokens = DEFAULT_TOKENS if given.tokens_per_gpu is None else given.tokens_per_gpu
    if tokens <= 0:
        raise HpcrlError(f"--tokens-per-gpu must be a positive integer, got {tokens}")
    # No config: the engine's sequence is the learner's micro-batch (prompt + response = tokens).
    w = Workload(
        model=resolve_model(given.model or "32b"),
        pack_length=tokens,
        response_length=max(1, tokens - 1),
        max_prompt_token_length=1,
        beta=0.0,
        logprob_impl=b.default_logprob_impl,
        logits_copy=facts.logits_copy,
        weight_sync=facts.weight_sync,
        sharding=facts.sharding,
        fsdp_version=facts.fsdp_version,
        vllm=b.engine_facts(vname),
        learner_fixed=b.learner_fixed(vname),
        **values,
    )
    w = replace(w, **{k: v for k, v in given.workload_changes().items() if k != "pack_length"})
    util = given.util if given.util is not None else util
    said = []
    if version_assumed and b.memory_by_version:
        said = [
            version_assumed.removeprefix("assumes ").replace("set hpcrl.framework_version", "give --framework-version")
        ]
    return Question(
        backend,
        w,
        util,
        facts.colocated,
        tuple(said + _assumptions(backend, w, util, None, given, vname)),
        util_pinned=given.util is not None,
    )


def choose_memory_plan(
    profile: ClusterProfile,
    w: Workload,
    *,
    learner_gpus: int | None,
    zero_stage: int = 3,
    vllm_tp: int | None,
    vllm_gpu_memory_utilization: float,
    max_seq_len: int | None,
    colocation: Colocation | None = None,
    engine_options: dict[str, Any] | None = None,
    sync_key: str = "",
    ray: bool = True,
) -> tuple[MemoryPlan, list[str]]:
    """The plan for workload `w`, choosing learner GPUs and TP where not given (`sync_key`: the framework's switch
    for a whole-model weight sync, which the note on an "auto" sync names; `ray`: the job runs Ray). The learner is
    built as the layout planner builds it (hpcrl.planning.layout._learner_setup), so for the same count
    plan-memory and plan give the same learner figure.

    With `colocation`, every learner GPU also runs a vLLM engine (hpcrl/memory/colocated.py):
    the learner GPUs are all the GPUs, and both phases must fit."""
    spec = w.model
    for name, value in (
        ("--tokens-per-gpu", w.pack_length),
        ("--learner-gpus", learner_gpus),
        ("--vllm-tp", vllm_tp),
        ("--max-seq-len", max_seq_len),
    ):
        if value is not None and value <= 0:
            raise HpcrlError(f"{name} must be a positive integer, got {value}")
    notes: list[str] = []
    engine = EngineSetup(
        model=spec,
        tp=vllm_tp or 1,
        gpu_memory_utilization=vllm_gpu_memory_utilization,
        gpu_total_bytes=profile.gpu_bytes,
        max_seq_len=max_seq_len or w.seq_len,
        **(engine_options or {}),  # vLLM version, scheduler sizes, eager, KV dtype (issue 25)
    )
    engine.check(profile.gpu.count_per_node)
    if vllm_tp is None:
        tp = smallest_fitting_tp(profile, engine)
        if tp is None:
            tp = max(spec.tp_sizes(profile.gpu.count_per_node))
            notes.append(f"no TP within one node fits an engine; showing TP={tp}")
        else:
            notes.append(f"vLLM TP={tp}: the smallest that fits (set --vllm-tp to choose)")
        engine = EngineSetup(**{**engine.__dict__, "tp": tp})

    def setup(n: int, sync: str) -> LearnerSetup:
        s = _learner_setup(w, n, sync)
        return s if zero_stage == s.zero_stage else replace(s, zero_stage=zero_stage)  # type: ignore[arg-type]

    def fits(plan: MemoryPlan) -> bool:
        return plan.learner_fits and (colocation is None or plan.rollout_fits)  # type: ignore[attr-defined]

    def plan_for(n: int) -> MemoryPlan:
        for sync in sync_modes(w.weight_sync):
            if colocation is None:
                plan = plan_memory(profile, setup(n, sync), engine, ray=ray)
            else:
                plan = plan_colocated(profile, setup(n, sync), engine, colocation, ray=ray)
            if fits(plan):
                break
        return plan

    what = "GPUs (each trains and generates)" if colocation else "learner GPUs"

    def sync_note(plan: MemoryPlan) -> list[str]:
        if w.weight_sync != "auto":
            return []
        whole = plan.learner_setup.weight_sync == "whole_model"
        return [
            f"{sync_key or 'whole-model weight sync'} {whole}: "
            + (
                "the whole model gathered for the weight sync fits"
                if whole
                else "gathering the whole model for the weight sync would not fit; one parameter at a time"
            )
        ]

    if learner_gpus is not None:
        plan = plan_for(learner_gpus)
        return plan, notes + sync_note(plan)
    n = 1
    while True:
        plan = plan_for(n)
        if fits(plan) or n >= MAX_LEARNER_GPUS or zero_stage != 3:
            break
        n *= 2
    if fits(plan):
        notes.append(f"{n} {what}: the fewest (power of two) that fit (set --learner-gpus to choose)")
    else:
        notes.append(f"no count of {what} up to {n} fits; showing {n}")
    return plan, notes + sync_note(plan)


def answer(
    q: Question,
    profile: ClusterProfile,
    *,
    learner_gpus: int | None,
    zero_stage: int = 3,
    vllm_tp: int | None = None,
    max_seq_len: int | None = None,
    colocation: Colocation | None = None,
    engine_options: dict[str, Any] | None = None,
) -> tuple[MemoryPlan, list[str]]:
    """The memory plan for the question, choosing learner GPUs and TP where not given."""
    if q.config is not None and q.colocated and colocation is None:
        return _colocated_run(q, profile, learner_gpus)
    return choose_memory_plan(
        profile,
        q.workload,
        learner_gpus=learner_gpus,
        zero_stage=zero_stage,
        vllm_tp=vllm_tp,
        vllm_gpu_memory_utilization=q.util,
        max_seq_len=max_seq_len or q.workload.seq_len,
        colocation=colocation if q.colocated or colocation else None,
        engine_options=engine_options,
        sync_key=get_backend(q.backend).memory.weight_sync_key,
        ray=get_backend(q.backend).uses_ray,
    )


def _colocated_run(q: Question, profile: ClusterProfile, learner_gpus: int | None) -> tuple[MemoryPlan, list[str]]:
    """A colocated config (the backend's `colocated(cfg)`): every GPU of the job trains and generates,
    so the question is the backend's own plan for that many GPUs (its micro-batch and offload
    choices included), exactly as `plan` makes it."""
    assert q.config is not None
    backend, g = get_backend(q.backend), profile.gpu.count_per_node
    n = learner_gpus or q.config.hpcrl.nodes and q.config.hpcrl.nodes * g or g
    if n % g:
        raise HpcrlError(
            f"--learner-gpus {n}: in a colocated run every GPU of the job trains, so give a multiple "
            f"of the {g} GPUs of a {profile.name} node"
        )
    try:
        pins = Pins(gpu_memory_utilization=q.util if q.util_pinned else None)  # the flag or the config's value
        planned = backend.plan(q.config, profile, n // g, q.workload, pins, [])
    except PlanError as exc:
        raise PlanError(f"{exc} (plan-memory asks the backend's planner for a colocated run of {n} GPUs)") from None
    lay = planned.layouts[0]
    notes = [f"colocated on {n} GPUs ({n // g} nodes): {backend.name}'s plan for them"]
    notes += [f"{k}: {v}" for k, v in planned.choices.items()]
    return lay.memory, notes + list(lay.notes)


def own_answer(
    cfg: RunConfig, profile: ClusterProfile, given: Overrides, learner_gpus: int | None
) -> dict[str, Any] | None:
    """plan-memory's answer from the config's backend's own memory model (None: the shared question applies)."""
    answer: dict[str, Any] | None = get_backend(cfg.hpcrl.backend).memory_answer(cfg, profile, given, learner_gpus)
    return answer


__all__ = [
    "Overrides",
    "Question",
    "refuse_flags",
    "answer",
    "choose_memory_plan",
    "defaults_backends",
    "from_config",
    "from_defaults",
    "own_answer",
]
