"""The one path from a run request to its sbatch script, taken by `plan`, `render` and `submit`.

`plan` takes it too and shows the plan without rendering the text, but the script's own checks
(Slurm values, the account, the run name, the container runtime) refuse there as they would at
render, so `plan` never approves what `render` refuses. `plan --model` (a model other than the
config's, which render cannot take) plans that model's layouts only. The user's exclude list is
read here, which makes this a jobs module: it is a file in the user's data dir.
"""

from __future__ import annotations

from typing import NamedTuple

from hpcrl.errors import HpcrlError
from hpcrl.jobs import node_excludes
from hpcrl.planning.request import RunRequest, plan_request
from hpcrl.planning.run_types import RunPlan
from hpcrl.rendering.render import check_script, render_script


class RunScript(NamedTuple):
    """A request, its checked plan (with the cluster's exclude list) and the script rendered from it."""

    request: RunRequest
    plan: RunPlan
    text: str


def _planned(req: RunRequest) -> RunPlan:
    return node_excludes.apply(plan_request(req))


def build(req: RunRequest) -> RunScript:
    """Plan the request, add the user's exclude list, render; raises what any of them refuses."""
    rp = _planned(req)
    if rp.backend.not_rendered:
        raise HpcrlError(f"backend {rp.backend.name}: {rp.backend.not_rendered}")
    return RunScript(req, rp, render_script(rp, smoke=req.smoke))


def plan(req: RunRequest) -> RunPlan:
    """`hpcrl plan`'s plan: planned as for render, with every check of the script; a what-if on
    another model (`plan --model`) has no script to check, so it is planned alone."""
    if req.model is not None:
        return plan_request(req)
    rp = _planned(req)
    if not rp.backend.not_rendered:  # a backend without a script yet has no script checks to make
        check_script(rp, smoke=req.smoke)
    return rp


__all__ = ["RunRequest", "RunScript", "build", "plan"]
