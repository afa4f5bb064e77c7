"""What a user asks of `plan`, `render` and `submit`, as one typed record, and the one function
that turns it into a checked plan.

The CLI builds a RunRequest from one shared option set (hpcrl/cli/request.py); jobs/run_script.py
takes it on to the script. A refusal raised here is raised for all three commands alike.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, fields, replace
from typing import Any, TYPE_CHECKING

if TYPE_CHECKING:
    from hpcrl.planning.job_spec import JobSpec
    from hpcrl.planning.run_types import RunPlan


@dataclass(frozen=True)
class RunRequest:
    """A run as asked for: the config, its overrides, the cluster and the job's size."""

    config: str | None = None  # a run config file or shipped name (None: the default config)
    sets: tuple[str, ...] = ()  # --set key=value, in the order given
    pins: tuple[str, ...] = ()  # --pin key=value
    nodes: int | None = None
    gpus: int | None = None  # GPUs of one node, for a job smaller than a node
    cluster: str | None = None  # a profile name, name:variant picks a node type
    cluster_file: str | None = None  # a profile file, instead of a name
    quota_gib: float | None = None  # the run root's quota, as hpcrl.quota_gib
    allow_over_limit: bool = False
    smoke: bool = False  # the script runs hpcrl's Ray smoke test instead of training
    # Only `plan --model` asks this: a what-if on another model than the config's, never rendered.
    model: str | None = None

    def given(self, *, but: tuple[str, ...] = ()) -> list[str]:
        """The fields set to other than their defaults (but those named), in declaration order."""
        default = RunRequest()
        return [f.name for f in fields(self) if f.name not in but and getattr(self, f.name) != getattr(default, f.name)]


def plan_request(req: RunRequest) -> RunPlan:
    """The checked plan of a request: config, cluster limits, layout, and the disk budget of a run
    that writes checkpoints; raises on anything that won't work. A refusal names only the fixes that
    plan when typed into this request (each is re-planned first), the user's own settings changed first."""
    from hpcrl.errors import PlanError

    try:
        rp = _plan(req)
    except PlanError as err:
        if err.head is None or not err.fixes:
            raise
        kept = [ok for fix in err.fixes if (ok := _tried(req, fix)) is not None]
        own = _own_keys(req)
        kept.sort(key=lambda fix: not any(key in own for key in _set_keys(fix)))
        raise err.with_fixes(kept) from None
    warnings = tuple(_tried_warning(req, w) for w in rp.warnings)
    return rp if warnings == rp.warnings else replace(rp, warnings=warnings)


# A warning's fixes (the allocator-margin note, the learner-cap note) end it: "...; would clear it: a | b".
_WARNING_FIXES = re.compile(r"; would (clear it|fit inside it): (.*)$")
_NONE_LEFT = {
    "clear it": "; nothing hpcrl tried clears it",
    "fit inside it": "; no single change hpcrl tried fits inside it",
}


def _tried_warning(req: RunRequest, warning: str) -> str:
    """The warning naming only the fixes that plan when typed into the request."""
    found = _WARNING_FIXES.search(warning)
    if not found:
        return warning
    fixes = found.group(2).split(" | ")
    kept = [ok for fix in fixes if (ok := _tried(req, fix)) is not None]
    if kept == fixes:
        return warning
    head = warning[: found.start()]
    return head + (f"; would {found.group(1)}: {' | '.join(kept)}" if kept else _NONE_LEFT[found.group(1)])


# A node count the memory search found may still be refused by the framework's own rules (verl divides each
# batch over every GPU): the next counts are tried, this many at most.
NODE_STEPS = 16


def _tried(req: RunRequest, fix: str) -> str | None:
    """The fix as it plans when typed, or None: `--nodes N` becomes the fewest nodes from N on that plan."""
    typed = typed_request(req, fix)
    if typed is None:
        return None
    if _plans(typed):
        return fix
    found = re.fullmatch(r"--nodes (\d+)((?: \([^()]*\))?)", fix)
    if found is None or typed.nodes is None:
        return None
    for n in range(typed.nodes + 1, typed.nodes + NODE_STEPS + 1):
        if _plans(replace(typed, nodes=n)):
            return f"--nodes {n}{found.group(2)}"
    return None


def _plans(req: RunRequest) -> bool:
    """Whether a request plans (its own refusal's fixes are not tried again)."""
    from hpcrl.errors import HpcrlError

    try:
        _plan(req)
    except HpcrlError:
        return False
    return True


_NOTE = re.compile(r"\s*\([^()]*(?:\([^()]*\)[^()]*)*\)")  # "(optimizer state in host RAM)" and the like


def typed_request(req: RunRequest, fix: str) -> RunRequest | None:
    """The request with a printed fix typed in (`--set K=V` replacing the user's own --set of K, `--pin`,
    `--nodes`, `--gpus`, `--cluster`); None where the fix is no such words."""
    words = shlex.split(_NOTE.sub("", fix))
    sets, pins = list(req.sets), list(req.pins)
    change: dict[str, Any] = {}
    if not words:
        return None
    while words:
        flag = words.pop(0)
        if not words or not flag.startswith("--"):
            return None
        value = words.pop(0)
        if flag in ("--set", "--pin"):
            into = sets if flag == "--set" else pins
            key = value.partition("=")[0].strip()
            at = [i for i, item in enumerate(into) if item.partition("=")[0].strip() == key]
            if at:
                into[at[0]] = value
            else:
                into.append(value)
        elif flag in ("--nodes", "--gpus") and value.isdigit():
            change[flag[2:]] = int(value)
        elif flag == "--cluster":
            change["cluster"] = value
        else:
            return None
    return replace(req, sets=tuple(sets), pins=tuple(pins), **change)


def _set_keys(fix: str) -> list[str]:
    words = shlex.split(_NOTE.sub("", fix))
    return [w.partition("=")[0] for flag, w in zip(words, words[1:]) if flag == "--set"]


def _own_keys(req: RunRequest) -> set[str]:
    """The keys the user set: in the config and with --set (a fix changing one of them comes first)."""
    from hpcrl.errors import HpcrlError
    from hpcrl.planning.config import load_run_config

    keys = {item.partition("=")[0].strip() for item in req.sets}
    try:
        keys |= set(load_run_config(req.config, list(req.sets)).args)
    except HpcrlError:  # ordering only: a config that does not load was refused before any fix
        pass
    return keys


def _plan(req: RunRequest) -> RunPlan:
    # Imported here: the CLI imports this module to declare its options, and `--help` plans nothing.
    from hpcrl.errors import HpcrlError
    from hpcrl.planning.disk_check import check_run_disk
    from hpcrl.planning.run_plan import make_run_plan

    if req.quota_gib is not None and req.quota_gib <= 0:
        raise HpcrlError(f"--quota-gib {req.quota_gib:g}: valid: a positive number of GiB")
    quota = [] if req.quota_gib is None else [f"hpcrl.quota_gib={req.quota_gib!r}"]  # the flag wins over the config
    rp = make_run_plan(
        req.config,
        nodes=req.nodes,
        cluster=req.cluster,
        cluster_file=req.cluster_file,
        model=req.model,
        sets=[*req.sets, *quota],
        pins=list(req.pins),
        allow_over_limit=req.allow_over_limit,
        gpus=req.gpus,
    )
    # A smoke run writes no checkpoints; a what-if on another model than the config's is no run.
    if not req.smoke and req.model is None:
        check_run_disk(rp)
    return rp


def plan_data(rp: RunPlan, top: int = 5, job: JobSpec | None = None) -> dict[str, Any]:
    """What `hpcrl plan --json` prints: the ranked layouts (the best `top`), what the plan assumed, and the
    job description of the first layout (`job`; null for a what-if on another model)."""
    return {
        "cluster": rp.profile.name if not rp.profile.variant else f"{rp.profile.name}:{rp.profile.variant}",
        "nodes": rp.nodes,
        "model": rp.workload.model.name,
        "gpus_per_node": rp.profile.gpu.count_per_node,
        "warnings": list(rp.warnings),
        "assumptions": list(rp.assumptions),
        "layouts_considered": len(rp.layouts),
        "layouts": [dict(rank=i + 1, **lay.to_dict()) for i, lay in enumerate(rp.layouts[:top])],
        "job": job.to_json() if job is not None else None,
    } | (
        {"backend": rp.backend.name, "backend_args": rp.backend.layout_args(rp)}
        if rp.backend.plan_shows_layout_args
        else {}
    )


__all__ = ["RunRequest", "plan_data", "plan_request"]
