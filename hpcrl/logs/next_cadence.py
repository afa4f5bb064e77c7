"""The next job's checkpoint interval from the steps this run's jobs measured (pure).

A continuation runs the same script, and the frameworks take their checkpoint interval from the
driver's command line, so each job of a chain may set its own: the script asks
hpcrl/runtime/step_cadence.py, which reads the plan (plan.json's `cadence`, written at render)
and the earlier jobs' step-times.jsonl and calls plan_cadence (hpcrl/planning/cadence.py) with
the measured step in place of the estimate. The upper estimate is the measured median times
MEASURED_UPPER_FACTOR: a margin for step-to-step variation (derived, not fitted).
"""

from __future__ import annotations

from typing import Any

from hpcrl.logs.step_times import summarize
from hpcrl.models.spec import ModelSpec
from hpcrl.planning.cadence import plan_cadence

MEASURED_UPPER_FACTOR = 1.25
# Fewer measured steps than this leave the plan's interval (one slow first step is no measurement).
MIN_STEPS = 3


def chain_before(events: list, job: str) -> list[str]:
    """The jobs of `job`'s chain before it, newest first, by jobs.tsv's `continue` lines."""
    prev = {e.detail: e.job for e in events if e.event == "continue"}
    out: list[str] = []
    while job in prev and prev[job] not in out:
        job = prev[job]
        out.append(job)
    return out


def next_cadence(plan: dict, records: list[dict], jobs: list[str]) -> dict:
    """The interval for the next job: {"every_steps", "why", ...}; the plan's own when nothing was
    measured, the interval was pinned, or the plan says no cadence."""
    c = plan.get("cadence") or {}
    if not c:
        return {"every_steps": None, "why": "plan.json has no cadence (rendered before it was recorded)"}
    planned = int(c["every_steps"])
    if c.get("pinned"):
        return {"every_steps": planned, "why": f"{c['key']} {planned} is pinned in the config"}
    s = summarize(records, set(jobs))
    n = (s["step_s"] or {}).get("n", 0)
    if n < MIN_STEPS:
        return {
            "every_steps": planned,
            "why": f"{n} step(s) measured by earlier jobs (fewer than {MIN_STEPS}): "
            f"the plan's {c['key']} {planned} stays",
        }
    measured = s["step_s"]["median"]
    upper = measured * MEASURED_UPPER_FACTOR
    spec: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in c["model"].items()}
    model = ModelSpec(**spec)
    cad = plan_cadence(
        upper, c["max_lost_minutes"], model, c["write_gib_s"], c["signal_floor_s"], None, c.get("lora_rank", 0)
    )
    return {
        "every_steps": cad.every_steps,
        "planned_every_steps": planned,
        "planned_step_s": c["step_s"],
        "measured_step_s": measured,
        "step_source": s["step_source"],
        "steps": n,
        "upper_s": round(upper, 3),
        "factor": MEASURED_UPPER_FACTOR,
        "why": (
            f"{c['key']} {cad.every_steps} (planned {planned}): measured step {measured:g} s (median of {n}, "
            f"{s['step_source']} timer) x {MEASURED_UPPER_FACTOR:g} = {upper:.1f} s upper, so that at most "
            f"{c['max_lost_minutes']:g} min is lost (plan's estimate {c['step_s']:g} s)"
        ),
    }


__all__ = ["MEASURED_UPPER_FACTOR", "MIN_STEPS", "chain_before", "next_cadence"]
