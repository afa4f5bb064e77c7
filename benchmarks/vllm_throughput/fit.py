"""Fit the generation model's constants on published vLLM rows and report the held-out error.

    python benchmarks/vllm_throughput/fit.py            # fit, then predicted vs published on every row
    python benchmarks/vllm_throughput/fit.py --check    # exit 1 unless generation.py carries this fit
    python benchmarks/vllm_throughput/fit.py --loo      # leave-one-out on the large-batch fit rows, with and
                                                        # without the cost per sequence per decode step

Rows, each with its source and every input it assumed: cases.jsonl (Qwen's batch-1 speed benchmark of
Qwen2 on vLLM 0.4.2, the V0 engine) and large_batch.jsonl (large-batch runs of the V1 engine). The split
was fixed before any fit was run (split.txt): in cases.jsonl every third row by file order, starting
with the first (the rule of the earlier batch-1 fit); in large_batch.jsonl the newer vLLM of the first
workload published on two versions, and every third of the rows added after it, by file order, starting
with the first. The fit never sees a held-out row.

The fit (least squares on log(published / predicted time), bounded) gives the HBM efficiency and the
matmul MFU that both engines share, the V1 engine's fixed cost per forward pass and its cost per sequence
per decode step (the two the planner uses), and V0's cost per pass (a CPU cost the V1 engine removed: fitted
so that the batch-1 rows do not bias the shared constants, never used by the planner). A row whose client
sent its requests at a rate adds the arrival span (arrival_span_s). The band is the range of published /
predicted time on the held-out rows, rounded outward to 0.05.
"""

from __future__ import annotations

import json
import math

import statistics
import sys
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from hpcrl.memory.constants import GIB
from hpcrl.memory.engine import EngineSetup, engine_memory, engine_weights_bytes
from hpcrl.memory.gpu_rates import GPU_PEAKS
from hpcrl.models.catalog import resolve_model
from hpcrl.planning import generation as g
from hpcrl.planning.engine_time import engine_work, matmul_flops_per_token
from hpcrl.planning.generation import Constants, EngineWork, generation_seconds

HERE = Path(__file__).parent
SPLIT = HERE / "split.txt"


def load() -> list[dict]:
    rows = []
    for name, engine in (("cases.jsonl", "v0"), ("large_batch.jsonl", "v1")):
        for line in (HERE / name).read_text().splitlines():
            if line.strip():
                rows.append({**json.loads(line), "engine": engine})
    return rows


def held_out_ids() -> set[str]:
    return {line.split()[0] for line in SPLIT.read_text().splitlines() if line and not line.startswith("#")}


def split(rows: list[dict]) -> tuple[list[dict], list[dict]]:
    held = held_out_ids()
    return [r for r in rows if r["id"] not in held], [r for r in rows if r["id"] in held]


def work(row: dict) -> EngineWork:
    """The row's engine as hpcrl sizes it: V1 rows get their KV pool from hpcrl's vLLM accounting."""
    m, tp = resolve_model(row["model"]), int(row["tp"])
    if row["engine"] == "v0":  # batch 1: no KV or scheduler limit binds; the whole prompt in one pass (V0)
        return EngineWork(
            weights_bytes=engine_weights_bytes(m, tp),
            kv_bytes_per_token=m.kv_bytes_per_token(tp, 2),
            kv_tokens=10**9,
            max_num_seqs=256,
            max_num_batched_tokens=max(1, row["input_len"]),
            matmul_flops_per_token=matmul_flops_per_token(m),
            layers=m.num_layers,
            q_dim=m.q_dim,
            tp=tp,
            seqs=int(row["seqs"]),
            prompt_len=int(row["input_len"]),
            response_len=int(row["output_len"]),
            hbm_tbs=float(row["hbm_tbs"]),
            bf16_tflops=float(row["bf16_tflops"]),
        )
    gpu = GPU_PEAKS[row["gpu"]]
    eng = engine_memory(
        EngineSetup(
            model=m,
            tp=tp,
            gpu_memory_utilization=row["gpu_memory_utilization"],
            gpu_total_bytes=gpu.memory_gib * GIB,
            max_seq_len=row["max_model_len"],
            max_num_batched_tokens=row["max_num_batched_tokens"],
            max_num_seqs=row["max_num_seqs"],
            vllm_version=row["accounting_version"],
        )
    )
    w = engine_work(
        eng, m, tp, int(row["num_prompts"]), int(row["input_len"]), int(row["output_len"]), gpu.hbm_tbs, gpu.bf16_tflops
    )
    return EngineWork(**{**w.__dict__, "client_cap": row.get("client_cap")})


def published_s(row: dict) -> float:
    if row.get("duration_s"):
        return float(row["duration_s"])
    n = row.get("num_prompts", row.get("seqs"))
    return n * row["output_len"] / row["output_tokens_s"]


def constants(x: np.ndarray, row: dict) -> Constants:
    """x = (HBM efficiency, matmul MFU, V1 per-pass cost, V0 per-pass cost, V1 cost per sequence per decode step).
    The batch-1 rows cannot tell a per-sequence cost from a per-pass one: V0 gets its per-pass cost only."""
    if row["engine"] == "v0":
        return Constants(float(x[0]), float(x[1]), float(x[3]), 0.0)
    return Constants(float(x[0]), float(x[1]), float(x[2]), float(x[4]))


def arrival_span_s(row: dict) -> float:
    """A client that sends at a request rate sends its last request (n - 1) / rate after its first (the Poisson
    arrivals' expected time). The run is taken as that span plus the engine's time for all n at once (derived: exact
    when the decode steps are bound by the weight reads, as the long-output rows are; an upper bound otherwise)."""
    rate = row.get("request_rate")
    return (int(row["num_prompts"]) - 1) / float(rate) if rate else 0.0


def predicted_s(x: np.ndarray, row: dict) -> float:
    return generation_seconds(work(row), constants(x, row)) + arrival_span_s(row)


def fit(rows: list[dict], per_sequence: bool = True) -> np.ndarray:
    """(HBM efficiency, MFU, V1 per-pass s, V0 per-pass s, V1 per-sequence s) minimising the log error of the time;
    per_sequence=False holds the per-sequence cost at 0 (the model without that term, for --loo)."""
    works = {r["id"]: work(r) for r in rows}

    def full(x: np.ndarray) -> np.ndarray:
        return x if per_sequence else np.append(x, 0.0)

    def residuals(x: np.ndarray) -> np.ndarray:
        return np.array(
            [
                math.log(
                    (generation_seconds(works[r["id"]], constants(full(x), r)) + arrival_span_s(r)) / published_s(r)
                )
                for r in rows
            ]
        )

    x0, low, high = [0.7, 0.4, 1e-3, 4e-3, 1e-6], [0.05, 0.05, 0.0, 0.0, 0.0], [1.0, 1.0, 0.02, 0.02, 1e-3]
    k = 5 if per_sequence else 4
    res = least_squares(residuals, x0=np.array(x0[:k]), bounds=(low[:k], high[:k]))
    return full(res.x)


def leave_one_out(train: list[dict]) -> None:
    """Each large-batch fit row predicted by a fit on the other fit rows, with and without the per-sequence cost:
    the evidence for that term, from the fit rows alone."""
    v1 = [r for r in train if r["engine"] == "v1"]
    print("leave-one-out on the large-batch fit rows (error of each row predicted by a fit on the others):")
    print(f"  {'row':<48} {'with':>6} {'without':>8}  (the cost per sequence per decode step)")
    errs: dict[bool, list[float]] = {True: [], False: []}
    for out in v1:
        rest = [r for r in train if r is not out]
        for flag in (True, False):
            errs[flag].append(predicted_s(fit(rest, flag), out) / published_s(out) - 1)
        print(f"  {out['id']:<48} {errs[True][-1]:>+6.0%} {errs[False][-1]:>+8.0%}")
    for flag, name in ((True, "with the term"), (False, "without it")):
        print("  " + summary(name, errs[flag]) + f", mean {statistics.mean(abs(e) for e in errs[flag]):.0%}")


def rounded(x: np.ndarray) -> tuple[float, float, float, float, float]:
    """The constants as generation.py carries them (per-pass costs in ms, the per-sequence cost in us)."""
    return (
        round(float(x[0]), 2),
        round(float(x[1]), 2),
        round(float(x[2]) * 1e3, 2),
        round(float(x[3]) * 1e3, 2),
        round(float(x[4]) * 1e6, 1),
    )


def band(x: np.ndarray, held: list[dict]) -> tuple[float, float]:
    ratios = [published_s(r) / predicted_s(x, r) for r in held]
    return math.floor(min(ratios) / 0.05) * 0.05, math.ceil(max(ratios) / 0.05) * 0.05


def table(x: np.ndarray, rows: list[dict]) -> list[float]:
    errs = []
    print(
        f"  {'row':<48} {'eng':>3} {'tp':>2} {'seqs':>5} {'conc':>5} {'in':>6} {'out':>5} {'pub s':>8} "
        f"{'pred s':>8} {'error':>6}"
    )
    for r in rows:
        w = work(r)
        pred, pub = predicted_s(x, r), published_s(r)
        errs.append(pred / pub - 1)
        print(
            f"  {r['id']:<48} {r['engine']:>3} {r['tp']:>2} {w.seqs:>5} {w.concurrency:>5} {w.prompt_len:>6} "
            f"{w.response_len:>5} {pub:>8.1f} {pred:>8.1f} {pred / pub - 1:>+6.0%}"
        )
    return errs


def summary(name: str, errs: list[float]) -> str:
    a = [abs(e) for e in errs]
    return f"{name} ({len(a)}): median |error| {statistics.median(a):.0%}, max {max(a):.0%}"


def carried() -> tuple[float, float, float, float]:
    return g.DECODE_BW_EFFICIENCY, g.MATMUL_MFU, round(g.STEP_OVERHEAD_S * 1e3, 2), round(g.SEQ_STEP_S * 1e6, 1)


def main(argv: list[str]) -> int:
    rows = load()
    train, held = split(rows)
    if "--loo" in argv:
        leave_one_out(train)
        return 0
    x = fit(train)
    eff, mfu, o1, o0, seq = rounded(x)
    low, high = band(x, held)
    if "--check" in argv:
        ok = (eff, mfu, o1, seq) == carried() and (
            (round(low, 2), round(high, 2)) == (g.GENERATION_LOW, g.GENERATION_HIGH)
        )
        print(
            "generation.py carries this fit"
            if ok
            else f"generation.py {carried()} band "
            f"{(g.GENERATION_LOW, g.GENERATION_HIGH)}; the fit gives {(eff, mfu, o1, seq)} band {(low, high)}"
        )
        return 0 if ok else 1
    print(
        f"fit on {len(train)} rows: HBM efficiency {eff:.2f}, matmul MFU {mfu:.2f}, V1 cost per pass {o1:.2f} ms "
        f"and per sequence per decode step {seq:.1f} us"
    )
    print(f"(V0: {o0:.2f} ms per pass, the batch-1 rows' engine; not used by the planner)")
    print("error = predicted / published time - 1 (positive: the model predicts too long a time)")
    for name, part in (("fit rows", train), ("held-out rows", held)):
        print(f"{name}:")
        errs = table(x, part)
        print("  " + summary("all", errs))
        for engine in ("v0", "v1"):
            sub = [e for e, r in zip(errs, part) if r["engine"] == engine]
            if sub:
                print("  " + summary(f"{engine} rows", sub))
    print(f"band (published / predicted time on the held-out rows, rounded outward): {low:.2f}-{high:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


__all__ = ["arrival_span_s", "band", "fit", "leave_one_out", "load", "published_s", "rounded", "split", "work"]
