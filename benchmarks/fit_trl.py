"""Fit the TRL learner's two fitted constants and check the model on the held-out rows.

Rows: results/trl_measured.jsonl (TRL 1.16.0's GRPOTrainer loss path under DeepSpeed 0.19.8 ZeRO-3, 2x NVIDIA
H200; benchmarks/trl_memory.py), split by trl_split.txt, written before the run. Fitted on the fit rows by least
squares on the relative error of the peak allocated memory: PADDED_ATTENTION_BYTES (per [rows x heads x seq x
seq] element, grid 0.02) and FUSED_TIED_COPIES (bf16 [vocab x hidden] copies, tied embeddings at N > 1, grid
0.25); the allocator margin: the largest (measured - fitted) / fitted reserved among the fit rows whose fitted
reserved is 24 GiB or more (rounded up to 0.01), as constants.py does for the other paths. Every other term is
the calibrated DeepSpeed model with TRL's fused head (hpcrl/memory/learner.py fused_head_bytes, derived).

    PYTHONPATH=. python3 benchmarks/fit_trl.py [--check]    # --check: exit 1 where constants.py differs
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

from hpcrl.memory import constants as C
from hpcrl.memory.learner import LearnerSetup, learner_memory
from hpcrl.models import resolve_model

HERE = Path(__file__).resolve().parent
ROWS, SPLIT = HERE / "results" / "trl_measured.jsonl", HERE / "trl_split.txt"
MODELS = {
    "qwen2.5-0.5b": "Qwen/Qwen2.5-0.5B",
    "qwen2.5-1.5b": "Qwen/Qwen2.5-1.5B",
    "qwen2.5-3b": "Qwen/Qwen2.5-3B",
    "qwen2.5-7b": "Qwen/Qwen2.5-7B",
}


def held_out() -> set[str]:
    return {
        p[0]
        for line in SPLIT.read_text().splitlines()
        if not line.startswith("#") and len(p := line.split()) == 2 and p[1] == "held"
    }


def setup(row: dict) -> LearnerSetup:
    """The learner the row measured, as hpcrl's trl backend plans it (bf16 gradient partitions: the DeepSpeed
    JSON sets no grad_accum_dtype; no ZeRO++; the reference in the process when beta > 0)."""
    return LearnerSetup(
        model=resolve_model(MODELS[row["model"]]),
        n_gpus=row["world"],
        tokens_per_gpu=row["tokens_per_gpu"],
        logprob_impl="fused_head",
        logprob_tokens=row["completion_tokens_per_gpu"],
        padded_rows=row["batch"],
        grad_accum_dtype="bf16",
        logits_copy=False,
        reference_policy=row["beta"] > 0,
        hpz_partition_size=1,
        gradient_checkpointing=bool(row["gc"]),
    )


def predicted(row: dict, k: float, c: float) -> tuple[float, float]:
    """(peak allocated, peak reserved) in bytes with the two constants set to k and c."""
    old = (C.PADDED_ATTENTION_BYTES, C.FUSED_TIED_COPIES)
    C.PADDED_ATTENTION_BYTES, C.FUSED_TIED_COPIES = k, c
    try:
        lm = learner_memory(setup(row))
    finally:
        C.PADDED_ATTENTION_BYTES, C.FUSED_TIED_COPIES = old
    return lm.peak_allocated, lm.peak_reserved


def main(argv: list[str]) -> int:
    rows = [r for r in map(json.loads, ROWS.read_text().splitlines()) if r.get("status") == "ok"]
    held = held_out()
    fit = [r for r in rows if r["shape_tag"] not in held]

    def loss(k: float, c: float) -> float:
        return sum((predicted(r, k, c)[0] / (r["peak_alloc_gib"] * C.GIB) - 1) ** 2 for r in fit)

    k, c = min(((i / 50, j / 4) for i in range(151) for j in range(25)), key=lambda kc: loss(*kc))
    excess = [(r["peak_reserved_gib"] * C.GIB - res) / res for r in fit if (res := predicted(r, k, c)[1]) >= 24 * C.GIB]
    margin = math.ceil(max(excess) * 100) / 100
    print(f"fitted: PADDED_ATTENTION_BYTES {k:g}, FUSED_TIED_COPIES {c:g}, allocator margin {margin:.2f}")
    print("| row | split | measured GiB | planned GiB | error | reserved measured / planned |")
    print("|---|---|---|---|---|---|")
    errs: dict[str, list[float]] = {"fit": [], "held": []}
    for r in rows:
        a, res = predicted(r, k, c)
        err = a / (r["peak_alloc_gib"] * C.GIB) - 1
        which = "held" if r["shape_tag"] in held else "fit"
        errs[which].append(abs(err))
        print(
            f"| {r['shape_tag']} | {which} | {r['peak_alloc_gib']:.2f} | {a / C.GIB:.2f} | {err * 100:+.1f}% | "
            f"{r['peak_reserved_gib']:.1f} / {res / C.GIB:.1f} |"
        )
    for which, e in errs.items():
        print(
            f"\n{which} rows ({len(e)}): peak allocated median |error| {statistics.median(e) * 100:.2f}%, "
            f"max {max(e) * 100:.2f}%"
        )
    if "--check" in argv:
        now = (C.PADDED_ATTENTION_BYTES, C.FUSED_TIED_COPIES, C.FUSED_HEAD_MARGIN[0])
        if not all(math.isclose(a, b) for a, b in zip(now, (k, c, margin))):
            print(f"constants.py differs from the fit: {now} != {(k, c, margin)}")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
