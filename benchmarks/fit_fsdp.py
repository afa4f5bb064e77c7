"""Fit the FSDP learner model's constants (hpcrl/memory/fsdp_learner.py FIT) and report its error.

    PYTHONPATH=. python benchmarks/fit_fsdp.py [--rows benchmarks/results/fsdp_measured.jsonl]

Split, fixed: of the rows with status ok, in file order, every third one (index % 3 == 2) is held
out and never used by the fit. The fit uses only the training rows:
* logits moment: last backward phase peak minus the model's non-fitted terms, least squares on
  a + b * T * h over rows where that moment is the larger of the two backward moments;
* end of backward, optimizer step: median residual of the rows where that moment is the peak of
  its phase;
* margin_fraction (the verdict's allocator margin): the largest measured / predicted - 1 of peak
  reserved over the training rows, rounded up to a percent;
* reserved: over the rows with expandable segments (verl's setting), peak reserved minus the model's
  basis (its peak, or with one micro-batch the logits moment plus the gradients), least squares on
  a + b * (the root unit's fp32 gradient bytes, 0 under LoRA), per FSDP version; the margin over the
  same rows.
Prints the constants, the per-row table and the errors (peak allocated and reserved) on the
held-out rows and on the training rows.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

from hpcrl.memory import fsdp_learner as F
from hpcrl.memory.constants import GIB
from hpcrl.models.spec import ModelSpec

HERE = Path(__file__).resolve().parent
# Rows measured after the fit, never read by it: (file in results/, heading of its table)
LATER = (
    ("fsdp_post_fit.jsonl", "rows measured after the fit (fsdp_post_fit.jsonl; the 3B ref row showed the reference root term at every moment)"),
    ("fsdp_heldout2.jsonl", "rows measured after the fit, new architectures, LoRA and 32k tokens (fsdp_heldout2.jsonl: Qwen3, Llama-3.2, "
                            "verl's fp32 LoRA adapters)"),
)


def setup_of(row: dict) -> F.FsdpSetup:
    raw = json.loads((HERE / "configs" / f"{row['model']}.json").read_text())
    spec = ModelSpec.from_hf_config(raw, row["model"])
    offload = {"none": "none", "verl": "param_optimizer", "cpu_policy": "cpu_policy"}[row["offload"]]
    # verl's LoRA targets all-linear (fsdp_memory.py --lora-rank): every projection ModelSpec knows
    adapters = spec.lora_params(row["lora_rank"]) if row.get("lora_rank") else 0
    return F.FsdpSetup(spec, row["world"], row["seq"], row["micro_batches"], row["fsdp"], bool(row["ref"]), offload,
                       adapters)  # fmt: skip


def load(path: Path) -> tuple[list[dict], list[dict]]:
    ok = [r for r in map(json.loads, path.read_text().splitlines()) if r.get("status") == "ok"]
    return [r for i, r in enumerate(ok) if i % 3 != 2], [r for i, r in enumerate(ok) if i % 3 == 2]


def lstsq(xs: list[float], ys: list[float]) -> tuple[float, float]:
    n, mx, my = len(xs), statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return my - b * mx, b


def fit(train: list[dict]) -> dict:
    zero = {k: 0.0 for k in F.FIT}
    F.FIT.update(zero)
    lx, ly, gres, sres = [], [], [], []
    rx: dict[int, list] = {1: [], 2: []}
    ry: dict[int, list] = {1: [], 2: []}
    rbase: dict[int, list] = {1: [], 2: []}
    for r in train:
        s = setup_of(r)
        b = F.fsdp_learner_memory(s)
        tot = {k: sum(v.values()) for k, v in b.moments.items()}
        bw = max(r["phase_peaks_gib"]["backward"]) * GIB
        if tot["logits"] >= tot["backward end"]:
            lx.append(s.tokens_per_gpu * s.model.hidden_size)
            ly.append(bw - tot["logits"])
        else:
            gres.append(bw - tot["backward end"])
        if r["offload"] != "cpu_policy":
            sres.append(r["phase_peaks_gib"]["step"] * GIB - tot["optimizer step"])
        if r["expandable"]:  # the reserved model is expandable segments' (verl leaves them on)
            rx[s.fsdp_version].append(F.root_grad_bytes(s))
            ry[s.fsdp_version].append(r["peak_reserved_gib"] * GIB - b.reserved_bytes)
            rbase[s.fsdp_version].append(b.reserved_bytes)  # the basis: FIT's reserved terms are zero here
    a, b = lstsq(lx, ly)
    out = {}
    for v in (1, 2):
        ra, rb = lstsq(rx[v], ry[v])
        out[f"reserved_fixed_gib_fsdp{v}"] = round(ra / GIB, 2)
        out[f"reserved_per_root_grad_fsdp{v}"] = round(rb, 2)
    out |= {
        "logits_fixed_gib": round(a / GIB, 3),
        "logits_per_token_hidden": round(b, 1),
        "grads_done_fixed_gib": round(statistics.median(gres) / GIB, 3) if gres else 0.0,
        "step_fixed_gib": round(statistics.median(sres) / GIB, 3),
    }
    F.FIT.update(out)
    return out | {"margin_fraction": loo_margin(rx, ry, rbase)}


def loo_margin(rx: dict[int, list], ry: dict[int, list], rbase: dict[int, list]) -> float:
    """The verdict's allocator margin: the largest under-prediction of reserved when each row is left out
    of the reserved fit (what a row the fit has not seen can need), rounded up to a percent."""
    worst = 0.0
    for v in (1, 2):
        for i, (x, y) in enumerate(zip(rx[v], ry[v])):
            ra, rb = lstsq(rx[v][:i] + rx[v][i + 1:], ry[v][:i] + ry[v][i + 1:])
            worst = max(worst, (y - ra - rb * x) / (rbase[v][i] + ra + rb * x))
    return math.ceil(worst * 100) / 100


def errors(rows: list[dict], label: str) -> None:
    print(f"\n{label}: {len(rows)} rows (GiB; error = predicted / measured - 1)")
    print("| model | N | T | K | FSDP | ref | offload | LoRA | measured peak | predicted | err | moment | measured reserved | predicted | err | GPU |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    pe, re_ = [], []
    for r in rows:
        b = F.fsdp_learner_memory(setup_of(r))
        e, er = b.peak_gib / r["peak_alloc_gib"] - 1, b.reserved_gib / r["peak_reserved_gib"] - 1
        pe.append(abs(e))
        re_.append(abs(er))
        print(f"| {r['model']} | {r['world']} | {r['seq']} | {r['micro_batches']} | {r['fsdp']} | {r['ref']} | "
              f"{r['offload']} | {r.get('lora_rank') or 0} | {r['peak_alloc_gib']:.2f} | {b.peak_gib:.2f} | {e:+.2%} | {b.peak_moment} | "
              f"{r['peak_reserved_gib']:.2f} | {b.reserved_gib:.2f} | {er:+.1%} | {r['gpu']} |")  # fmt: skip
    under = sum(r["peak_reserved_gib"] > F.fsdp_learner_memory(setup_of(r)).reserved_gib * (1 + F.FIT["margin_fraction"])
                for r in rows)
    print(f"peak allocated: median |err| {statistics.median(pe):.2%}, max {max(pe):.2%}; "
          f"reserved: median {statistics.median(re_):.1%}, max {max(re_):.1%}; "
          f"rows whose reserved exceeds prediction + margin: {under}")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default=str(HERE / "results" / "fsdp_measured.jsonl"))
    args = p.parse_args()
    train, held = load(Path(args.rows))
    shipped = dict(F.FIT)
    fitted = fit(train)
    F.FIT.update(fitted)
    print("fitted constants:", json.dumps(fitted))
    if fitted != shipped:
        print("NOTE: hpcrl/memory/fsdp_learner.py FIT differs:", json.dumps(shipped))
    errors(held, "held-out rows (never fitted)")
    errors(train, "training rows")
    for name, label in LATER:
        path = HERE / "results" / name
        if path.exists():
            errors([r for r in map(json.loads, path.read_text().splitlines()) if r.get("status") == "ok"], label)


if __name__ == "__main__":
    main()
