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
* reserved (expandable segments): a sum over CUDA streams, each stream's own high-water (stream_reserved:
  FSDP's side streams counted from the unit sizes, the default stream's largest live moment plus a fitted
  cache; benchmarks/results/fsdp_streams.jsonl). The verdict uses the smaller of that sum and the update's
  largest live moment plus the default stream's cache: where the card is smaller, the allocator gives
  cached blocks back and retries (derived; the 7B FSDP1 rows on 80 GB H100s ran so).

At 0.9.1 (the release's wheel; checked with verl's own engine, benchmarks/results/verl_release_engine.jsonl):
* gradients reduce-scatter after every micro-batch unless fsdp_config.use_no_sync_for_gradient_accumulation is
  true (default false, engine/fsdp.yaml:61); with it, no_sync as at 1dda039b (measured: +1.44 GiB = 2P - 4P/N).
* at temperature 1 the divide is skipped (transformer_impl.py:98-103): the cross-entropy's in-place backward
  writes into the logits it keeps, 2 bytes per logits element (derived).
* FSDP1 holds a tied embedding/lm_head weight once (measured after init: 4P/N).

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
    temperature_divide: Literal["in_place", "out_of_place", "none"] = "in_place"
    grad_sync: Literal["every_micro_batch", "last_micro_batch"] = "every_micro_batch"
    lm_head_own_unit_fsdp2: bool = False  # an untied lm_head wrapped as its own FSDP2 unit
    grad_sync_why: str = ""  # where the version's gradient sync was read (and the key that switches it)
    tied_once: bool = False  # FSDP1 flat parameters hold a tied embedding/lm_head once (0.9.1's engine: measured)


# Bytes per T x V logits element the log-prob path holds at the start of backward, by temperature divide.
LOGPROB_BYTES = {
    "in_place": 8.0,  # measured (b178a3cd: the divide on a squeezed view keeps extra buffers; issue 24 item 4)
    "out_of_place": 4.0,  # derived: divided logits kept by the cross-entropy + the divide's gradient; measured 4.00
    # derived: no divide (0.9.1 at temperature 1): the cross-entropy's in-place backward writes its gradient into
    # the logits it keeps (benchmarks/results/verl_release_engine.jsonl, verl 0.9.1's own engine)
    "none": 2.0,
}

# Fitted by benchmarks/fit_fsdp.py on the training rows of benchmarks/results/fsdp_measured.jsonl
# (held-out error printed there). Bytes unless named GiB.
CHECKPOINT_BYTES_PER_TOKEN_HIDDEN = 2.0  # one bf16 hidden state per layer (use_reentrant=False)
FIT = {
    "logits_fixed_gib": 0.065,  # fitted
    "logits_per_token_hidden": 8.3,  # fitted: bytes per token per hidden unit besides checkpoints
    "grads_done_fixed_gib": 0.152,  # fitted
    "step_fixed_gib": 0.065,  # fitted
    # Reserved memory is a sum over CUDA streams (stream_reserved). What the default stream caches above
    # its own largest live moment: a fixed part, and under FSDP2 a multiple of the root unit's fp32
    # gradient (its reduce-scatter input is made on the default stream; none when LoRA freezes the root).
    "default_slack_gib_fsdp1": 0.06,  # fitted
    "default_slack_gib_fsdp2": 0.18,  # fitted
    "default_slack_per_root_grad_fsdp2": 0.45,  # fitted: multiples of the fp32 root-unit gradient bytes
    # The allocator margin a plan keeps free: the largest under-prediction of peak reserved (measured /
    # predicted - 1) of a training row left out of the fit, rounded up; the verdict's margin for verl.
    "margin_fraction": 0.14,  # fitted
}
# Decoder layers whose bf16 parameters FSDP1's unshard stream holds at once beside the root unit (forward
# prefetch, the recompute of a checkpointed layer and the backward prefetch): counted on the per-stream rows
# (benchmarks/results/fsdp_streams.jsonl: 5.80 GiB = 2 x the 7B root unit in bf16 + 4 x 0.435 GiB layers).
UNSHARD_LAYERS = 4


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
            raise HpcrlError(
                "CPUOffloadPolicy (offload params during the update) is FSDP2 only: give --fsdp-version 2 or no offload"
            )


@dataclass(frozen=True)
class FsdpBreakdown:
    """Bytes per GPU at each moment of the update; `peak_moment` names the largest."""

    moments: dict[str, dict[str, float]]
    peak_moment: str
    peak_bytes: float
    reserved_bytes: float
    streams: dict[str, float]  # each CUDA stream's reserved high-water; reserved_bytes is their sum
    # where the card is smaller than reserved_bytes the allocator gives cached blocks back and retries: the
    # update then needs its largest live moment plus the default stream's own cache (derived)
    floor_bytes: float

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


def layer_numel(setup: FsdpSetup) -> float:
    """Elements of one decoder layer (the model less its embedding and lm_head matrices, per layer)."""
    m = setup.model
    vh = m.vocab_size * m.hidden_size
    return max(0.0, (m.total_params - vh * (1 if m.tie_word_embeddings else 2)) / m.num_layers)


def flat_numel(setup: FsdpSetup) -> int:
    """Elements in the FSDP flat parameters (FSDP1 counts a tied embedding twice, except in verl 0.9.1's engine;
    measured both ways)."""
    m = setup.model
    tied_twice = m.tie_word_embeddings and setup.fsdp_version == 1 and not setup.update.tied_once
    return m.total_params + (m.vocab_size * m.hidden_size if tied_twice else 0)


def root_numel(setup: FsdpSetup) -> int:
    """Elements of the root unit: FSDP1 flattens embedding and lm_head there; FSDP2 wraps an
    untied embedding on its own (fsdp_utils.py:523-524), leaving one V x h matrix in the root."""
    vh = setup.model.vocab_size * setup.model.hidden_size
    tied_once = setup.update.tied_once and setup.model.tie_word_embeddings
    return 2 * vh if setup.fsdp_version == 1 and not tied_once else vh


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
    return (
        f"unsharded {dtype} gradients of earlier micro-batches{of} (no_sync)",
        size * whole if setup.micro_batches > 1 else 0.0,
    )


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
        f"log-prob path ({logprob_bytes:g} B x T x V{', derived' if setup.update.temperature_divide == 'none' else ''})": logprob_bytes
        * T
        * V,
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
    peak_moment = max(totals, key=lambda k: totals[k])
    streams = stream_reserved(setup, moments)
    floor = totals[peak_moment] + default_cache(setup)
    return FsdpBreakdown(
        moments=moments,
        peak_moment=peak_moment,
        peak_bytes=totals[peak_moment],
        reserved_bytes=sum(streams.values()),
        streams=streams,
        floor_bytes=floor,
    )


def default_cache(setup: FsdpSetup) -> float:
    """What the default stream caches above its largest live moment (FIT, benchmarks/fit_fsdp.py): FSDP1 a
    fixed part; FSDP2 also a multiple of the root unit's fp32 gradient, made whole on that stream for the
    reduce-scatter (none when LoRA freezes the root; under CPUOffloadPolicy too)."""
    if setup.fsdp_version == 1:
        return FIT["default_slack_gib_fsdp1"] * GIB
    return FIT["default_slack_gib_fsdp2"] * GIB + FIT["default_slack_per_root_grad_fsdp2"] * root_grad_bytes(setup)


# Terms of the moments that live on FSDP's own CUDA streams, not the default one (by label prefix):
# FSDP1 gathers parameters on its unshard stream and makes gradient shards on its post-backward stream;
# FSDP2 makes gradient shards on its reduce-scatter stream, while its no_sync gradients and the root
# unit's backward stay on the default stream.
SIDE_STREAM_TERMS = {
    1: ("gathered root unit", "reference root unit", "gradients", "unsharded", "root unit params"),
    2: ("reference root unit", "gradients"),
}


def stream_reserved(setup: FsdpSetup, moments: dict[str, dict[str, float]]) -> dict[str, float]:
    """Reserved bytes per CUDA stream. PyTorch's caching allocator keeps a pool per stream and a block
    freed on one is not reused by another, so reserved memory is the sum of each stream's high-water,
    reached at different moments (benchmarks/results/fsdp_streams.jsonl records them by stream name;
    torch 2.11, expandable segments). Each side stream's high-water is counted from what FSDP places
    there (measured on those rows, derived from the unit sizes); the default stream's is its largest
    live moment plus a fitted cache."""
    m, n, v = setup.model, setup.n_gpus, setup.fsdp_version
    on_gpu = setup.offload != "cpu_policy"
    trained = setup.adapter_params or flat_numel(setup)
    grads = 4.0 * trained / n if on_gpu else 0.0
    root_trained = not setup.adapter_params
    reduces = setup.micro_batches if setup.update.grad_sync == "every_micro_batch" else 1
    no_sync_grads = setup.update.grad_sync == "last_micro_batch" and setup.micro_batches > 1
    layer = layer_numel(setup)
    side = SIDE_STREAM_TERMS[v]
    default_live = max(sum(b for k, b in terms.items() if not k.startswith(side)) for terms in moments.values())
    out = {"default": default_live + default_cache(setup)}
    if v == 1:
        root = root_numel(setup)
        # post-backward: the gradient shards; with N > 1 also the fp32 copy of the root unit and of a layer
        # made whole for the reduce-scatter, and one more root shard when several reduces accumulate.
        reduce = (
            (4.0 * root + 4.0 * layer + (4.0 * root / n if reduces > 1 else 0.0)) if n > 1 and root_trained else 0.0
        )
        out["post_backward"] = grads + reduce
        # unshard: the gathered bf16 root unit (N > 1) and layers, and the unsharded bf16 gradients:
        # under no_sync every earlier micro-batch's, else the root unit's while it is reduced.
        held_grads = 2.0 * trained if no_sync_grads else (2.0 * root if root_trained else 0.0)
        out["unshard"] = (2.0 * root if n > 1 else 0.0) + held_grads + 2.0 * UNSHARD_LAYERS * layer
        # pre-unshard: the bf16 cast of the largest shard (N = 1: FSDP1 runs NO_SHARD, the whole bf16 copy).
        out["pre_unshard"] = 2.0 * (root / n if n > 1 else flat_numel(setup))
        if separate_reference(setup):  # its own FSDP root, own streams; CPU-offloaded parameters
            out["reference unshard"] = (2.0 * root + 4.0 * layer) if n > 1 else 0.0
            out["reference pre_unshard"] = 6.0 * root / n  # fp32 copied in + its bf16 cast
    else:
        vh = m.vocab_size * m.hidden_size
        if on_gpu:
            out["reduce_scatter"] = grads + (4.0 * vh / n if reduces > 1 and root_trained else 0.0)
        else:  # CPUOffloadPolicy: shards go to the host; one root-unit shard at a time here
            out["reduce_scatter"] = 4.0 * vh / n
        if n > 1:  # all-gather output and input (CPUOffloadPolicy: the fp32 shard copied in too)
            gathered = 2.0 * vh * (1 if m.tie_word_embeddings else 2)
            out["all_gather"] = gathered + (6.0 if not on_gpu else 2.0) * vh / n
        if separate_reference(setup):
            out["reference all_gather"] = 2.0 * vh + 6.0 * vh / n
    return out


def setup_from(s: Any) -> FsdpSetup:
    """The FSDP update a planner's LearnerSetup describes (sharding FSDP; hpcrl.memory.learner imports
    hpcrl.memory.sharding, which imports this module, so the setup is read by attribute)."""
    if s.load_in_4bit:
        raise HpcrlError(
            "4-bit base weights under FSDP: the framework does not load them (capabilities.json load_in_4bit); "
            "remove --load-in-4bit"
        )
    if not s.gradient_checkpointing:
        raise HpcrlError("gradient checkpointing off under FSDP: hpcrl's FSDP model was measured with it on only")
    if s.offload == "optimizer":
        raise HpcrlError(
            "optimizer-only offload during the update: FSDP has none (param/optimizer offload between "
            "phases leaves the update's peak as it is); FSDP2's CPUOffloadPolicy is offload params"
        )
    offload: FsdpOffload = "cpu_policy" if s.offload == "params" else "none"
    adapters = s.model.lora_params(s.lora_rank, s.lora_targets) if s.lora_rank else 0
    return FsdpSetup(
        s.model,
        s.n_gpus,
        s.tokens_per_gpu,
        s.micro_batches,
        s.fsdp_version,  # type: ignore[arg-type]
        s.reference_policy,
        offload,
        adapters,
        s.fsdp_update or VerlUpdate(),
    )


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
        reserved_floor=b.floor_bytes,
        non_torch=non_torch_bytes(f.n_gpus),
        trainable_params=f.adapter_params or f.model.total_params,
        # CPUOffloadPolicy: fp32 shards, gradients and Adam moments in host memory.
        host_offload_bytes=(4.0 * flat + 16.0 * (f.adapter_params / f.n_gpus if f.adapter_params else flat))
        if f.offload == "cpu_policy"
        else 0.0,
        # The reference policy's fp32 shards, CPU-offloaded by verl's worker (fsdp_workers.py:526). Derived.
        reference_host_bytes=4.0 * flat if separate_reference(f) else 0.0,
    )


def fsdp_margin(peak_reserved: float) -> float:
    """Bytes kept free for the allocator: FIT's margin fraction, from the FSDP rows."""
    return FIT["margin_fraction"] * peak_reserved
