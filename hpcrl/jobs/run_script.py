"""The one path from a run request to its sbatch script, taken by `plan`, `render` and `submit`.

A request is planned (hpcrl/planning/request.py), the user's exclude list is added (it is a file in
the user's data dir, which makes this a jobs module), the plan is described as a job
(hpcrl/planning/describe.py: every check of the script's values happens there) and the description
is rendered. `plan` stops after the description, so it never approves what `render` refuses;
`plan --model` (a model other than the config's, which render cannot take) plans that model's
layouts only.
"""

from __future__ import annotations

from typing import NamedTuple

from hpcrl.jobs import node_excludes
from hpcrl.planning.describe import describe_job
from hpcrl.planning.job_spec import JobSpec
from hpcrl.planning.request import RunRequest, plan_request
from hpcrl.planning.run_types import RunPlan
from hpcrl.rendering.render import render_script


class RunScript(NamedTuple):
    """A request, its checked plan (with the cluster's exclude list), its job description and the script."""

    request: RunRequest
    plan: RunPlan
    job: JobSpec
    text: str


class PlannedJob(NamedTuple):
    """`hpcrl plan`'s answer: the plan, and its job description (None for a what-if on another model)."""

    plan: RunPlan
    job: JobSpec | None


def _planned(req: RunRequest) -> RunPlan:
    return node_excludes.apply(plan_request(req))


def build(req: RunRequest) -> RunScript:
    """Plan the request, add the user's exclude list, describe and render; raises what any of them refuses."""
    rp = _planned(req)
    job = describe_job(rp, smoke=req.smoke)
    return RunScript(req, rp, job, render_script(job))


def plan(req: RunRequest) -> PlannedJob:
    """`hpcrl plan`'s plan: planned and described as for render, with every check of the script; a
    what-if on another model (`plan --model`) has no script, so it is planned alone."""
    if req.model is not None:
        return PlannedJob(plan_request(req), None)
    rp = _planned(req)
    return PlannedJob(rp, describe_job(rp, smoke=req.smoke))


__all__ = ["PlannedJob", "RunRequest", "RunScript", "build", "plan"]
