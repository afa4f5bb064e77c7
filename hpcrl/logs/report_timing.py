"""`hpcrl report`'s plan vs real times: the step, generation, training and checkpoint write the plan
estimated (plan.json) against what the watchdog measured (hpcrl/step-times.jsonl), and the work the
last stop lost (pure).

A warning says when the real step is outside the band, when the interval in force risks more
than `hpcrl.max_lost_minutes` at the real step, and when the time-limit warning's lead is shorter
than a real step, the longest real write and the stop (hpcrl/planning/cadence.py's margin).

The generation row carries the plan's generation band (`generation_time_low_s`/`high_s`, the vLLM
model's held-out range) where plan.json has it, and a warning when the driver's logged generation
time falls outside it. The plan's step band is Layout.to_dict()'s `step_time_low_s`/`step_time_high_s` (with
`step_time_basis`); a plan without them has its estimate `step_time_s` only, and the real step
is then compared with that estimate +-MEASURED_UPPER_FACTOR (the margin a continuation's
interval takes, hpcrl/logs/next_cadence.py).
"""

from __future__ import annotations

from pathlib import Path

from hpcrl import contract as C
from hpcrl.logs.next_cadence import MEASURED_UPPER_FACTOR
from hpcrl.logs.step_times import lost_at_stop, read_records, summarize
from hpcrl.planning.cadence import STOP_MARGIN_S

NO_TIMES = "no step times recorded (no hpcrl/step-times.jsonl: the watchdog did not run, or predates the record)"


def _ratio(real: float | None, plan: float | None) -> float | None:
    return round(real / plan, 3) if real is not None and plan else None


def _row(what: str, plan_s: float | None, spread: dict | None, **extra: object) -> dict:
    real = spread["median"] if spread else None
    return {
        "what": what,
        "plan_s": plan_s,
        "real_s": real,
        "real_min_s": spread["min"] if spread else None,
        "real_max_s": spread["max"] if spread else None,
        "n": spread["n"] if spread else 0,
        "ratio": _ratio(real, plan_s),
        **extra,
    }


def step_band(layout: dict) -> tuple[float | None, float | None, str]:
    """The plan's step band (low, high) and its basis; the estimate +-the factor when the plan has no band."""
    mid, low, high = layout.get("step_time_s"), layout.get("step_time_low_s"), layout.get("step_time_high_s")
    if low is not None and high is not None:
        return low, high, str(layout.get("step_time_basis") or "-")
    if mid is None:
        return None, None, "-"
    f = MEASURED_UPPER_FACTOR
    return round(mid / f, 3), round(mid * f, 3), f"no band in plan.json: the estimate /x {f:g} (derived)"


def _last_stop(records: list[dict], jobs: list[dict], ended: dict[str, float]) -> dict | None:
    """The latest job that stopped other than by completing, and what it lost."""
    for j in reversed(jobs):
        if j["job_id"] in ended and j.get("end_reason") not in (None, C.COMPLETED):
            lost = lost_at_stop(records, j["job_id"], ended[j["job_id"]])
            return {**lost, "reason": j["end_reason"]} if lost else None
    return None


def timing(run_dir: Path, plan: dict | None, jobs: list[dict], ended: dict[str, float]) -> dict:
    """Plan vs real per phase, the checkpoint interval's risk, the last stop's loss, and warnings;
    `ended` holds each ended job's end (epoch seconds)."""
    records = read_records(run_dir / C.META / C.STEP_TIMES)
    ids = {j["job_id"] for j in jobs}
    recs = [r for r in records if not ids or str(r.get("job")) in ids]
    layout = (plan or {}).get("layout") or {}
    cadence = (plan or {}).get("cadence") or {}
    s = summarize(recs)
    low, high, basis = step_band(layout)
    step = _row(
        "step",
        layout.get("step_time_s"),
        s["step_s"],
        plan_low_s=low,
        plan_high_s=high,
        plan_basis=basis,
        source=s["step_source"],
    )
    gen = _row(
        "generation",
        layout.get("generation_time_s"),
        s["generation_s"],
        plan_low_s=layout.get("generation_time_low_s"),
        plan_high_s=layout.get("generation_time_high_s"),
        plan_basis=layout.get("generation_time_basis") or "-",
    )
    rows = [
        step,
        gen,
        _row("training", layout.get("training_time_s"), s["training_s"]),
        _row(
            "checkpoint write",
            cadence.get("write_s"),
            s["checkpoint_write_s"],
            plan_basis="derived" if cadence.get("write_s") is not None else "-",
            source=s["checkpoint_sources"],
        ),
    ]
    warnings = []
    real = step["real_s"]
    if real is not None and low is not None and high is not None and not low <= real <= high:
        warnings.append(
            f"the real step ({real:g} s, median of {step['n']}) is outside the plan's band "
            f"{low:g}-{high:g} s ({basis}): the checkpoint interval and the time-limit warning rest on it"
        )
    g_real, g_low, g_high = gen["real_s"], gen["plan_low_s"], gen["plan_high_s"]
    if g_real is not None and g_low is not None and g_high is not None and not g_low <= g_real <= g_high:
        warnings.append(
            f"the real generation ({g_real:g} s, median of {gen['n']}) is outside the plan's band "
            f"{g_low:g}-{g_high:g} s (the vLLM model, docs/plan.md): the layout's split of GPUs between "
            "engines and learners rests on it"
        )
    interval = None
    if cadence:
        per_job = [
            {"job": str(r["job"]), "every_steps": r.get("every_steps"), "why": r.get("why")}
            for r in recs
            if r["kind"] == "interval"
        ]
        # The interval in force: the last job's, as its script set it, else the plan's.
        every = int(per_job[-1]["every_steps"] if per_job and per_job[-1]["every_steps"] else cadence["every_steps"])
        interval = {
            "key": cadence.get("key"),
            "planned_every_steps": int(cadence["every_steps"]),
            "every_steps": every,
            "jobs": per_job,
            "max_lost_minutes": cadence.get("max_lost_minutes"),
            "plan_at_risk_min": round(every * cadence["step_s"] / 60, 1),
            "real_at_risk_min": round(every * real / 60, 1) if real is not None else None,
        }
        limit = cadence.get("max_lost_minutes")
        if interval["real_at_risk_min"] is not None and limit and interval["real_at_risk_min"] > limit:
            warnings.append(
                f"{cadence.get('key')} {every} at the real step is ~{interval['real_at_risk_min']:g} min "
                f"of training at risk, over hpcrl.max_lost_minutes {limit:g} (a continuation resets it "
                "from the measured step)"
            )
    write = rows[3]["real_max_s"]
    if real is not None and cadence.get("lead_s") and real + (write or 0.0) + STOP_MARGIN_S > cadence["lead_s"]:
        warnings.append(
            f"the time-limit warning comes {cadence['lead_s']} s before the end, less than one real step "
            f"({real:g} s) + the longest checkpoint write ({write or 0:g} s) + {STOP_MARGIN_S} s to stop: "
            "a checkpoint due at the end may be cut off"
        )
    return {
        "file": f"{C.META}/{C.STEP_TIMES}",
        "records": len(recs),
        "note": None if recs else NO_TIMES,
        "rows": rows,
        "interval": interval,
        "last_stop": _last_stop(recs, jobs, ended),
        "warnings": warnings,
    }


def seconds(v: float | None) -> str:
    return "-" if v is None else f"{v:,.1f}"


def band_text(row: dict) -> str:
    low, high = row.get("plan_low_s"), row.get("plan_high_s")
    return "-" if low is None or high is None else f"{low:,.1f}-{high:,.1f}"


def interval_text(i: dict) -> str:
    real = "-" if i["real_at_risk_min"] is None else f"~{i['real_at_risk_min']:g}"
    jobs = ", ".join(f"job {j['job']} {j['every_steps']}" for j in i["jobs"])
    return (
        f"checkpoint interval: {i['key']} {i['every_steps']} (planned {i['planned_every_steps']}"
        + (f"; {jobs}" if jobs else "")
        + f") = ~{i['plan_at_risk_min']:g} min of training at the planned step, "
        f"{real} min at the real one (hpcrl.max_lost_minutes {i['max_lost_minutes']:g})"
    )


def lost_text(stop: dict | None) -> str:
    if stop is None:
        return "lost work at the last stop: none (no job stopped before completing, or it recorded no step)"
    since = (
        f"since the checkpoint after step {stop['checkpoint_step']}"
        if stop["since"] == "checkpoint"
        else "since its first step line (no checkpoint write recorded in that job)"
    )
    steps = "" if stop["steps_lost"] is None else f"{stop['steps_lost']} step(s), "
    return (
        f"lost work at the last stop (job {stop['job']}, {stop['reason']}, last step {stop['last_step']}): "
        f"{steps}{stop['lost_s']:,.0f} s {since}"
    )


__all__ = ["NO_TIMES", "band_text", "interval_text", "lost_text", "seconds", "step_band", "timing"]
