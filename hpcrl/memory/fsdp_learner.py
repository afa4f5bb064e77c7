"""Per-GPU memory of verl's FSDP actor update (pure arithmetic), as verl b178a3cd runs it, and where
verl 1dda039b (0.10.0.dev, the engine workers) differs (`VerlUpdate`, read from each version's
capabilities fsdp.update facts by hpcrl/planning/backends/verl_memory.py).

Terms are read from verl's code (verl/workers/fsdp_workers.py, verl/workers/actor/dp_actor.py,
verl/utils/fsdp_utils.py, verl/workers/config/optimizer.py at b178a3cd) and checked on the rows in
benchmarks/results/fsdp_measured.jsonl (benchmarks/fsdp_memory.py, H100). Per rank, with P the
parameters, N the ranks, T the packed tokens of one micro-batch, V the vocabulary, h the hidden size:

* fp32 flat shards 4P/N (the actor is built fp32: fsdp_workers.py:324-326). FSDP1 with
  use_orig_params false flattens a tied embedding/lm_head weight twice (measured: after-init
  memory is 4(P + Vh)/N for the tied Qwen2.5 models, 4P/N for FSDP2 and for the untied 7B).
* Adam moments 8P/N and fp32 gradients 4P/N (reduce_dtype fp32: fsdp_workers.py:496).
  With one micro-batch, zero_grad (dp_actor.py:560, set_to_none) has freed the gradients before
  the backward that holds the logits; with several, the first micro-batch's gradients are alive.
* optimizer step: torch's default (foreach) AdamW (optimizer.py:146-200) holds one more fp32
  temporary of the shard: 20P/N in all.
* log-prob path: the in-place temperature divide and the in-place cross-entropy
  (dp_actor.py:258-269) hold ~8 bytes per T x V logits element at the start of backward.
* the gathered root unit (embedding, lm_head, norm: not wrapped per layer, fsdp_utils.py:95-133):
  FSDP1 keeps it unsharded in bf16 after forward when N > 1; its bf16 gradient and the fp32 copy
  for the reduce-scatter make 8 bytes per root element when backward ends.
* reference policy (CPU param offload, fsdp_workers.py:526): nothing on the update peak, except
  FSDP1 at N > 1 where its gathered root unit (bf16) stays on the GPU through the update
  (measured: +2 B x root elements at the 7B step and at the 3B logits moment).
* verl's param/optimizer offload (fsdp_workers.py:893-932) moves state only between updates: the
  update peak is unchanged. FSDP2's CPUOffloadPolicy keeps shards, gradients and Adam on the host.
* LoRA (fsdp_workers.py:442-471): peft adapters on the fp32 model are fp32; the frozen base keeps its
  fp32 shards, only the adapters get gradients, Adam state and the foreach temporary (checked on the
  held-out rows of benchmarks/results/fsdp_heldout2.jsonl: peak allocated within 0.4%).
* reserved (expandable segments): the basis plus cached blocks, a fixed part and a multiple of the root
  unit's fp32 gradient (the largest gradient blocks); none of the latter when LoRA freezes the root.

At 1dda039b (transformer_impl.py, fsdp_utils.py at that commit; checked on the held-out rows of
benchmarks/results/fsdp_current_verl.jsonl):
* the temperature divide makes a new tensor (transformer_impl.py:1357): the cross-entropy keeps the
  divided logits and the divide's backward makes one more T x V gradient: 4 bytes per logits element
  (derived; measured 4.00 on every one-micro-batch row against 8 at b178a3cd).
* gradients are reduced on the last micro-batch only (no_sync, transformer_impl.py:672-698, 725-730): the
  earlier micro-batches leave them unsharded, FSDP1 in the bf16 param dtype (its post-backward hook
  returns before the fp32 cast under no_sync), FSDP2 upcast to fp32 (reduce_dtype), CPUOffloadPolicy
  or not: 2 B x flat elements (FSDP1) or 4 B x P (FSDP2) per GPU, not 4 B x P/N.
* FSDP2 wraps an untied lm_head as its own unit (fsdp_utils.py:549-570): its gathered bf16 weight is
  freed after its backward instead of staying with the root.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from hpcrl.errors import HpcrlError
from hpcrl.memory.constants import GIB
from hpcrl.memory.learner_result import LearnerMemory, non_torch_bytes
from hpcrl.models.spec import ModelSpec

FsdpOffload = Literal["none", "param_optimizer", "cpu_policy"]


@dataclass(frozen=True)
class VerlUpdate:
    """What a verl version's actor update does that moves memory (each version's capabilities fsdp.update);
    the defaults are b178a3cd's, on which FIT was fitted."""

    version: str = "0.8.0.dev"
    temperature_divide: Literal["in_place", "out_of_place"] = "in_place"
    grad_sync: Literal["every_micro_batch", "last_micro_batch"] = "every_micro_batch"
    lm_head_own_unit_fsdp2: bool = False  # an untied lm_head wrapped as its own FSDP2 unit


# Bytes per T x V logits element the log-prob path holds at the start of backward, by temperature divide.
LOGPROB_BYTES = {
    "in_place": 8.0,  # measured (b178a3cd: the divide on a squeezed view keeps extra buffers; issue 24 item 4)
    "out_of_place": 4.0,  # derived: divided logits kept by the cross-entropy + the divide's gradient; measured 4.00
}

# Fitted by benchmarks/fit_fsdp.py on the training rows of benchmarks/results/fsdp_measured.jsonl
# (held-out error printed there). Bytes unless named GiB.
CHECKPOINT_BYTES_PER_TOKEN_HIDDEN = 2.0  # one bf16 hidden state per layer (use_reentrant=False)
FIT = {
    "logits_fixed_gib": 0.065,  # fitted
    "logits_per_token_hidden": 8.3,  # fitted: bytes per token per hidden unit besides checkpoints
    "grads_done_fixed_gib": 0.152,  # fitted
    "step_fixed_gib": 0.065,  # fitted
    # Cache the allocator keeps beyond the basis (expandable segments, as verl runs): a fixed part plus a
    # multiple of the root unit's fp32 gradient (embedding / lm_head: the largest gradient blocks, made
    # whole before the reduce and cached; none when the root is frozen under LoRA).
    "reserved_fixed_gib_fsdp1": 1.56,  # fitted
    "reserved_per_root_grad_fsdp1": 1.35,  # fitted: multiples of the root unit's fp32 gradient bytes
    "reserved_fixed_gib_fsdp2": 0.52,  # fitted
    "reserved_per_root_grad_fsdp2": 1.03,  # fitted
    # The allocator margin a plan keeps free: the largest under-prediction of peak reserved (measured /
    # predicted - 1) of a training row left out of the reserved fit, rounded up; the verdict's margin for verl.
    "margin_fraction": 0.09,  # fitted
}


@dataclass(frozen=True)
class FsdpSetup:
    """What decides an FSDP actor-update GPU's memory under verl."""

    model: ModelSpec
    n_gpus: int = 1
    tokens_per_gpu: int = 8192  # packed tokens of one micro-batch
    micro_batches: int = 2
    fsdp_version: Literal[1, 2] = 1
    reference_policy: bool = False
    offload: FsdpOffload = "none"
    # LoRA adapters' parameters (0: full fine-tuning): the frozen base keeps its fp32 shards, only the
    # adapters get gradients and Adam state (measured: fsdp_heldout2.jsonl, rank 32, FSDP1 and FSDP2).
    adapter_params: int = 0
    update: VerlUpdate = VerlUpdate()

    def check(self) -> None:
        if self.n_gpus < 1:
            raise HpcrlError(f"learner GPUs must be at least 1, got {self.n_gpus}")
        if self.tokens_per_gpu < 1:
            raise HpcrlError(f"tokens per GPU must be positive, got {self.tokens_per_gpu}")
        if self.micro_batches < 1:
            raise HpcrlError(f"--micro-batches must be at least 1, got {self.micro_batches}")
        if self.fsdp_version not in (1, 2):
            raise HpcrlError(f"--fsdp-version {self.fsdp_version} is not known; valid: 1, 2")
        if self.offload not in ("none", "param_optimizer", "cpu_policy"):
            raise HpcrlError(f"FSDP offload {self.offload!r} is not known; valid: none, param_optimizer, cpu_policy")
        if self.offload == "cpu_policy" and self.fsdp_version != 2:
            raise HpcrlError("CPUOffloadPolicy (offload params during the update) is FSDP2 only: give --fsdp-version 2 or no offload")


@dataclass(frozen=True)
class FsdpBreakdown:
    """Bytes per GPU at each moment of the update; `peak_moment` names the largest."""

    moments: dict[str, dict[str, float]]
    peak_moment: str
    peak_bytes: float
    reserved_bytes: float

    @property
    def peak_gib(self) -> float:
        return self.peak_bytes / GIB

    @property
    def reserved_gib(self) -> float:
        return self.reserved_bytes / GIB


def separate_reference(setup: FsdpSetup) -> bool:
    """A reference policy of its own: under LoRA verl's reference is the actor with its adapter disabled
    (ref_in_actor: verl/trainer/ppo/ray_trainer.py:298-302 at b178a3cd, ppo/v1/trainer_base.py:316-322 and
    workers/engine_workers.py:424 at 1dda039b), so no second module, root unit or host copy. Derived (no
    row measures LoRA with a reference)."""
    return setup.reference_policy and not setup.adapter_params


def flat_numel(setup: FsdpSetup) -> int:
    """Elements in the FSDP flat parameters (FSDP1 counts a tied embedding twice; measured)."""
    m = setup.model
    tied_twice = m.tie_word_embeddings and setup.fsdp_version == 1
    return m.total_params + (m.vocab_size * m.hidden_size if tied_twice else 0)


def root_numel(setup: FsdpSetup) -> int:
    """Elements of the root unit: FSDP1 flattens embedding and lm_head there; FSDP2 wraps an
    untied embedding on its own (fsdp_utils.py:523-524), leaving one V x h matrix in the root."""
    vh = setup.model.vocab_size * setup.model.hidden_size
    return 2 * vh if setup.fsdp_version == 1 else vh


def root_grad_bytes(setup: FsdpSetup) -> float:
    """fp32 gradient bytes of the whole root unit (before its reduce-scatter); 0 when LoRA freezes it."""
    return 0.0 if setup.adapter_params else 4.0 * root_numel(setup)


def earlier_grads(setup: FsdpSetup, sharded: float) -> tuple[str, float]:
    """(label, bytes) of the gradients the earlier micro-batches leave at the last one's logits moment:
    none with one micro-batch; the fp32 shards (`sharded`) when each micro-batch reduces; under no_sync
    unsharded, FSDP1 bf16 over its flat elements, FSDP2 fp32 over P, even under CPUOffloadPolicy."""
    of = " of LoRA adapters" if setup.adapter_params else ""
    if setup.update.grad_sync == "every_micro_batch":
        return f"gradients of earlier micro-batches{of}", sharded if setup.micro_batches > 1 else 0.0
    whole = setup.adapter_params or flat_numel(setup)
    dtype, size = ("bf16", 2.0) if setup.fsdp_version == 1 else ("fp32", 4.0)
    return (f"unsharded {dtype} gradients of earlier micro-batches{of} (no_sync)",
            size * whole if setup.micro_batches > 1 else 0.0)


def fsdp_learner_memory(setup: FsdpSetup) -> FsdpBreakdown:
    """Per-GPU bytes at the logits, end-of-backward and optimizer-step moments of one update."""
    setup.check()
    m, n = setup.model, setup.n_gpus
    flat = flat_numel(setup) / n
    trained = setup.adapter_params / n if setup.adapter_params else flat
    on_gpu = setup.offload != "cpu_policy"
    shards = 4.0 * flat + (4.0 * trained if setup.adapter_params else 0.0) if on_gpu else 0.0
    adam = 8.0 * trained if on_gpu else 0.0
    grads = 4.0 * trained if on_gpu else 0.0
    of = " of LoRA adapters" if setup.adapter_params else ""
    T, V, h, L = setup.tokens_per_gpu, m.vocab_size, m.hidden_size, m.num_layers
    root = root_numel(setup)
    gathered_root = 2.0 * root if (setup.fsdp_version == 1 and n > 1) else 0.0
    ref_root = gathered_root if separate_reference(setup) else 0.0
    earlier_label, earlier = earlier_grads(setup, grads)
    logprob_bytes = LOGPROB_BYTES[setup.update.temperature_divide]
    # An untied lm_head in its own FSDP2 unit (1dda039b) reshards after its backward: 2 B x V x h fewer.
    own_lm_head = setup.fsdp_version == 2 and setup.update.lm_head_own_unit_fsdp2 and not m.tie_word_embeddings
    root_after_backward = (6.0 if own_lm_head else 8.0) if n > 1 else 4.0
    logits = {
        "fp32 parameter shards": shards,
        f"Adam moments (fp32){of}": adam,
        earlier_label: earlier,
        f"log-prob path ({logprob_bytes:g} B x T x V)": logprob_bytes * T * V,
        "checkpointed hidden states": CHECKPOINT_BYTES_PER_TOKEN_HIDDEN * L * T * h,
        "gathered root unit (bf16)": gathered_root,
        "reference root unit (bf16)": ref_root,
        "per-token working set (fitted)": FIT["logits_per_token_hidden"] * T * h,
        "fixed (fitted)": FIT["logits_fixed_gib"] * GIB,
    }
    grads_done = {
        "fp32 parameter shards": shards,
        f"Adam moments (fp32){of}": adam,
        f"gradients{of}": grads,
        "root unit params, grads and fp32 reduce copy": root_after_backward * root,
        "reference root unit (bf16)": ref_root,
        "fixed (fitted)": FIT["grads_done_fixed_gib"] * GIB,
    }
    step = {
        "fp32 parameter shards": shards,
        f"Adam moments (fp32){of}": adam,
        f"gradients{of}": grads,
        f"foreach AdamW temporary{of}": 4.0 * trained if on_gpu else 0.0,
        "reference root unit (bf16)": ref_root,
        "fixed (fitted)": FIT["step_fixed_gib"] * GIB,
    }
    moments = {"logits": logits, "backward end": grads_done, "optimizer step": step}
    totals = {k: sum(v.values()) for k, v in moments.items()}
    peak_moment = max(totals, key=totals.get)
    peak = totals[peak_moment]
    # One micro-batch: zero_grad freed the gradients, so backward allocates them after the log-prob blocks
    # were cached, and the cache holds both (measured: reserved tracks the logits moment plus the
    # gradients, FSDP1 and FSDP2 alike). Under no_sync (1dda039b) the sharded gradients are first made in
    # the last backward too, whatever the micro-batch count (derived from the same mechanism; checked on
    # fsdp_current_verl.jsonl).
    late = setup.micro_batches == 1 or setup.update.grad_sync == "last_micro_batch"
    late_grads = grads if late else 0.0
    basis = max(peak, totals["logits"] + late_grads)
    v = setup.fsdp_version
    reserved = basis + FIT[f"reserved_fixed_gib_fsdp{v}"] * GIB + FIT[f"reserved_per_root_grad_fsdp{v}"] * root_grad_bytes(setup)
    return FsdpBreakdown(moments=moments, peak_moment=peak_moment, peak_bytes=peak, reserved_bytes=reserved)


def setup_from(s: Any) -> FsdpSetup:
    """The FSDP update a planner's LearnerSetup describes (sharding "fsdp"; hpcrl.memory.learner imports
    this module, so the setup is read by attribute)."""
    if s.load_in_4bit:
        raise HpcrlError("4-bit base weights under FSDP: the framework does not load them (capabilities.json load_in_4bit); "
                         "remove --load-in-4bit")
    if not s.gradient_checkpointing:
        raise HpcrlError("gradient checkpointing off under FSDP: hpcrl's FSDP model was measured with it on only")
    if s.offload == "optimizer":
        raise HpcrlError("optimizer-only offload during the update: FSDP has none (param/optimizer offload between "
                         "phases leaves the update's peak as it is); FSDP2's CPUOffloadPolicy is offload params")
    offload: FsdpOffload = "cpu_policy" if s.offload == "params" else "none"
    adapters = s.model.lora_params(s.lora_rank, s.lora_targets) if s.lora_rank else 0
    return FsdpSetup(s.model, s.n_gpus, s.tokens_per_gpu, s.micro_batches, s.fsdp_version,  # type: ignore[arg-type]
                     s.reference_policy, offload, adapters, s.fsdp_update or VerlUpdate())


def fsdp_as_learner_memory(s: Any) -> LearnerMemory:
    """The FSDP update's peak in the planners' LearnerMemory shape (terms of the peak moment)."""
    f = setup_from(s)
    b = fsdp_learner_memory(f)
    flat = flat_numel(f) / f.n_gpus
    return LearnerMemory(
        terms={k: v for k, v in b.moments[b.peak_moment].items() if v},
        phase=b.peak_moment,
        phases={k: sum(v.values()) for k, v in b.moments.items()},
        peak_allocated=b.peak_bytes,
        peak_reserved=b.reserved_bytes,
        non_torch=non_torch_bytes(f.n_gpus),
        trainable_params=f.adapter_params or f.model.total_params,
        # CPUOffloadPolicy: fp32 shards, gradients and Adam moments in host memory.
        host_offload_bytes=(4.0 * flat + 16.0 * (f.adapter_params / f.n_gpus if f.adapter_params else flat))
        if f.offload == "cpu_policy" else 0.0,
        # The reference policy's fp32 shards, CPU-offloaded by verl's worker (fsdp_workers.py:526). Derived.
        reference_host_bytes=4.0 * flat if separate_reference(f) else 0.0,
    )


def fsdp_margin(peak_reserved: float) -> float:
    """Bytes kept free for the allocator: FIT's margin fraction, from the FSDP rows."""
    return FIT["margin_fraction"] * peak_reserved
