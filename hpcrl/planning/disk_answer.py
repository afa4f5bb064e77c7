"""plan-disk's whole answer: the budget of a config or of flags, and the data `--json` prints (pure).

The CLI (hpcrl/cli/cmd_disk.py) and the Python API (hpcrl/api) both call `plan_disk`, so the two
cannot drift apart.
"""

from __future__ import annotations

from typing import Any

from dataclasses import asdict, dataclass
from hpcrl.errors import HpcrlError
from hpcrl.planning.disk_budget import Budget


@dataclass(frozen=True)
class DiskRequest:
    """What plan-disk is asked: a config (with --set words) or a backend's settings as flags (None: not given)."""

    backend: str | None = None
    config: str | None = None
    nodes: int | None = None
    sets: tuple[str, ...] = ()
    # A run's own settings: flags without --config (with it, the config's count).
    model: str | None = None
    learners: int | None = None
    lora_rank: int | None = None
    zero_stage: int | None = None
    save_freq: int | None = None
    checkpoint_state_freq: int | None = None
    keep_last_n_checkpoints: int | None = None
    total_steps: int | None = None
    save_hf: bool | None = None
    disable_ds: bool | None = None
    lora_hf_save: str | None = None
    # Where, and what shares the quota.
    hf_cache: bool | None = None
    dataset_gib: float = 0.0
    rollout_tokens_per_step: int = 0
    cluster: str | None = None
    cluster_file: str | None = None
    quota_gib: float | None = None


_RUN_ONLY = (
    "model",
    "learners",
    "lora_rank",
    "zero_stage",
    "save_freq",
    "checkpoint_state_freq",
    "keep_last_n_checkpoints",
    "total_steps",
    "save_hf",
    "disable_ds",
    "lora_hf_save",
)


def plan_disk(r: DiskRequest) -> tuple[Budget, str]:
    """The budget plan-disk shows for request `r`, and where its quota is from."""
    from hpcrl.planning.disk import GIB
    from hpcrl.planning.disk_backends import budget

    run = {k: v for k, v in asdict(r).items() if k in _RUN_ONLY}
    extra = {"dataset_bytes": r.dataset_gib * GIB, "rollout_tokens_per_step": r.rollout_tokens_per_step}
    if r.config is not None:
        from hpcrl.planning.disk_check import config_inputs
        from hpcrl.planning.run_plan import make_run_plan

        bad = next((f"--{k.replace('_', '-')}" for k, v in run.items() if v is not None), None)
        if bad or r.backend:
            raise HpcrlError(
                f"{bad or '--backend'}: with --config the run's own settings count; change them with --set KEY=VALUE"
            )
        rp = make_run_plan(
            r.config, nodes=r.nodes, cluster=r.cluster, cluster_file=r.cluster_file, sets=list(r.sets) or None
        )
        s, quota_from = config_inputs(rp, r.quota_gib, r.hf_cache, **extra)
        return budget(rp.backend.name, s), quota_from
    from hpcrl.planning.backends import DEFAULT_BACKEND
    from hpcrl.planning.disk_backends import flag_inputs
    from hpcrl.profiles import resolve_profile

    if r.nodes is not None or r.sets:
        raise HpcrlError("--nodes and --set go with --config")
    name = r.backend or DEFAULT_BACKEND
    s, quota_from = flag_inputs(name, run, resolve_profile(r.cluster, r.cluster_file), r.quota_gib, r.hf_cache, **extra)
    return budget(name, s), quota_from


def plan_disk_data(b: Budget, quota_from: str) -> dict[str, Any]:
    """The answer `hpcrl plan-disk --json` prints: the budget, its state/HF save under the keys the
    schema has always had, and where the quota is from."""
    return {**b.to_dict(), **_legacy(b), "quota_from": quota_from}


def _legacy(b: Budget) -> dict[str, Any]:
    out = {}
    state = b.item("deepspeed_state") or b.item("fsdp_state")
    hf = b.item("hf_save") or b.item("final_save")
    if state:
        out["state_checkpoint"] = {
            "bytes": round(state.one_bytes),
            "gib": round(state.one_bytes / 2**30, 2),
            "per_rank_bytes": round(state.one_bytes / b.inputs.learners),
            "terms_gib": {k: round(v / 2**30, 3) for k, v in state.terms.items()},
            "saves": state.written,
            "at_peak": state.at_peak,
        }
    if hf:
        out["hf_save"] = {
            "kind": hf.what,
            "bytes": round(hf.one_bytes),
            "gib": round(hf.one_bytes / 2**30, 2),
            "saves": hf.written,
            "at_peak": hf.at_peak,
        }
    return out
