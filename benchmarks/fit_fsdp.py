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
* reserved: a sum over CUDA streams (fsdp_learner.stream_reserved); the side streams have no fitted
  constant. Over the rows with expandable segments (verl's setting) of the training split and the `fit:`
  rows of results/fsdp_streams.jsonl (whose split the matrix's tags fixed before the run), peak reserved
  minus that sum with no default-stream cache is fitted per FSDP version: FSDP1 a fixed part (the
  median), FSDP2 least squares on a + b * (the root unit's fp32 gradient bytes, 0 under LoRA); the
  margin is the largest under-prediction of a row left out of that fit (leave-one-out), rounded up.
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
from hpcrl.memory.learner_result import non_torch_bytes
from hpcrl.models.spec import ModelSpec
from hpcrl.planning.backends.verl_memory import fsdp_update

HERE = Path(__file__).resolve().parent
STREAMS = HERE / "results" / "fsdp_streams.jsonl"
# Rows measured after the fit, never read by it: (file in results/, heading of its table)
LATER = (
    (
        "fsdp_post_fit.jsonl",
        "rows measured after the fit (fsdp_post_fit.jsonl; the 3B ref row showed the reference root term at every moment)",
    ),
    (
        "fsdp_heldout2.jsonl",
        "rows measured after the fit, new architectures, LoRA and 32k tokens (fsdp_heldout2.jsonl: Qwen3, Llama-3.2, "
        "verl's fp32 LoRA adapters)",
    ),
)


def setup_of(row: dict) -> F.FsdpSetup:
    raw = json.loads((HERE / "configs" / f"{row['model']}.json").read_text())
    spec = ModelSpec.from_hf_config(raw, row["model"])
    offload = {"none": "none", "verl": "param_optimizer", "cpu_policy": "cpu_policy"}[row["offload"]]
    # verl's LoRA targets all-linear (fsdp_memory.py --lora-rank): every projection ModelSpec knows
    adapters = spec.lora_params(row["lora_rank"]) if row.get("lora_rank") else 0
    # rows of verl 1dda039b (the engine workers) take that version's update facts from its capabilities
    update = fsdp_update("verl", "1dda039b") if row.get("verl") == "1dda039b" else F.VerlUpdate()
    return F.FsdpSetup(spec, row["world"], row["seq"], row["micro_batches"], row["fsdp"], bool(row["ref"]), offload,
                       adapters, update)  # fmt: skip


def load(path: Path) -> tuple[list[dict], list[dict]]:
    ok = [r for r in map(json.loads, path.read_text().splitlines()) if r.get("status") == "ok"]
    return [r for i, r in enumerate(ok) if i % 3 != 2], [r for i, r in enumerate(ok) if i % 3 == 2]


def lstsq(xs: list[float], ys: list[float]) -> tuple[float, float]:
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return my - b * mx, b


def card_bound_gib(row: dict) -> float:
    """The most the allocator can reserve on the row's card: its memory less the CUDA context and NCCL buffers."""
    return row["total_gib"] - non_torch_bytes(row["world"]) / GIB


def at_card(row: dict) -> bool:
    """The row reserved within 1 GiB of its card's bound: the allocator had to give cached blocks back, so its
    reserved peak says what the card held, not the streams' high-waters (the 7B FSDP1 rows on 80 GB H100s)."""
    return row["peak_reserved_gib"] > card_bound_gib(row) - 1.0


def reserved_on_card_gib(b: F.FsdpBreakdown, row: dict) -> float:
    """The predicted reserved peak as the row's card can show it (at most its bound)."""
    return min(b.reserved_gib, card_bound_gib(row))


def fit(train: list[dict], stream_rows: list[dict]) -> dict:
    zero = {k: 0.0 for k in F.FIT}
    F.FIT.update(zero)
    lx, ly, gres, sres = [], [], [], []
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
    a, b = lstsq(lx, ly)
    out = {
        "logits_fixed_gib": round(a / GIB, 3),
        "logits_per_token_hidden": round(b, 1),
        "grads_done_fixed_gib": round(statistics.median(gres) / GIB, 3) if gres else 0.0,
        "step_fixed_gib": round(statistics.median(sres) / GIB, 3),
    }
    F.FIT.update(out)
    # reserved: what the default stream caches above its largest live moment, over the rows with
    # expandable segments (verl leaves them on); the side streams are counted, not fitted.
    rx: dict[int, list] = {1: [], 2: []}
    ry: dict[int, list] = {1: [], 2: []}
    rbase: dict[int, list] = {1: [], 2: []}
    for r in [r for r in train + stream_rows if r["expandable"] and not at_card(r)]:
        s = setup_of(r)
        base = F.fsdp_learner_memory(s).reserved_bytes  # the stream sum with no default-stream cache
        rx[s.fsdp_version].append(F.root_grad_bytes(s))  # FSDP2: the fp32 V x h root gradient
        ry[s.fsdp_version].append(r["peak_reserved_gib"] * GIB - base)
        rbase[s.fsdp_version].append(base)
    ra1, _ = slack_fit(1, rx[1], ry[1])
    ra2, rb2 = slack_fit(2, rx[2], ry[2])
    out |= {
        "default_slack_gib_fsdp1": round(ra1 / GIB, 2),
        "default_slack_gib_fsdp2": round(ra2 / GIB, 2),
        "default_slack_per_root_grad_fsdp2": round(rb2, 2),
    }
    F.FIT.update(out)
    return out | {"margin_fraction": loo_margin(rx, ry, rbase)}


def slack_fit(v: int, xs: list[float], ys: list[float]) -> tuple[float, float]:
    """(a, b) of the default stream's cache a + b x: FSDP1 the median (b = 0), FSDP2 least squares."""
    return (statistics.median(ys), 0.0) if v == 1 else lstsq(xs, ys)


def loo_margin(rx: dict[int, list], ry: dict[int, list], rbase: dict[int, list]) -> float:
    """The verdict's allocator margin: the largest under-prediction of reserved when each row is left out
    of the cache fit (what a row the fit has not seen can need), rounded up to a percent."""
    worst = 0.0
    for v in (1, 2):
        for i, (x, y) in enumerate(zip(rx[v], ry[v])):
            ra, rb = slack_fit(v, rx[v][:i] + rx[v][i + 1 :], ry[v][:i] + ry[v][i + 1 :])
            worst = max(worst, (y - ra - rb * x) / (rbase[v][i] + ra + rb * x))
    return math.ceil(worst * 100) / 100


def errors(rows: list[dict], label: str) -> None:
    print(
        f"\n{label}: {len(rows)} rows (GiB; error = predicted / measured - 1; a row that reserved up to its card "
        "is compared with the card's bound, shown as (card B))"
    )
    print(
        "| model | N | T | K | FSDP | ref | offload | LoRA | measured peak | predicted | err | moment | measured reserved | predicted | err | GPU |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    pe, re_ = [], []
    for r in rows:
        b = F.fsdp_learner_memory(setup_of(r))
        e, er = b.peak_gib / r["peak_alloc_gib"] - 1, reserved_on_card_gib(b, r) / r["peak_reserved_gib"] - 1
        pe.append(abs(e))
        re_.append(abs(er))
        print(f"| {r['model']} | {r['world']} | {r['seq']} | {r['micro_batches']} | {r['fsdp']} | {r['ref']} | "
              f"{r['offload']} | {r.get('lora_rank') or 0} | {r['peak_alloc_gib']:.2f} | {b.peak_gib:.2f} | {e:+.2%} | {b.peak_moment} | "
              f"{r['peak_reserved_gib']:.2f} | {b.reserved_gib:.2f}{' (card ' + format(card_bound_gib(r), '.1f') + ')' if at_card(r) else ''} | "
              f"{er:+.1%} | {r['gpu']} |")  # fmt: skip
    under = sum(
        r["peak_reserved_gib"]
        > reserved_on_card_gib(F.fsdp_learner_memory(setup_of(r)), r) * (1 + F.FIT["margin_fraction"])
        for r in rows
    )
    print(f"peak allocated: median |err| {statistics.median(pe):.2%}, max {max(pe):.2%}; "
          f"reserved: median {statistics.median(re_):.1%}, max {max(re_):.1%}; "
          f"rows whose reserved exceeds prediction + margin: {under}")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default=str(HERE / "results" / "fsdp_measured.jsonl"))
    args = p.parse_args()
    train, held = load(Path(args.rows))
    streams = [r for r in map(json.loads, STREAMS.read_text().splitlines()) if r.get("status") == "ok"]
    stream_fit = [r for r in streams if r["tag"].startswith("fit:")]
    shipped = dict(F.FIT)
    fitted = fit(train, stream_fit)
    F.FIT.update(fitted)
    print("fitted constants:", json.dumps(fitted))
    if fitted != shipped:
        print("NOTE: hpcrl/memory/fsdp_learner.py FIT differs:", json.dumps(shipped))
    errors(held, "held-out rows (never fitted)")
    errors(
        [r for r in streams if not r["tag"].startswith("fit:")],
        "per-stream rows held out by their tag (fsdp_streams.jsonl, measured before this fit was written)",
    )
    errors(train, "training rows")
    errors(stream_fit, "per-stream training rows (fsdp_streams.jsonl fit:)")
    for name, label in LATER:
        path = HERE / "results" / name
        if path.exists():
            errors([r for r in map(json.loads, path.read_text().splitlines()) if r.get("status") == "ok"], label)


if __name__ == "__main__":
    main()
