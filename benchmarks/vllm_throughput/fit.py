"""Fit the generation model's efficiencies on published vLLM rows and report the held-out error.

    python benchmarks/vllm_throughput/fit.py          # fit, then predicted vs published per row

Rows: cases.jsonl (each with its source). Every third row (by file order, starting with the first)
is held out; the fit (least squares on the generation time, three non-negative terms) never sees it.
The printed constants are the ones hpcrl/planning/generation.py carries.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import numpy as np

from hpcrl.memory.engine import engine_weights_bytes
from hpcrl.models.catalog import resolve_model
from hpcrl.planning.generation import EngineWork, generation_seconds, terms

HERE = Path(__file__).parent


def work(row: dict) -> EngineWork:
    m = resolve_model(row["model"])
    tp = int(row["tp"])
    return EngineWork(weights_bytes=engine_weights_bytes(m, tp), kv_bytes_per_token=m.kv_bytes_per_token(tp, 2),
                      layers=m.num_layers, active_params=m.active_params, q_dim=m.q_dim, tp=tp,
                      seqs=int(row["seqs"]), concurrent=int(row["seqs"]), prompt_len=int(row["input_len"]),
                      response_len=int(row["output_len"]), hbm_tbs=float(row["hbm_tbs"]),
                      bf16_tflops=float(row["bf16_tflops"]))


def published_s(row: dict) -> float:
    return row["seqs"] * row["output_len"] / row["output_tokens_s"]


def load() -> list[dict]:
    return [json.loads(x) for x in (HERE / "cases.jsonl").read_text().splitlines() if x.strip()]


def split(rows: list[dict]) -> tuple[list[dict], list[dict]]:
    return [r for i, r in enumerate(rows) if i % 3], [r for i, r in enumerate(rows) if i % 3 == 0]


def fit(rows: list[dict]) -> tuple[float, float, float]:
    """(efficiency, per-step overhead s, prefill mfu) minimising the relative error of the time."""
    a = np.array([terms(work(r))[:3] for r in rows])
    y = np.array([published_s(r) - terms(work(r))[3] for r in rows])
    w = 1 / y  # relative error: a 3 s row counts as much as a 300 s one
    x, *_ = np.linalg.lstsq(a * w[:, None], y * w, rcond=None)
    x = np.maximum(x, 1e-9)
    return 1 / x[0], x[1], 1 / x[2]


def table(rows: list[dict], eff: float, over: float, mfu: float) -> list[float]:
    ratios = []
    for r in rows:
        pred = generation_seconds(work(r), eff, over, mfu)
        pub = published_s(r)
        ratios.append(pub / pred)
        print(f"  {r['id']:<34} {r['tp']:>2} {r['input_len']:>7} {r['output_tokens_s']:>9.1f} "
              f"{r['seqs'] * r['output_len'] / pred:>9.1f} {pub / pred - 1:>+7.0%}")
    return ratios


def main() -> int:
    rows = load()
    train, held = split(rows)
    eff, over, mfu = fit(train)
    print(f"fit on {len(train)} rows: decode bandwidth efficiency {eff:.2f}, per-step overhead {over * 1e3:.2f} ms, "
          f"prefill MFU {mfu:.2f}")
    # error: predicted tokens/s over published, less one (negative: the model is too slow)
    head = f"  {'case':<34} {'tp':>2} {'input':>7} {'pub tok/s':>9} {'pred':>9} {'error':>7}"
    for name, part in (("fit rows", train), ("held-out rows", held)):
        print(f"{name}:\n{head}")
        ratios = table(part, eff, over, mfu)
        errs = [abs(r - 1) for r in ratios]
        print(f"  median |error| {statistics.median(errs):.0%}, max {max(errs):.0%}; published/predicted time "
              f"{min(ratios):.2f}..{max(ratios):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
