"""Re-fit the memory model's fitted constants from the committed rows; report held-out error.

    python benchmarks/fit.py           # the constants, the fit and held-out errors
    python benchmarks/fit.py --check   # exit 1 if hpcrl/memory/constants.py differs from the fit

Rows: benchmarks/results/zero3_*.jsonl (hpcrl's measurements and the given reference rows, a copy of
shared/reference/zero3_calibration_given.jsonl). Each row has an id (its `tag`, or
`given:<line>` for the reference rows); the split is fixed by a hash of that id, chosen before
any error was looked at: a row is held out when the first byte of sha256(id) is below 64
(about a quarter). The split is committed in benchmarks/fit_split.txt; --check also checks it.

What is fitted, on the fit rows only (the model's structure is hpcrl.memory.learner's):
* allocated peak: LOGITS_COPY_BYTES, LOGITS_BYTES_PER_ELEMENT (eager, compiled),
  STEP_BYTES_PER_ELEMENT, FIXED_ALLOC_GIB by least squares on relative error. The peak is the
  largest of the step's moments, so each row's peaking moment is re-chosen and the linear fit
  repeated until the choice is stable. LOGITS_HELD_BYTES is not fitted: it always adds to the
  log-prob path bytes, so only their sum is identifiable; it stays the bf16 size, 2.
  Bytes per element are rounded to whole bytes (dtype sizes), GiB to 0.05.
* reserved peak: RESERVE_FRACTION, RESERVE_FIXED_GIB, RESERVE_LOGITS by linear least squares
  of (measured reserved - predicted allocated) on [predicted allocated, 1 GiB, largest logits
  tensor]; rounded to 0.005, 0.05 GiB and 0.01.
* ALLOCATOR_MARGIN per log-prob path: the largest (measured - fitted) / fitted reserved among
  fit rows of 24 GiB or more fitted reserved (rounded up to 0.001), and the largest absolute
  excess among the smaller ones (rounded up to 0.1 GiB).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hpcrl.memory import constants as C  # noqa: E402
from hpcrl.memory.calibration import Row, load_rows  # noqa: E402
from hpcrl.memory.learner import learner_memory  # noqa: E402

SPLIT_FILE = ROOT / "benchmarks" / "fit_split.txt"
GIB = C.GIB
MARGIN_SPLIT_GIB = 24.0
ALLOC_PARAMS = ("copy", "eager", "compiled", "step", "fixed_gib")


def row_id(row: Row, index_in_file: int) -> str:
    return row.data.get("tag") or f"given:{index_in_file}"


def is_held_out(rid: str) -> bool:
    return hashlib.sha256(rid.encode()).digest()[0] < 64


def labelled_rows() -> list[tuple[str, Row]]:
    """(id, row) for every ok row, in load order."""
    out, seen = [], {}
    for row in load_rows():
        seen[row.source] = seen.get(row.source, -1) + 1
        if row.ok:
            out.append((row_id(row, seen[row.source]), row))
    return out


def split() -> tuple[list[tuple[str, Row]], list[tuple[str, Row]]]:
    rows = labelled_rows()
    return [r for r in rows if not is_held_out(r[0])], [r for r in rows if is_held_out(r[0])]


def split_text() -> str:
    return "".join(f"{rid} {'held_out' if is_held_out(rid) else 'fit'}\n" for rid, _ in labelled_rows())


@contextmanager
def constants(values: dict):
    """Temporarily set the memory model's constants (learner_memory reads them at call time)."""
    saved = {k: getattr(C, k) for k in values}
    try:
        for k, v in values.items():
            setattr(C, k, v)
        yield
    finally:
        for k, v in saved.items():
            setattr(C, k, v)


def alloc_constants(p: dict) -> dict:
    return {
        "LOGITS_COPY_BYTES": p["copy"],
        "LOGITS_BYTES_PER_ELEMENT": {"eager": p["eager"], "compiled": p["compiled"]},
        "STEP_BYTES_PER_ELEMENT": p["step"],
        "FIXED_ALLOC_GIB": p["fixed_gib"],
    }


def phases(row: Row, p: dict) -> dict[str, float]:
    with constants(alloc_constants(p)):
        return learner_memory(row.setup()).phases


def phase_design(row: Row) -> dict[str, tuple[np.ndarray, float]]:
    """Each moment's allocated bytes as (coefficients of ALLOC_PARAMS, constant): it is linear in them."""
    zero = dict.fromkeys(ALLOC_PARAMS, 0.0)
    base = phases(row, zero)
    coeffs = {k: np.zeros(len(ALLOC_PARAMS)) for k in base}
    for i, name in enumerate(ALLOC_PARAMS):
        unit = phases(row, {**zero, name: 1.0})
        for k in base:
            coeffs[k][i] = unit[k] - base[k]
    return {k: (coeffs[k], base[k]) for k in base}


def fit_allocated(rows: list[Row]) -> dict:
    designs = [phase_design(r) for r in rows]
    measured = np.array([r.data["peak_alloc_gib"] * GIB for r in rows])
    p = np.array([4.0, 4.0, 4.0, 4.0, 0.0])  # neutral start: every byte count 4, nothing fixed
    chosen: list[str] = []
    for _ in range(50):
        now = [max(d, key=lambda k: d[k][0] @ p + d[k][1]) for d in designs]
        if now == chosen:
            break
        chosen = now
        a = np.array([d[k][0] for d, k in zip(designs, chosen)]) / measured[:, None]
        b = np.array([m - d[k][1] for d, k, m in zip(designs, chosen, measured)]) / measured
        p = np.linalg.lstsq(a, b, rcond=None)[0]
    raw = dict(zip(ALLOC_PARAMS, map(float, p)))
    return {
        "raw": raw,
        "rounded": {k: (round(v * 20) / 20 if k == "fixed_gib" else float(round(v))) for k, v in raw.items()},
    }


def predicted(row: Row) -> tuple[float, float]:
    """(allocated, reserved) GiB with the constants as they are now."""
    mem = learner_memory(row.setup())
    return mem.peak_allocated / GIB, mem.peak_reserved / GIB


def largest_logits_gib(row: Row) -> float:
    s = row.setup()
    return (4.0 if s.logprob_impl == "eager" else 2.0) * s.tokens_per_gpu * s.model.vocab_size / GIB


def fit_reserved(rows: list[Row]) -> dict:
    alloc = np.array([predicted(r)[0] for r in rows])
    a = np.column_stack([alloc, np.ones(len(rows)), [largest_logits_gib(r) for r in rows]])
    b = np.array([r.data["peak_reserved_gib"] for r in rows]) - alloc
    frac, fixed, logits = map(float, np.linalg.lstsq(a, b, rcond=None)[0])
    return {
        "raw": {"fraction": frac, "fixed_gib": fixed, "logits": logits},
        "rounded": {
            "fraction": round(frac * 200) / 200,
            "fixed_gib": round(fixed * 20) / 20,
            "logits": round(logits, 2),
        },
    }


def fit_margin(rows: list[Row]) -> dict:
    out = {}
    for impl in ("compiled", "eager"):
        frac, floor = 0.0, 0.0
        for r in rows:
            if r.setup().logprob_impl != impl:
                continue
            fitted = predicted(r)[1]
            excess = r.data["peak_reserved_gib"] - fitted
            if fitted >= MARGIN_SPLIT_GIB:
                frac = max(frac, excess / fitted)
            else:
                floor = max(floor, excess)
        out[impl] = (math.ceil(round(frac * 1000, 6)) / 1000, math.ceil(round(floor * 10, 6)) / 10)
    return out


def fit() -> dict:
    fit_rows = [r for _, r in split()[0]]
    alloc = fit_allocated(fit_rows)
    a = alloc["rounded"]
    with constants(alloc_constants(a)):
        reserve = fit_reserved(fit_rows)
        q = reserve["rounded"]
        with constants(
            {"RESERVE_FRACTION": q["fraction"], "RESERVE_FIXED_GIB": q["fixed_gib"], "RESERVE_LOGITS": q["logits"]}
        ):
            margin = fit_margin(fit_rows)
    values = {
        "LOGITS_COPY_BYTES": a["copy"],
        "LOGITS_BYTES_PER_ELEMENT": {"eager": a["eager"], "compiled": a["compiled"]},
        "STEP_BYTES_PER_ELEMENT": a["step"],
        "FIXED_ALLOC_GIB": a["fixed_gib"],
        "RESERVE_FRACTION": q["fraction"],
        "RESERVE_FIXED_GIB": q["fixed_gib"],
        "RESERVE_LOGITS": q["logits"],
        "ALLOCATOR_MARGIN": margin,
    }
    return {"constants": values, "raw": {"allocated": alloc["raw"], "reserved": reserve["raw"]}}


def errors(rows: list[tuple[str, Row]], values: dict) -> list[dict]:
    """Per row: relative error of allocated, reserved excess over fit, and whether the margin covers it."""
    from hpcrl.memory.plan import allocator_margin

    out = []
    with constants(values):
        for rid, r in rows:
            alloc, reserved = predicted(r)
            margin = allocator_margin(r.setup(), reserved * GIB) / GIB
            out.append(
                {
                    "id": rid,
                    "alloc_error": (alloc - r.data["peak_alloc_gib"]) / r.data["peak_alloc_gib"],
                    "reserved_excess_gib": r.data["peak_reserved_gib"] - reserved,
                    "inside_margin": r.data["peak_reserved_gib"] <= reserved + margin,
                }
            )
    return out


def summary(errs: list[dict]) -> dict:
    a = sorted(abs(e["alloc_error"]) for e in errs)
    return {
        "rows": len(errs),
        "median_abs_alloc_error": a[len(a) // 2] if len(a) % 2 else (a[len(a) // 2 - 1] + a[len(a) // 2]) / 2,
        "max_abs_alloc_error": a[-1],
        "max_reserved_excess_gib": max(e["reserved_excess_gib"] for e in errs),
        "outside_margin": [e["id"] for e in errs if not e["inside_margin"]],
    }


def committed() -> dict:
    return {k: getattr(C, k) for k in fit()["constants"]}


def differences(values: dict) -> list[str]:
    out = []
    for k, v in values.items():
        have = getattr(C, k)
        if isinstance(v, dict):
            same = set(v) == set(have) and all(np.allclose(v[i], have[i]) for i in v)
        else:
            same = math.isclose(v, have, abs_tol=1e-9)
        if not same:
            out.append(f"{k}: committed {have!r}, fit gives {v!r}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if the committed constants or split differ")
    ap.add_argument("--write-split", action="store_true", help="(re)write benchmarks/fit_split.txt")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.write_split:
        SPLIT_FILE.write_text(split_text())
    result = fit()
    values = result["constants"]
    fit_rows, held = split()
    report = {**result, "fit": summary(errors(fit_rows, values)), "held_out": summary(errors(held, values))}
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        for k, v in values.items():
            print(f"{k} = {v!r}")
        print("raw least-squares values:", json.dumps(result["raw"]))
        for name in ("fit", "held_out"):
            s = report[name]
            print(
                f"{name}: {s['rows']} rows, allocated error median {s['median_abs_alloc_error']:.2%}, "
                f"max {s['max_abs_alloc_error']:.2%}; reserved above fit by at most "
                f"{s['max_reserved_excess_gib']:.2f} GiB; outside the allocator margin: {s['outside_margin'] or 'none'}"
            )
    if args.check:
        problems = differences(values)
        if not SPLIT_FILE.exists() or SPLIT_FILE.read_text() != split_text():
            problems.append(f"{SPLIT_FILE.relative_to(ROOT)} does not match the split rule (run --write-split)")
        for p in problems:
            print("MISMATCH", p, file=sys.stderr)
        return 1 if problems else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
