"""The one path from a run request to its sbatch script, taken by `plan`, `render` and `submit`.

`plan` takes it too and shows the plan without the text: the script's own checks (Slurm values,
the account, the run name, the container runtime) refuse there as they would at render, so
`plan` never approves what `render` refuses. `plan --model` (a model other than the config's,
which render cannot take) plans that model's layouts only. The user's exclude list is read here, which makes
this a jobs module: it is a file in the user's data dir (jobs/node_excludes.py).
"""

from __future__ import annotations

from typing import NamedTuple

from hpcrl.jobs import node_excludes
from hpcrl.planning.request import RunRequest, plan_request
from hpcrl.planning.run_types import RunPlan
from hpcrl.rendering.render import render_script


class RunScript(NamedTuple):
    """A request, its checked plan (with the cluster's exclude list) and the script rendered from it."""

    request: RunRequest
    plan: RunPlan
    text: str


def build(req: RunRequest) -> RunScript:
    """Plan the request, add the user's exclude list, render; raises what any of them refuses."""
    rp = node_excludes.apply(plan_request(req))
    return RunScript(req, rp, render_script(rp, smoke=req.smoke))


def plan(req: RunRequest) -> RunPlan:
    """`hpcrl plan`'s plan: built as render builds it, the text dropped; a what-if on another model
    (`plan --model`) has no script to check, so it is planned alone."""
    return plan_request(req) if req.model is not None else build(req).plan


__all__ = ["RunRequest", "RunScript", "build", "plan"]
