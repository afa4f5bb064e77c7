"""What a run writes under one quota, for any backend: checkpoints, the HF caches, rollout dumps (pure).

Each backend's checkpoint kinds, read from its source at the pinned commit, are built by the
backend (its `disk` facts, hpcrl/planning/backends/facts.py); this module holds what they share: the items and their sum against
the quota, the caches that live on the same filesystem, the search for a single setting that
fits, and the text of a refusal. docs/plan-disk.md describes every item and its source.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field, replace
from collections.abc import Sequence
from typing import Any, Callable

from hpcrl.errors import HpcrlError, PlanError, would_fit
from hpcrl.models import ModelSpec
from hpcrl.planning.disk import GB, GIB, check_settings

# A model as the HF hub stores it for these families: bf16 safetensors, 2 bytes per parameter
# (an assumption: a repository published in fp32 takes twice that).
CACHE_BYTES_PER_PARAM = 2
# Rollout dumps, by what a framework writes (each backend says which, with its source): decoded
# text, about 4 bytes per token of English and code; token ids as JSON integers, "151643, " is 8
# bytes. Both are assumptions about the data, not read from the code.
TEXT_BYTES_PER_TOKEN = 4
TOKEN_ID_BYTES = 8


@dataclass(frozen=True)
class Item:
    """One kind of file a run leaves under the quota."""

    kind: str  # deepspeed_state | fsdp_state | hf_save | final_save | model_cache | dataset_cache | rollouts
    what: str  # what and where, in the framework's words
    one_bytes: float
    written: int | None  # None: the count depends on something hpcrl does not know (the dataset's size)
    at_peak: int
    source: str  # file:line at the pinned commit, or the assumption
    terms: dict[str, float] = field(default_factory=dict)
    unbounded: bool = False  # never deleted, and neither a step count nor a time limit bounds how many

    @property
    def peak_bytes(self) -> float:
        return self.one_bytes * self.at_peak


@dataclass(frozen=True)
class DiskInputs:
    """What decides a run's bytes, in neutral names (each backend's `disk.keys` gives its key)."""

    model: ModelSpec
    learners: int = 8
    lora_rank: int = 0
    zero_stage: int = 3
    total_steps: int | None = 1000
    # With total_steps unknown: the most steps the run can take (its time limits over the fastest step estimate,
    # cadence.steps_over_run); saves nobody deletes are counted to it. None: nothing bounds them.
    steps_bound: int | None = None
    ckpt_every: int = 200  # the resume state's interval
    hf_every: int = 200  # a separate HF save interval, where the framework has one
    keep: int | None = 3  # state checkpoints kept (None or -1: all)
    save_hf: bool = False  # a whole-model HF save beside the state, where the framework makes it optional
    disable_ds: bool = False  # no DeepSpeed state, where the framework can skip it
    lora_hf_save: str = "adapter"  # hpcrl.lora_hf_save: "adapter" or "full" HF saves under LoRA
    model_cache: bool = False  # the HF cache is on the quota's filesystem
    dataset_bytes: float = 0.0
    rollout_tokens_per_step: int = 0  # tokens a step's rollout dump holds (0: no dump)
    quota_bytes: float | None = None

    def check(self) -> None:
        check_settings(self.zero_stage, self.learners, self.lora_rank, self.total_steps, self.keep, self.quota_bytes)
        if self.lora_hf_save not in ("adapter", "full"):
            raise HpcrlError(f"--lora-hf-save {self.lora_hf_save!r}: valid: adapter, full")
        if self.dataset_bytes < 0 or self.rollout_tokens_per_step < 0:
            raise HpcrlError("--dataset-gib and --rollout-tokens-per-step must be 0 or more")


@dataclass(frozen=True)
class Fix:
    setting: str  # the backend's key
    value: Any
    peak_bytes: float

    @property
    def text(self) -> str:
        shown = str(self.value).lower() if isinstance(self.value, bool) else self.value
        return f"{self.setting}={shown} ({self.peak_bytes / GIB:,.0f} GiB at peak)"


@dataclass(frozen=True)
class Budget:
    backend: str
    inputs: DiskInputs
    trainable: int
    settings: dict[str, Any]  # the inputs in the backend's own keys
    items: tuple[Item, ...]
    notes: tuple[str, ...] = ()
    fixes: tuple[Fix, ...] = ()  # single settings that fit (only when it does not)

    @property
    def peak_bytes(self) -> float:
        return sum(i.peak_bytes for i in self.items)

    @property
    def fits(self) -> bool | None:
        q = self.inputs.quota_bytes
        return None if q is None else self.peak_bytes <= q and not any(i.unbounded for i in self.items)

    def item(self, kind: str) -> Item | None:
        return next((i for i in self.items if i.kind == kind), None)

    def verdict(self) -> str:
        peak = f"{self.peak_bytes / GIB:,.0f} GiB ({self.peak_bytes / GB:,.0f} GB) at peak"
        if self.fits is None:
            return f"{peak}; no quota known for the run directory (give --quota-gib)"
        q = self.inputs.quota_bytes or 0.0
        if self.fits:
            return f"fits: {peak} of the {q / GIB:,.0f} GiB quota"
        if (grows := next((i for i in self.items if i.unbounded), None)) is not None:
            fixes = "; ".join(f.text for f in self.fixes) or "a step count or a time limit"
            return (
                f"does NOT fit: {grows.what.split(' (')[0]} is never deleted and nothing bounds how many the run "
                f"writes ({peak} counted so far); give the step count (--total-steps) or a time limit. "
                f"Would fit: {fixes}"
            )
        fixes = "; ".join(f.text for f in self.fixes) or "no single setting fits; raise the quota"
        return f"does NOT fit: {peak}, over the {q / GIB:,.0f} GiB quota. Would fit: {fixes}"

    def to_dict(self) -> dict[str, Any]:
        """The backend-neutral part of `hpcrl plan-disk --json`."""
        s = self.inputs
        return {
            "backend": self.backend,
            "model": {
                "name": s.model.name,
                "total_params": s.model.total_params,
                "trainable_params": self.trainable,
                "lora_rank": s.lora_rank,
            },
            "settings": self.settings,
            "items": [
                {
                    "kind": i.kind,
                    "what": i.what,
                    "bytes": round(i.one_bytes),
                    "gib": round(i.one_bytes / GIB, 2),
                    "written": i.written,
                    "at_peak": i.at_peak,
                    "peak_gib": round(i.peak_bytes / GIB, 2),
                    "source": i.source,
                    "terms_gib": {k: round(v / GIB, 3) for k, v in i.terms.items()},
                }
                for i in self.items
            ],
            "peak_bytes": round(self.peak_bytes),
            "peak_gib": round(self.peak_bytes / GIB, 1),
            "quota_gib": None if s.quota_bytes is None else round(s.quota_bytes / GIB, 1),
            "fits": self.fits,
            "suggestions": [
                {"setting": f.setting, "value": f.value, "peak_gib": round(f.peak_bytes / GIB, 1)} for f in self.fixes
            ],
            "notes": list(self.notes),
            "verdict": self.verdict(),
        }


def shares_quota(run_root: str, hf_home: str) -> bool:
    """Whether the HF cache lies beside the run root (under its parent directory), so on its quota."""
    parent = posixpath.dirname(posixpath.normpath(run_root))
    return parent not in ("", "/") and posixpath.normpath(hf_home).startswith(parent + "/")


def cache_items(
    s: DiskInputs, steps_known: bool, dump_source: str | None, bytes_per_token: float = TOKEN_ID_BYTES
) -> tuple[list[Item], list[str]]:
    """The HF model cache, the dataset cache and rollout dumps (`bytes_per_token` each, written as
    `dump_source` says; None: the framework writes none), where they count; and notes."""
    items, notes = [], []
    if s.model_cache:
        items.append(
            Item(
                "model_cache",
                f"HF model cache ({s.model.name}, $HF_HOME/hub)",
                float(CACHE_BYTES_PER_PARAM * s.model.total_params),
                1,
                1,
                "assumption: bf16 safetensors as published (2 B/param); the profile's storage.hf_home "
                "is on the run root's filesystem",
            )
        )
    else:
        notes.append("the HF model cache is not counted (--hf-cache counts it when it shares this quota)")
    if s.dataset_bytes:
        items.append(Item("dataset_cache", "HF datasets cache", s.dataset_bytes, 1, 1, "given (--dataset-gib)"))
    if s.rollout_tokens_per_step and dump_source:
        per = float(s.rollout_tokens_per_step * bytes_per_token)
        n = s.total_steps if steps_known and s.total_steps else 1
        items.append(
            Item(
                "rollouts",
                "rollout dump, one file per step, never deleted",
                per,
                n if steps_known else None,
                n,
                dump_source,
            )
        )
        if not steps_known:
            notes.append(
                "rollout dumps: one step counted; each further step adds "
                f"{per / GIB:,.2f} GiB (the run's step count depends on its dataset)"
            )
    return items, notes


def trainable(s: DiskInputs) -> int:
    """The parameters the run trains: the adapter's under LoRA, else the whole model's."""
    return s.model.lora_params(s.lora_rank) if s.lora_rank else s.model.total_params


def saves(every: int, steps: int | None, at_end: bool = False) -> int | None:
    """Saves over the run: every `every` steps (and at the last step when at_end); None: unknown."""
    if every <= 0:
        return 0
    if steps is None:
        return None
    return steps // every + (1 if at_end and steps % every else 0)


# Up to this many candidate values are tried one by one; a longer range (a run of millions of steps) is
# bisected: each is ordered so that once one fits every later one does (fewer kept, rarer saves).
LINEAR_SEARCH = 64


def search(
    build: Callable[[DiskInputs], Budget],
    base: DiskInputs,
    field_name: str,
    values: Sequence[Any],
    setting: str | None,
    shown: Callable[[Any], Any] = lambda v: v,
) -> Fix | None:
    """The first of `values` for `field_name` whose budget fits, as a Fix in the backend's key."""
    if setting is None:
        raise ValueError(f"{field_name} has no key in the backend's config: nothing to suggest")

    def fitting(value: Any) -> Budget | None:
        b = build(replace(base, **{field_name: value}))
        return b if b.fits else None

    if len(values) <= LINEAR_SEARCH:
        for value in values:
            if (b := fitting(value)) is not None:
                return Fix(setting, shown(value), b.peak_bytes)
        return None
    lo, hi = 0, len(values) - 1
    if fitting(values[hi]) is None:
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fitting(values[mid]) is not None else (mid + 1, hi)
    b = fitting(values[lo])
    return Fix(setting, shown(values[lo]), b.peak_bytes) if b is not None else None


class _Intervals(Sequence[int]):
    """interval_values without the list: a run of a million steps has a million candidates."""

    def __init__(self, total_steps: int, counts: range) -> None:
        self._steps, self._counts = total_steps, counts

    def __len__(self) -> int:
        return len(self._counts)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return self._steps // (self._counts[i] + 1) + 1


def interval_values(current: int, total_steps: int | None, lowest_count: int = 0) -> Sequence[int]:
    """Intervals above `current`, each the smallest giving one save fewer (total_steps // v)."""
    if not total_steps or current <= 0:
        return []
    count = total_steps // current
    return _Intervals(total_steps, range(count - 1, lowest_count - 1, -1))


def refusal(b: Budget, fixes: list[str], steps_text: str) -> PlanError:
    """The one-line refusal of a run that does not fit its run root's quota, its fixes apart (PlanError.fixes)."""
    names = {"model_cache": "the HF model cache", "dataset_cache": "the datasets cache", "rollouts": "rollout dumps"}
    parts = ["checkpoints"] + [names[i.kind] for i in b.items if i.kind in names]
    what = " and ".join([", ".join(parts[:-1]), parts[-1]] if len(parts) > 1 else parts)
    q = (b.inputs.quota_bytes or 0) / GIB
    return would_fit(
        f"{what} need {b.peak_bytes / GIB:,.0f} GiB at peak{steps_text} but the run root's quota is {q:,.0f} GiB",
        tuple(f"--set {f}" for f in fixes),
        " (or --set hpcrl.force_disk=true)",
        "would fit: a larger run root (hpcrl.run_root)",
    )


__all__ = [
    "Budget",
    "DiskInputs",
    "Fix",
    "Item",
    "TEXT_BYTES_PER_TOKEN",
    "TOKEN_ID_BYTES",
    "cache_items",
    "interval_values",
    "refusal",
    "saves",
    "search",
    "shares_quota",
    "trainable",
]
