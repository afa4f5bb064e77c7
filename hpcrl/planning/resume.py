"""Whether a new job of the chain can resume the run, from the checkpoints its settings write (pure).

A run that saves no resumable state (OpenRLHF's `ckpt.disable_ds`, set by the user or by hpcrl to fit
a quota; a state interval of 0; open-instruct's `keep_last_n_checkpoints 0`, which deletes each state
right after writing it) would train from scratch in every continuation: after a time limit the
chain stops instead (templates/rundir.sh.j2 `continue_chain`), and render warns.
"""

from __future__ import annotations

from hpcrl.planning.disk_check import run_inputs
from hpcrl.planning.run_types import RunPlan


def no_resume_reason(rp: RunPlan) -> str:
    """The setting that leaves a continuation nothing to resume from, in the backend's key; "" when it can."""
    declared: str | None = rp.backend.declared_resume(rp.config)
    if declared is not None:  # a user's script says how it resumes
        return declared
    if rp.backend.disk.keep_default is None:
        return ""
    s, keys = run_inputs(rp), rp.backend.disk.keys
    if s.disable_ds and keys.get("disable_ds"):
        return f"{keys['disable_ds']} is true: no DeepSpeed state is saved"
    if s.ckpt_every <= 0 and keys.get("ckpt_every"):
        return f"{keys['ckpt_every']} {s.ckpt_every}: no state is saved (unset, hpcrl plans an interval)"
    if s.keep == 0 and keys.get("keep"):
        return f"{keys['keep']} 0: each state is deleted right after it is written"
    return ""


def no_resume_warning(reason: str) -> str:
    return (
        f"{reason}, so a job that reaches its time limit does not continue the chain (a new job would train "
        "from scratch); give the run a wall time it can finish in, or save its state"
    )


__all__ = ["no_resume_reason", "no_resume_warning"]
