"""This job's checkpoint interval: `python -m hpcrl.runtime.step_cadence --run-dir D --job J --planned N`.

Prints one number, the interval the driver gets: the plan's N, or the one the earlier jobs of
this chain measured (hpcrl/logs/next_cadence.py); the reason goes to stderr, for the job log,
and both to D/hpcrl/step-times.jsonl as an `interval` record, for `hpcrl report`.
Anything unreadable leaves N: a job never fails for want of a measurement.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from hpcrl.contract import JOBS_TSV, META, PLAN, STEP_TIMES
from hpcrl.logs.next_cadence import chain_before, next_cadence
from hpcrl.logs.report import read_events
from hpcrl.logs.step_times import read_records


def decide(run_dir: Path, job: str, planned: int) -> tuple[int, str]:
    hp = run_dir / META
    try:
        plan = json.loads((hp / PLAN).read_text())
    except (OSError, ValueError) as exc:
        return planned, f"no readable plan.json ({exc}): the planned interval stays"
    jobs = chain_before(read_events(hp / JOBS_TSV), job)
    if not jobs:
        return planned, "the chain's first job: the planned interval"
    out = next_cadence(plan if isinstance(plan, dict) else {}, read_records(hp / STEP_TIMES), jobs)
    return (out["every_steps"] or planned), out["why"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hpcrl.runtime.step_cadence", description=__doc__.split("\n")[0])
    p.add_argument("--run-dir", required=True, type=Path)
    p.add_argument("--job", required=True)
    p.add_argument("--planned", required=True, type=int)
    a = p.parse_args(argv)
    try:
        every, why = decide(a.run_dir, a.job, a.planned)
    except Exception as exc:  # noqa: BLE001 - a job must not fail here: the plan's interval is safe
        every, why = (
            a.planned,
            f"could not read the measured steps ({type(exc).__name__}: {exc}): the planned interval stays",
        )
    print(every)
    print(f"checkpoint interval: {why}", file=sys.stderr)
    rec = {
        "kind": "interval",
        "job": a.job,
        "every_steps": every,
        "planned": a.planned,
        "why": why,
        "time": round(time.time(), 3),
    }
    try:  # report shows each job's interval; a job never fails for want of the record
        with open(a.run_dir / META / STEP_TIMES, "a") as f:
            f.write(json.dumps(rec, sort_keys=True) + "\n")
    except OSError:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
