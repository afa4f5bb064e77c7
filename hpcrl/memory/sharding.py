"""The learner's sharding as a strategy object: DeepSpeed ZeRO (hpcrl/memory/learner.py) or FSDP as
verl runs it (hpcrl/memory/fsdp_learner.py).

Pure. A backend hands its learner's strategy over (MemoryFacts.sharding, Workload.sharding: ZERO or FSDP),
the planners carry it in LearnerSetup.sharding, and what differs between the two learners outside their
memory models is asked of it: its label, which memory model and allocator margin apply, its step-time
terms (counts before learner_time's FIT) and the kind of timed row it rests on, the fields it adds to
plan-memory's learner JSON (plan.json's memory.learner) and how a stored one is read back (from_plan),
and the plan-memory flags only it takes. No module outside this one and the backends compares sharding
names (tests/test_architecture.py).

Setups are read by attribute (`s: Any`, a LearnerSetup or a planning Workload): hpcrl.memory.learner holds
LearnerSetup and imports this module for its default strategy, so this module cannot import it back.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from hpcrl.errors import HpcrlError
from hpcrl.memory import constants as C
from hpcrl.memory.fsdp_learner import fsdp_as_learner_memory, fsdp_margin
from hpcrl.memory.learner_result import LearnerMemory
from hpcrl.models.spec import ALL_LINEAR, MLP_MODULES, ModelSpec

# DeepSpeed's default stage3_param_persistence_threshold (elements): parameters no larger stay whole on
# every rank (deepspeed/runtime/zero/parameter_offload.py:311-321 at edaa7221, mark_persistent_parameters);
# OpenRLHF's "auto" and open-instruct's config leave it (the rows' ds_config: 100000).
PERSISTENCE_THRESHOLD = 100_000


class Sharding(ABC):
    """What memory/ and planning/ ask of a learner's sharding (one frozen instance per kind: ZERO, FSDP)."""

    key: ClassVar[str]  # its name in plan.json's memory.learner "sharding" (a ZeRO plan writes none)
    family: ClassVar[str]  # in words, for messages
    model: ClassVar[str]  # the module of its memory model
    flags: ClassVar[tuple[str, ...]]  # plan-memory flags only this learner takes
    coverage: ClassVar[tuple[str, str]]  # the timed rows' kind it rests on (learner_time.COVERED), in words
    adam_term: ClassVar[str]  # learner_time.FIT's optimizer step on the GPU
    # plan-memory's table: a note on the reserved row, the allocator margin's rows, DeepSpeed's estimate shown
    reserved_note: ClassVar[str]
    margin_rows: ClassVar[str]
    shows_deepspeed_estimate: ClassVar[bool]

    # ---- memory
    @abstractmethod
    def learner_memory(self, s: Any, zero_model: Callable[[Any], LearnerMemory]) -> LearnerMemory:
        """The learner's peak by this sharding's model; `zero_model` is learner.py's DeepSpeed ZeRO model,
        handed over by learner.learner_memory (this module cannot import it: see the module's docstring)."""

    @abstractmethod
    def allocator_margin(self, s: Any, peak_reserved: float) -> float:
        """Bytes a learner keeps free for the allocator's spread, measured on this learner's rows."""

    @abstractmethod
    def check(self, s: Any) -> None:
        """Refuse a setup this learner's models cannot answer (HpcrlError)."""

    # ---- what plan-memory writes and shows
    @abstractmethod
    def label(self, s: Any) -> str:
        """ "ZeRO-3", "FSDP2"."""

    @abstractmethod
    def stage(self, s: Any) -> int | None:
        """The learner JSON's "zero_stage" (None: not a ZeRO learner)."""

    @abstractmethod
    def plan_fields(self, s: Any) -> dict[str, Any]:
        """The learner JSON's fields only this learner has (from_plan reads them back)."""

    @abstractmethod
    def plan_label(self, learner: Mapping[str, Any]) -> str:
        """label() of the setup a learner JSON was written from."""

    @abstractmethod
    def summary(self, learner: Mapping[str, Any]) -> str:
        """The learner JSON's setting in words: its label, GPUs and what sets its micro-batch."""

    def assumption(self, name: str, value: Any, lora_rank: int) -> str | None:
        """plan-memory's words for a workload default this learner reads its own way (None: the common words)."""
        return None

    # ---- time (counts before learner_time.FIT; `passes`: forward, backward and any recompute)
    @abstractmethod
    def hook_terms(self, s: Any, passes: int) -> dict[str, float]:
        """Per micro-batch: the CPU-side work of fetching, releasing and reducing sharded parameters."""

    @abstractmethod
    def comm_terms(self, s: Any, passes: int, trainable: float, link: float) -> dict[str, float]:
        """Per micro-batch: "collectives" (seconds over `link`, bytes/s) and, where launched, "collective_calls"."""

    @abstractmethod
    def param_fetch_bytes(self, s: Any, passes: int) -> float:
        """Per micro-batch with parameter offload: the weights fetched from the host."""

    @abstractmethod
    def optimizer_shards(self, s: Any) -> int:
        """The ranks the optimizer state is partitioned over."""

    @abstractmethod
    def step_terms(self, s: Any, trainable: float, link: float) -> dict[str, float]:
        """The optimizer step's terms besides Adam itself."""

    @abstractmethod
    def reference_terms(self, s: Any, link: float) -> dict[str, float]:
        """A reference forward's terms of this sharding."""

    @abstractmethod
    def unmeasured(self, s: Any) -> list[str]:
        """What in this setup no timed row of this learner covers (learner_time's basis says so)."""


@dataclass(frozen=True)
class ZeroSharding(Sharding):
    """DeepSpeed ZeRO (stage 0, 2 or 3: LearnerSetup.zero_stage), hpcrl/memory/learner.py's model."""

    key = "zero"
    family = "DeepSpeed ZeRO"
    model = "hpcrl/memory/learner.py"
    flags = ()
    coverage = ("zero3", "ZeRO-3")
    adam_term = "adam_zero"
    reserved_note = ""
    margin_rows = ""
    shows_deepspeed_estimate = True

    def learner_memory(self, s: Any, zero_model: Callable[[Any], LearnerMemory]) -> LearnerMemory:
        return zero_model(s)

    def allocator_margin(self, s: Any, peak_reserved: float) -> float:
        return margin_bytes(s.logprob_impl, peak_reserved)

    def check(self, s: Any) -> None:
        s.check()

    def label(self, s: Any) -> str:
        return f"ZeRO-{s.zero_stage}"

    def stage(self, s: Any) -> int | None:
        return s.zero_stage

    def plan_fields(self, s: Any) -> dict[str, Any]:
        return {}

    def plan_label(self, learner: Mapping[str, Any]) -> str:
        return f"ZeRO-{learner['zero_stage']}"

    def summary(self, learner: Mapping[str, Any]) -> str:
        path = "fp32 logits" if learner.get("logits_fp32") else learner["logprob_impl"]
        return (
            f"{self.plan_label(learner)} over {learner['gpus']} GPUs, {learner['tokens_per_gpu']} tokens, "
            f"log-prob {path}"
        )

    def hook_terms(self, s: Any, passes: int) -> dict[str, float]:
        if s.zero_stage != 3:
            return {}
        m, lora = s.model, s.lora_rank > 0
        terms = {
            "zero3_hooks": fetched_tensors(m, s.lora_rank, s.lora_targets) * passes,
            "zero3_grad_tensors": 2.0 * len(s.lora_targets) * m.num_layers if lora else param_tensors(m),
        }
        if lora:
            # Measured under ZeRO-3 only, where every adapter is a fetched parameter too; without ZeRO-3
            # PEFT's few extra kernels per module are not modelled.
            terms["lora_modules"] = m.num_layers * len(s.lora_targets) * passes
        return terms

    def comm_terms(self, s: Any, passes: int, trainable: float, link: float) -> dict[str, float]:
        # ZeRO-3 all-gathers bf16 weights in each pass and reduce-scatters the gradients; ZeRO-2 reduces them.
        m, n = s.model, s.n_gpus
        frac, weights, grad_bytes = (n - 1) / n, 2.0 * m.total_params, self._grad_bytes(s)
        comm = 0.0
        if s.zero_stage == 3:
            comm = frac * (weights * passes + grad_bytes * trainable)
        elif s.zero_stage == 2:
            comm = frac * grad_bytes * trainable
        terms = {"collectives": comm / link}
        if n > 1 and s.zero_stage == 3:
            # a gather per tensor fetched; reduce-scatters bucketed
            terms["collective_calls"] = fetched_tensors(m, s.lora_rank, s.lora_targets) * passes
        return terms

    def param_fetch_bytes(self, s: Any, passes: int) -> float:
        return 2.0 * s.model.total_params / s.n_gpus * passes  # each pass's bf16 weights

    def optimizer_shards(self, s: Any) -> int:
        return s.n_gpus if s.zero_stage in (2, 3) else 1

    def step_terms(self, s: Any, trainable: float, link: float) -> dict[str, float]:
        m, n = s.model, s.n_gpus
        frac, weights = (n - 1) / n, 2.0 * m.total_params
        terms: dict[str, float] = {}
        if s.zero_stage == 3:
            terms["zero3_step_tensors"] = float(param_tensors(m, s.lora_rank, s.lora_targets))
        if s.zero_stage == 0 and n > 1:
            terms["collectives"] = 2 * frac * self._grad_bytes(s) * trainable / link  # DDP all-reduce at the boundary
        if s.zero_stage == 2 and n > 1:
            terms["collectives"] = frac * weights / link  # the updated weights all-gathered
        return terms

    def reference_terms(self, s: Any, link: float) -> dict[str, float]:
        m, n = s.model, s.n_gpus
        terms: dict[str, float] = {}
        if s.zero_stage == 3:
            terms["zero3_hooks"] = float(fetched_tensors(m))
            if n > 1:
                terms["collective_calls"] = float(fetched_tensors(m))
                terms["collectives"] = (n - 1) / n * 2.0 * m.total_params / link
        return terms

    def unmeasured(self, s: Any) -> list[str]:
        if s.zero_stage == 3:
            return []
        return ["ZeRO stage 2" if s.zero_stage == 2 else "no ZeRO sharding (one process or DDP)"]

    @staticmethod
    def _grad_bytes(s: Any) -> float:
        # DeepSpeed keeps gradient partitions in the model dtype unless grad_accum_dtype says fp32.
        return 4.0 if s.grad_accum_dtype == "fp32" else 2.0


@dataclass(frozen=True)
class FsdpSharding(Sharding):
    """FSDP (FULL_SHARD) as verl runs it, version 1 or 2 (LearnerSetup.fsdp_version), with its micro-batches
    per optimizer step: hpcrl/memory/fsdp_learner.py's model. The ZeRO-only setup fields do not apply."""

    key = "fsdp"
    family = "FSDP"
    model = "hpcrl/memory/fsdp_learner.py"
    flags = ("--micro-batches", "--fsdp-version")
    coverage = ("fsdp", "FSDP")
    adam_term = "adam_fsdp"  # foreach AdamW with grad-norm clipping
    reserved_note = ", sum over CUDA streams"
    margin_rows = ", FSDP rows"
    shows_deepspeed_estimate = False

    def learner_memory(self, s: Any, zero_model: Callable[[Any], LearnerMemory]) -> LearnerMemory:
        return fsdp_as_learner_memory(s)

    def allocator_margin(self, s: Any, peak_reserved: float) -> float:
        return fsdp_margin(peak_reserved)

    def check(self, s: Any) -> None:
        """fsdp_learner.setup_from refuses what the FSDP model cannot answer when it reads the setup."""

    def label(self, s: Any) -> str:
        return f"FSDP{s.fsdp_version}"

    def stage(self, s: Any) -> int | None:
        return None

    def plan_fields(self, s: Any) -> dict[str, Any]:
        return {
            "sharding": self.key,
            "fsdp_version": s.fsdp_version,
            "micro_batches": s.micro_batches,
            **({"framework_version": s.fsdp_update.version} if s.fsdp_update else {}),
        }

    def plan_label(self, learner: Mapping[str, Any]) -> str:
        return f"FSDP{learner['fsdp_version']}"

    def summary(self, learner: Mapping[str, Any]) -> str:
        return (
            f"{self.plan_label(learner)} over {learner['gpus']} GPUs, {learner['tokens_per_gpu']} tokens per "
            f"micro-batch, {learner['micro_batches']} micro-batch(es) per step"
        )

    def assumption(self, name: str, value: Any, lora_rank: int) -> str | None:
        if name == "grad_accum_dtype":
            return f"gradients reduced in {value}"
        if name == "load_ref_policy":
            if not value:
                return "no reference policy"
            return (
                "a reference policy: the actor with its LoRA adapter disabled (ref_in_actor)"
                if lora_rank
                else "a reference policy (fp32 shards in host RAM; on the GPU only FSDP1's gathered root unit)"
            )
        return None

    def hook_terms(self, s: Any, passes: int) -> dict[str, float]:
        return {"fsdp_units": s.model.num_layers * 2.0}  # per wrapped layer, forward and backward

    def comm_terms(self, s: Any, passes: int, trainable: float, link: float) -> dict[str, float]:
        # gathers forward and backward, reduce-scatters fp32 (mixed_precision reduce_dtype)
        m, n = s.model, s.n_gpus
        frac, weights = (n - 1) / n, 2.0 * m.total_params
        terms = {"collectives": frac * (2 * weights + 4.0 * trainable) / link}
        if n > 1:
            terms["collective_calls"] = m.num_layers * 3.0  # gather forward and backward, reduce-scatter, per unit
        return terms

    def param_fetch_bytes(self, s: Any, passes: int) -> float:
        return 4.0 * s.model.total_params / s.n_gpus * 2  # FSDP2's fp32 shards, forward and backward

    def optimizer_shards(self, s: Any) -> int:
        return s.n_gpus

    def step_terms(self, s: Any, trainable: float, link: float) -> dict[str, float]:
        return {}

    def reference_terms(self, s: Any, link: float) -> dict[str, float]:
        return {}

    def unmeasured(self, s: Any) -> list[str]:
        return ["LoRA under FSDP"] if s.lora_rank else []


ZERO = ZeroSharding()
FSDP = FsdpSharding()
SHARDINGS: tuple[Sharding, ...] = (ZERO, FSDP)


def sharding_named(name: str) -> Sharding:
    """The strategy a stored name ("zero", "fsdp": plan.json, benchmark rows) stands for."""
    for sharding in SHARDINGS:
        if sharding.key == name:
            return sharding
    raise HpcrlError(f"learner sharding {name!r} is not known; valid: {', '.join(k.key for k in SHARDINGS)}")


def from_plan(learner: Mapping[str, Any]) -> Sharding:
    """The strategy of a plan-memory learner JSON (plan.json's memory.learner): its "sharding" names it, and a
    learner without one (every ZeRO plan, and those written before FSDP was planned) is ZeRO."""
    return sharding_named(learner.get("sharding", ZERO.key))


def flag_owner(flag: str) -> Sharding | None:
    """The learner whose own plan-memory flag this is (None: a flag every learner may take)."""
    return next((k for k in SHARDINGS if flag in k.flags), None)


def margin_bytes(logprob_impl: str, peak_reserved: float) -> float:
    """The DeepSpeed rows' allocator margin for a log-prob path ("compiled" or "eager") at a peak reserve."""
    fraction, floor_gib = C.FUSED_HEAD_MARGIN if logprob_impl == "fused_head" else C.ALLOCATOR_MARGIN[logprob_impl]
    return max(floor_gib * C.GIB, fraction * peak_reserved)


def param_tensors(m: ModelSpec, lora_rank: int = 0, lora_targets: tuple[str, ...] = ALL_LINEAR) -> int:
    """Named parameter tensors (each trained one's gradient partitioned, each stepped): per layer the
    projections, biases, norms (and a MoE layer's router and fused expert weights, as transformers 5 stores
    them), plus embedding, final norm, lm_head."""
    per_layer = 4 + (3 if m.qkv_bias else 0) + 2 + (2 if m.qk_norm != "none" else 0)
    per_layer += 3  # gate, up, down; or a MoE layer's router, fused gate_up and down
    if lora_rank:
        per_layer += 2 * len(lora_targets)  # lora_A and lora_B
    return m.num_layers * per_layer + 2 + (0 if m.tie_word_embeddings else 1)


def fetched_tensors(
    m: ModelSpec,
    lora_rank: int = 0,
    lora_targets: tuple[str, ...] = ALL_LINEAR,
    persistence: int = PERSISTENCE_THRESHOLD,
) -> int:
    """Parameter tensors ZeRO-3 partitions and so gathers and releases in each pass: those above the
    persistence threshold (DeepSpeed keeps smaller ones whole on every rank, never fetched)."""
    h, shapes = m.hidden_size, m.linear_shapes()
    sizes = [i * o for name, (i, o) in shapes.items() if not (m.is_moe and name in MLP_MODULES)]
    if m.is_moe:  # transformers 5's fused experts and the router
        f = m.moe_intermediate_size
        sizes += [m.num_experts * 2 * f * h, m.num_experts * f * h, m.num_experts * h]
    if lora_rank:
        sizes += [lora_rank * n for name in lora_targets for n in shapes[name]]
    per_layer = sum(1 for n in sizes if n > persistence)  # biases and norms are far below it
    big = m.vocab_size * h > persistence
    return m.num_layers * per_layer + (1 + (0 if m.tie_word_embeddings else 1) if big else 0)


__all__ = [
    "FSDP",
    "SHARDINGS",
    "ZERO",
    "FsdpSharding",
    "Sharding",
    "ZeroSharding",
    "fetched_tensors",
    "flag_owner",
    "from_plan",
    "margin_bytes",
    "param_tensors",
    "sharding_named",
]
