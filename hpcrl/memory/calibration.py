"""The committed GPU measurements and the planner's prediction for each (pure)."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from hpcrl.memory import constants as C
from hpcrl.memory.learner import LearnerSetup, deepspeed_estimate, learner_memory
from hpcrl.models import resolve_model

# Rows measured by hpcrl's harness (benchmarks/zero3_memory.py) and the reference rows
# measured by the same method elsewhere (shared/reference/zero3_calibration_given.jsonl).
RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
CALIBRATION_FILES = ("zero3_measured.jsonl", "zero3_reference_given.jsonl")


@dataclass(frozen=True)
class Row:
    source: str
    data: dict

    @property
    def ok(self) -> bool:
        return self.data.get("status") == "ok"

    @property
    def logits_copy(self) -> bool:
        """Did the harness divide the logits by a temperature (a bf16 copy) before log-probs?

        open-instruct does (`logits / temperature`); hpcrl's harness does it on the
        compiled path, and on the eager path with --hold-logits; the reference harness on
        both: its eager peaks sit exactly 2 x tokens x vocab bytes above hpcrl's plain
        eager rows, and equal hpcrl's --hold-logits rows to 0.01 GiB.
        """
        if "logits_temperature_copy" in self.data:
            return bool(self.data["logits_temperature_copy"])
        if self.source.endswith("zero3_reference_given.jsonl"):
            return True
        if self.data.get("logprob_impl") == "compiled":
            return True
        # hpcrl's eager path holds the extra bf16 copy only with --hold-logits.
        return bool(self.data.get("hold_logits", False))

    def setup(self) -> LearnerSetup:
        d = self.data
        return LearnerSetup(
            model=resolve_model(d["model"]),
            n_gpus=int(d["world"]),
            tokens_per_gpu=int(d["seq"]) * int(d.get("mb", 1)),
            zero_stage=int(d.get("zero_stage", 3)),  # type: ignore[arg-type]
            offload=d.get("offload", "none"),
            gradient_checkpointing=bool(d["gc"]),
            lora_rank=int(d.get("lora_rank") or 0),
            load_in_4bit=bool(d.get("load_in_4bit", False)),
            logprob_impl="eager" if str(d.get("logprob_impl", "eager")).startswith("eager") else "compiled",
            grad_accum_dtype=d.get("grad_accum_dtype", "bf16"),
            logits_copy=self.logits_copy,
        )


def load_rows(directory: Path = RESULTS) -> list[Row]:
    rows = []
    # The single-micro-batch ZeRO-3 rows the constants were fitted on; the K-micro-batch step rows
    # (zero3_timing.jsonl, openrlhf_measured.jsonl) have their own checks, fsdp_*.jsonl fit_fsdp.py.
    for path in sorted(directory / name for name in CALIBRATION_FILES):
        for line in path.read_text().splitlines():
            if line.strip():
                rows.append(Row(str(path), json.loads(line)))
    return rows


@dataclass(frozen=True)
class Comparison:
    row: Row
    measured_gib: float
    predicted_gib: float
    measured_reserved_gib: float
    predicted_reserved_gib: float
    deepspeed_gib: float

    @property
    def error(self) -> float:
        return (self.predicted_gib - self.measured_gib) / self.measured_gib

    @property
    def deepspeed_error(self) -> float:
        return (self.deepspeed_gib - self.measured_gib) / self.measured_gib


def compare(rows: list[Row]) -> list[Comparison]:
    out = []
    for row in rows:
        if not row.ok:
            continue
        mem = learner_memory(row.setup())
        spec = resolve_model(row.data["model"])
        out.append(
            Comparison(
                row=row,
                measured_gib=row.data["peak_alloc_gib"],
                predicted_gib=mem.peak_allocated / C.GIB,
                measured_reserved_gib=row.data["peak_reserved_gib"],
                predicted_reserved_gib=mem.peak_reserved / C.GIB,
                deepspeed_gib=deepspeed_estimate(spec, int(row.data["world"])) / C.GIB,
            )
        )
    return out


def summary(comps: list[Comparison]) -> dict:
    errs = [abs(c.error) for c in comps]
    ds = [abs(c.deepspeed_error) for c in comps]
    return {
        "rows": len(comps),
        "median_abs_error": statistics.median(errs) if errs else None,
        "max_abs_error": max(errs) if errs else None,
        "deepspeed_median_abs_error": statistics.median(ds) if ds else None,
        "deepspeed_max_abs_error": max(ds) if ds else None,
    }
