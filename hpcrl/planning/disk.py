"""Disk plan: bytes of the checkpoints a run writes, how many exist at peak, against a quota.

Two kinds of checkpoint come out of open-instruct's grpo_fast.py (read at upstream commit
e6c3044aa6201c8bfa4573c1b03142af599e730d; the legacy single-`Args` layout at 1611e3df does
the same):

* **DeepSpeed state** (`checkpoint_state_dir/global_stepN/`, every `checkpoint_state_freq`
  training steps, only when `checkpoint_state_dir` is set): `engine.save_checkpoint`, which
  writes per rank `zero_pp_rank_R_mp_rank_00_model_states.pt` and
  `bf16_zero_pp_rank_R_mp_rank_00_optim_states.pt`, then the `latest` file. Afterwards rank 0
  calls `clean_last_n_checkpoints_deepspeed(dir, keep_last_n_checkpoints)`, which deletes all
  but the newest `keep_last_n_checkpoints` global_step directories (a negative value keeps
  all). So `keep + 1` exist at the moment the new one is complete and the cleanup has not yet
  run; with `keep = 0` the new checkpoint is deleted as soon as it is written.
* **Hugging Face saves** (`{output_dir}_checkpoints/step_N/`, every `save_freq` steps from
  step 2 on, plus the final save into `output_dir`): full bf16 weights gathered on rank 0, or
  the LoRA adapter. grpo_fast never deletes these: `keep_last_n_checkpoints` does not apply
  to them (only finetune.py/dpo prune `step_*` folders).

What a ZeRO-3 state checkpoint holds (DeepSpeed `engine._save_checkpoint` and
`stage3._rigid_state_dict`, read at deepspeedai/DeepSpeed edaa7221): per rank, its partition
of the fp32 master weights (4 B/param) and of both Adam moments (8 B/param), so 12 bytes per
trainable parameter in total, split over the ranks; the module state dict holds only
placeholders of partitioned bf16 weights (ZeRO-3 frees `param.data` to an empty tensor), plus
whole copies of the small "persistent" parameters (norms, biases) on every rank; frozen
parameters (the LoRA base) are saved as each rank's bf16 partition (`frozen_param_fragments`).
ZeRO-1/2 do not partition the weights, so rank 0's model_states file also carries the full
bf16 module (2 B/param): 14 B/param. Gradients are never saved, so the gradient dtype does
not change the size. These are readings of the source, not measurements.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from hpcrl.errors import HpcrlError
from hpcrl.models import ModelSpec, resolve_model
from hpcrl.models.spec import ATTN_MODULES

GIB = 1024**3
GB = 1000**3

# Per rank file pair: pickled metadata (param_shapes, ds_config), open-instruct's client state
# (RNG states of every device, dataloader and data-prep actor state). An assumption, small.
RANK_OVERHEAD_BYTES = 4 * 1024**2
# Per HF save: config.json, generation_config.json, tokenizer files (tokenizer.json of these
# models is 4-12 MB), the safetensors index. An assumption, small.
HF_OVERHEAD_BYTES = 20 * 1024**2
# DeepSpeed's parameters below this many elements stay whole on every rank (its default
# stage3_param_persistence_threshold).
PERSISTENCE_THRESHOLD = 100_000


@dataclass(frozen=True)
class DiskSetup:
    """The settings that decide a run's checkpoint bytes."""

    model: ModelSpec
    zero_stage: int = 3
    n_learners: int = 8
    lora_rank: int = 0
    save_freq: int = 200
    checkpoint_state_freq: int = 200
    keep_last_n_checkpoints: int = 3
    total_steps: int = 1000
    quota_bytes: float | None = None
    grad_accum_dtype: str = "fp32"  # accepted for symmetry with the memory plan; not saved

    def check(self) -> None:
        check_settings(
            self.zero_stage,
            self.n_learners,
            self.lora_rank,
            self.total_steps,
            self.keep_last_n_checkpoints,
            self.quota_bytes,
        )


MAX_STEPS = 10**12  # far more than any run takes (a step is seconds at the least); the fix searches bisect


def check_settings(
    zero_stage: int, learners: int, lora_rank: int, total_steps: int | None, keep: int | None, quota_bytes: float | None
) -> None:
    """HpcrlError for a setting no run can have (a None step count or keep: unknown, or all)."""
    if zero_stage not in (0, 1, 2, 3):
        raise HpcrlError(f"ZeRO stage {zero_stage} is not known; valid: 0, 1, 2, 3")
    if learners < 1:
        raise HpcrlError(f"learners must be at least 1, got {learners}")
    if lora_rank < 0:
        raise HpcrlError(f"LoRA rank must be 0 (off) or positive, got {lora_rank}")
    if total_steps is not None and not 1 <= total_steps <= MAX_STEPS:
        raise HpcrlError(
            f"a run of {total_steps:,} training steps: valid: 1 to {MAX_STEPS:,} (check the run's step "
            "count and batch sizes)"
        )
    if keep is not None and keep < -1:
        raise HpcrlError(f"--keep-last-n-checkpoints {keep}: valid: -1 (keep all), 0 or more")
    if quota_bytes is not None and quota_bytes <= 0:
        raise HpcrlError(f"quota must be positive, got {quota_bytes / GIB:g} GiB")


@dataclass(frozen=True)
class DiskPlan:
    setup: DiskSetup
    trainable_params: int
    state_terms: dict[str, float]
    state_per_rank_bytes: float
    hf_kind: str
    hf_bytes: float
    n_state_saves: int
    n_hf_saves: int
    state_at_peak: int
    hf_at_peak: int
    notes: list[str] = field(default_factory=list)

    @property
    def state_bytes(self) -> float:
        """One DeepSpeed state checkpoint, all ranks' files together."""
        return sum(self.state_terms.values())

    @property
    def peak_bytes(self) -> float:
        """All HF saves (never pruned) plus the state checkpoints alive at once."""
        return self.state_at_peak * self.state_bytes + self.hf_at_peak * self.hf_bytes

    @property
    def fits(self) -> bool | None:
        q = self.setup.quota_bytes
        return None if q is None else self.peak_bytes <= q

    def verdict(self) -> str:
        peak = f"{self.peak_bytes / GIB:,.0f} GiB ({self.peak_bytes / GB:,.0f} GB) at peak"
        if self.fits is None:
            return f"{peak}; no quota known for the run directory (give --quota-gib)"
        q = self.setup.quota_bytes or 0.0
        if self.fits:
            return f"fits: {peak} of the {q / GIB:,.0f} GiB quota"
        fixes = "; ".join(s.text for s in suggest(self)) or "no single setting fits; raise the quota"
        return f"does NOT fit: {peak}, over the {q / GIB:,.0f} GiB quota. Would fit: {fixes}"

    def to_dict(self) -> dict[str, Any]:
        """The stable --json schema of `hpcrl plan-disk`."""
        s = self.setup
        return {
            "model": {
                "name": s.model.name,
                "total_params": s.model.total_params,
                "trainable_params": self.trainable_params,
                "lora_rank": s.lora_rank,
            },
            "settings": {
                "zero_stage": s.zero_stage,
                "learners": s.n_learners,
                "save_freq": s.save_freq,
                "checkpoint_state_freq": s.checkpoint_state_freq,
                "keep_last_n_checkpoints": s.keep_last_n_checkpoints,
                "total_steps": s.total_steps,
            },
            "state_checkpoint": {
                "bytes": round(self.state_bytes),
                "gib": round(self.state_bytes / GIB, 2),
                "per_rank_bytes": round(self.state_per_rank_bytes),
                "terms_gib": {k: round(v / GIB, 3) for k, v in self.state_terms.items()},
                "saves": self.n_state_saves,
                "at_peak": self.state_at_peak,
            },
            "hf_save": {
                "kind": self.hf_kind,
                "bytes": round(self.hf_bytes),
                "gib": round(self.hf_bytes / GIB, 2),
                "saves": self.n_hf_saves,
                "at_peak": self.hf_at_peak,
            },
            "peak_bytes": round(self.peak_bytes),
            "peak_gib": round(self.peak_bytes / GIB, 1),
            "quota_gib": None if s.quota_bytes is None else round(s.quota_bytes / GIB, 1),
            "fits": self.fits,
            "suggestions": [
                {"setting": x.setting, "value": x.value, "peak_gib": round(x.peak_bytes / GIB, 1)}
                for x in (suggest(self) if self.fits is False else [])
            ],
            "notes": self.notes,
            "verdict": self.verdict(),
        }


def persistent_params(m: ModelSpec) -> int:
    """Elements of the small tensors ZeRO-3 keeps whole on every rank (norms, biases, q/k norms).

    Each is a vector of at most a few thousand elements, under DeepSpeed's persistence
    threshold (PERSISTENCE_THRESHOLD) for every catalog model.
    """
    shapes = m.linear_shapes()
    matrices = sum(shapes[k][0] * shapes[k][1] for k in ATTN_MODULES)
    vectors_per_layer = m.attn_params_per_layer - matrices + 2 * m.hidden_size
    return m.num_layers * vectors_per_layer + m.hidden_size


def state_checkpoint_terms(s: DiskSetup, trainable: int) -> dict[str, float]:
    """Bytes of one DeepSpeed state checkpoint by what they hold, summed over all ranks."""
    m, n = s.model, s.n_learners
    lora = s.lora_rank > 0
    terms = {"fp32 master weights": 4.0 * trainable, "Adam moments (fp32)": 8.0 * trainable}
    if s.zero_stage == 3:
        if lora:
            terms["frozen base weights (bf16 partitions)"] = 2.0 * m.total_params
        terms["persistent small params (bf16, every rank)"] = 2.0 * persistent_params(m) * n
    else:
        # Rank 0's model_states carries the whole bf16 module; at stage 2 frozen weights are
        # saved a second time as whole `frozen_param_fragments`.
        terms["bf16 module weights (rank 0)"] = 2.0 * (m.total_params + (trainable if lora else 0))
        if lora and s.zero_stage == 2:
            terms["frozen base weights again (fragments)"] = 2.0 * m.total_params
    files = n if s.zero_stage in (1, 2, 3) else 1
    terms["per-rank metadata and client state"] = float(RANK_OVERHEAD_BYTES * files)
    return terms


def _hf_saves(save_freq: int, total_steps: int) -> int:
    """Step saves (training_step % save_freq == 0 and > 1) plus the final save."""
    if save_freq <= 0:
        return 1
    steps = total_steps // save_freq - (1 if save_freq == 1 else 0)
    return max(0, steps) + 1


def _state_counts(freq: int, keep: int, total_steps: int) -> tuple[int, int]:
    saves = total_steps // freq if freq > 0 else 0
    if saves == 0:
        return 0, 0
    return saves, saves if keep < 0 else min(saves, keep + 1)


def plan_disk(
    model: ModelSpec | str,
    *,
    zero_stage: int = 3,
    n_learners: int = 8,
    lora_rank: int = 0,
    save_freq: int = 200,
    checkpoint_state_freq: int = 200,
    keep_last_n_checkpoints: int = 3,
    total_steps: int = 1000,
    quota_bytes: float | None = None,
    grad_accum_dtype: str = "fp32",
) -> DiskPlan:
    """Checkpoint bytes of a run and whether they fit `quota_bytes` (None: unknown quota)."""
    spec = resolve_model(model) if isinstance(model, str) else model
    s = DiskSetup(
        spec,
        zero_stage,
        n_learners,
        lora_rank,
        save_freq,
        checkpoint_state_freq,
        keep_last_n_checkpoints,
        total_steps,
        quota_bytes,
        grad_accum_dtype,
    )
    return _plan(s)


def _plan(s: DiskSetup) -> DiskPlan:
    s.check()
    m = s.model
    trainable = m.lora_params(s.lora_rank) if s.lora_rank else m.total_params
    terms = state_checkpoint_terms(s, trainable)
    per_rank = sum(terms.values()) / (s.n_learners if s.zero_stage else 1)
    if s.lora_rank:
        hf_kind, hf = "LoRA adapter (bf16)", 2.0 * trainable + HF_OVERHEAD_BYTES
    else:
        hf_kind, hf = "full weights (bf16 safetensors)", 2.0 * m.total_params + HF_OVERHEAD_BYTES
    n_state, state_peak = _state_counts(s.checkpoint_state_freq, s.keep_last_n_checkpoints, s.total_steps)
    n_hf = _hf_saves(s.save_freq, s.total_steps)
    notes = []
    if n_state and s.keep_last_n_checkpoints == 0:
        notes.append(
            "keep_last_n_checkpoints=0: grpo_fast deletes each state checkpoint right after "
            "writing it, so a restart cannot resume; use 1 or more"
        )
    if s.checkpoint_state_freq <= 0:
        notes.append("no DeepSpeed state checkpoints (checkpoint_state_freq <= 0): a restart starts over")
    notes.append(
        "HF saves are never pruned by grpo_fast: all of them stay until removed "
        "(`hpcrl checkpoints prune` can remove old step_N saves)"
    )
    return DiskPlan(s, trainable, terms, per_rank, hf_kind, hf, n_state, n_hf, state_peak, n_hf, notes)


@dataclass(frozen=True)
class Suggestion:
    setting: str
    value: int
    peak_bytes: float

    @property
    def text(self) -> str:
        return f"{self.setting}={self.value} ({self.peak_bytes / GIB:,.0f} GiB at peak)"


def largest_fitting_keep(plan: DiskPlan) -> int | None:
    """Largest keep_last_n_checkpoints >= 1 whose peak fits the quota (None: none does)."""
    s = plan.setup
    if s.quota_bytes is None or plan.n_state_saves == 0:
        return None
    best = None
    for keep in range(1, plan.n_state_saves + 1):
        if _plan(replace(s, keep_last_n_checkpoints=keep)).fits:
            best = keep
        else:
            break
    return best


def _smallest_fitting(plan: DiskPlan, setting: str) -> Suggestion | None:
    """Smallest save_freq / checkpoint_state_freq above the current one whose peak fits."""
    s = plan.setup
    current = plan.n_hf_saves - 1 if setting == "save_freq" else plan.n_state_saves
    for count in range(current - 1, -1, -1):
        # The smallest frequency v with total_steps // v <= count.
        value = s.total_steps // (count + 1) + 1
        change: dict[str, Any] = {setting: value}
        candidate = _plan(replace(s, **change))
        if candidate.fits:
            return Suggestion(setting, value, candidate.peak_bytes)
    return None


def suggest(plan: DiskPlan) -> list[Suggestion]:
    """Single settings that would make the plan fit, each with its peak."""
    if plan.fits is not False:
        return []
    out: list[Suggestion] = []
    keep = largest_fitting_keep(plan)
    if keep is not None:
        out.append(
            Suggestion(
                "keep_last_n_checkpoints", keep, _plan(replace(plan.setup, keep_last_n_checkpoints=keep)).peak_bytes
            )
        )
    for setting in ("save_freq", "checkpoint_state_freq"):
        if setting == "checkpoint_state_freq" and plan.n_state_saves == 0:
            continue
        found = _smallest_fitting(plan, setting)
        if found is not None:
            out.append(found)
    return out
