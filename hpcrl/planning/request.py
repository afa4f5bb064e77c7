"""What a user asks of `plan`, `render` and `submit`, as one typed record, and the one function
that turns it into a checked plan.

The CLI builds a RunRequest from one shared option set (hpcrl/cli/request.py); jobs/run_script.py
takes it on to the script. A refusal raised here is raised for all three commands alike.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

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
    that writes checkpoints; raises on anything that won't work."""
    # Imported here: the CLI imports this module to declare its options, and `--help` plans nothing.
    from hpcrl.errors import HpcrlError
    from hpcrl.planning.disk_check import check_run_disk
    from hpcrl.planning.run_plan import make_run_plan

    if req.quota_gib is not None and req.quota_gib <= 0:
        raise HpcrlError(f"--quota-gib {req.quota_gib:g}: valid: a positive number of GiB")
    quota = [] if req.quota_gib is None else [f"hpcrl.quota_gib={req.quota_gib!r}"]  # the flag wins over the config
    rp = make_run_plan(req.config, nodes=req.nodes, cluster=req.cluster, cluster_file=req.cluster_file,
                       model=req.model, sets=[*req.sets, *quota], pins=list(req.pins),
                       allow_over_limit=req.allow_over_limit, gpus=req.gpus)
    # A smoke run writes no checkpoints; a what-if on another model than the config's is no run.
    if not req.smoke and req.model is None:
        check_run_disk(rp)
    return rp


def plan_data(rp: RunPlan, top: int = 5, job: JobSpec | None = None) -> dict:
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
    } | ({"backend": rp.backend.name, "backend_args": rp.backend.layout_args(rp)}
         if rp.backend.plan_shows_layout_args else {})


__all__ = ["RunRequest", "plan_data", "plan_request"]
