"""A backend's checkpoints against the run root's quota: its disk budget and `plan-disk`'s flags (pure).

What each framework writes, read from its source at the pinned commit, is the backend's own
`disk` facts (hpcrl/planning/backends/facts.py; the modules are listed in docs/backends.md, and
backends/data/capabilities.json "checkpoints" names the same lines); this module runs them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hpcrl.planning.backends import backend_names, get_backend
from hpcrl.planning.disk import GIB
from hpcrl.planning.disk_budget import Budget, DiskInputs, shares_quota
from hpcrl.profiles import ClusterProfile


def budget(backend: str, s: DiskInputs) -> Budget:
    """The disk budget of a run of `backend`, with single settings that fit when it does not."""
    s.check()
    facts = get_backend(backend).disk
    b: Budget = facts.budget(s)
    if b.fits is False:
        b = replace(b, fixes=tuple(f for f in facts.fixes(b) if f is not None))
    return b


def __getattr__(attr: str) -> dict[str, dict[str, str | None]]:
    # KEYS: each backend's name for the neutral settings (None: it has no such setting), as before
    # the backends held them; built when asked (it imports every backend).
    if attr == "KEYS":
        return {name: dict(get_backend(name).disk.keys) for name in backend_names()}
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")


def flag_inputs(
    backend: str,
    given: dict[str, Any],
    profile: ClusterProfile,
    quota_gib: float | None,
    hf_cache: bool | None,
    **extra: Any,
) -> tuple[DiskInputs, str]:
    """`plan-disk`'s flags (None: not given) as inputs, with the backend's defaults; and where the quota is from."""
    from hpcrl.errors import HpcrlError
    from hpcrl.models import resolve_model

    offered = [n for n in backend_names() if get_backend(n).disk.keep_default is not None]
    if backend not in offered:
        raise HpcrlError(f"--backend {backend!r}: valid: {', '.join(offered)}")
    facts = get_backend(backend).disk
    store = profile.storage
    quota = quota_gib if quota_gib is not None else store.run_root.quota_gib
    cache = hf_cache if hf_cache is not None else quota_gib is None and shares_quota(store.run_root.path, store.hf_home)
    keep = given.get("keep_last_n_checkpoints")

    def get(name: str, default: Any) -> Any:
        return default if given.get(name) is None else given[name]

    s = DiskInputs(
        resolve_model(get("model", "32b")),
        learners=get("learners", 8),
        lora_rank=get("lora_rank", 0),
        zero_stage=get("zero_stage", 3),
        total_steps=get("total_steps", 1000),
        ckpt_every=get("checkpoint_state_freq", 200),
        hf_every=get("save_freq", 200),
        keep=facts.keep_default if keep is None else None if keep == facts.keep_all else keep,
        save_hf=bool(given.get("save_hf")),
        disable_ds=bool(given.get("disable_ds")),
        lora_hf_save=get("lora_hf_save", "adapter"),
        model_cache=cache,
        quota_bytes=None if quota is None else quota * GIB,
        **extra,
    )
    return s, "--quota-gib" if quota_gib is not None else f"{profile.name} run_root ({store.run_root.path})"


def settings_text(b: Budget) -> str:
    """The settings that set the budget, in the backend's keys."""
    return ", ".join(f"{k} {_shown(v)}" for k, v in b.settings.items() if k != "total_steps")


def _shown(v: Any) -> str:
    return "null" if v is None else str(v).lower() if isinstance(v, bool) else str(v)


__all__ = ["budget", "flag_inputs", "settings_text"]
