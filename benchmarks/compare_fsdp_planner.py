"""Peak allocated of the old ZeRO-formula answer for verl (what `plan-memory --backend verl` gave before
issue 24: hpcrl/memory/learner.py with fp32 gradients, the in-place temperature divide, the compiled
log-prob path and the no-config ZeRO++ copy of zpg 8) and of today's `hpcrl plan-memory --backend
verl` (the FSDP model, with the row's --micro-batches and --fsdp-version) against the measured rows;
then `plan-memory --backend verl` alone, peak allocated and reserved, against the held-out rows of
fsdp_heldout2.jsonl (Qwen3, Llama-3.2, LoRA, 32k: models the catalog lacks are given as the
config.json the row was measured with, LoRA as --lora-rank); then, per verl version, the held-out rows of
fsdp_current_verl.jsonl: the 1dda039b rows against plan-memory's default version (0.10.0.dev), the
b178a3cd rows against --framework-version b178a3cd.

    PYTHONPATH=. python benchmarks/compare_fsdp_planner.py
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

from hpcrl.memory.constants import GIB
from hpcrl.memory.learner import LearnerSetup, learner_memory

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from fit_fsdp import setup_of  # noqa: E402

HF = {"qwen2.5-0.5b": "Qwen/Qwen2.5-0.5B", "qwen2.5-1.5b": "Qwen/Qwen2.5-1.5B", "qwen2.5-3b": "Qwen/Qwen2.5-3B",
      "qwen2.5-7b": "Qwen/Qwen2.5-7B"}  # fmt: skip


def zero_formula_peak(row: dict) -> float:
    """The ZeRO-3 formula as the no-config verl path built it before issue 24 (derived, for comparison)."""
    s = setup_of(row)
    old = LearnerSetup(
        s.model,
        s.n_gpus,
        s.tokens_per_gpu,
        zero_stage=3,
        logprob_impl="compiled",
        grad_accum_dtype="fp32",
        logits_copy=False,
        reference_policy=s.reference_policy,
        hpz_partition_size=8,
    )
    return learner_memory(old).peak_allocated / GIB


# the harness's --offload as plan-memory says it (verl's param/optimizer offload moves state between updates only)
OFFLOAD = {"none": [], "verl": [], "cpu_policy": ["--offload", "params"]}


def planner_learner(row: dict, version: str | None = "b178a3cd") -> dict:
    """`plan-memory --backend verl --json`'s learner for the row's setup (version None: plan-memory's default)."""
    model = HF.get(row["model"]) or str(HERE / "configs" / f"{row['model']}.json")
    cmd = [sys.executable, "-m", "hpcrl", "plan-memory", "--backend", "verl", "--model", model,
           "--learner-gpus", str(row["world"]), "--tokens-per-gpu", str(row["seq"]),
           "--micro-batches", str(row["micro_batches"]), "--fsdp-version", str(row["fsdp"]),
           "--lora-rank", str(row.get("lora_rank") or 0), *OFFLOAD[row["offload"]],
           *(["--framework-version", version] if version else []),
           "--ref-policy" if row["ref"] else "--no-ref-policy", "--json"]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(out)["learner"]


def planner_peak(row: dict) -> float:
    return planner_learner(row)["peak_allocated_gib"]


def held_out_table(rows: list[dict], title: str, version: str | None) -> None:
    """plan-memory --backend verl against held-out rows: peak allocated and reserved, with their errors."""
    print(f"\n{title}:")
    print(
        "| model | N | T | K | FSDP | ref | offload | LoRA | measured peak | planned | err | phase | "
        "measured reserved | planned | err | GPU |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    pe, re_ = [], []
    for r in rows:
        d = planner_learner(r, version)
        pe.append(d["peak_allocated_gib"] / r["peak_alloc_gib"] - 1)
        re_.append(d["peak_reserved_gib"] / r["peak_reserved_gib"] - 1)
        print(f"| {r['model']} | {r['world']} | {r['seq']} | {r['micro_batches']} | {r['fsdp']} | {r['ref']} | {r['offload']} | "
              f"{r.get('lora_rank') or 0} | {r['peak_alloc_gib']:.2f} | {d['peak_allocated_gib']:.2f} | {pe[-1]:+.2%} | "
              f"{d['peak_phase']} | {r['peak_reserved_gib']:.2f} | {d['peak_reserved_gib']:.2f} | {re_[-1]:+.1%} | {r['gpu']} |")  # fmt: skip
    for label, e in (("peak allocated", pe), ("peak reserved", re_)):
        a = [abs(x) for x in e]
        print(f"{label}: median |err| {statistics.median(a):.2%}, max {max(a):.2%} over {len(a)} rows")


def ok_rows(name: str) -> list[dict]:
    return [r for r in map(json.loads, (HERE / "results" / name).read_text().splitlines()) if r.get("status") == "ok"]


def heldout2() -> None:
    held_out_table(
        [r for r in ok_rows("fsdp_heldout2.jsonl") if r["offload"] == "none"],
        "Held-out rows measured after the fit (fsdp_heldout2.jsonl), plan-memory --backend verl "
        "--framework-version b178a3cd",
        "b178a3cd",
    )


def current_verl() -> None:
    """fsdp_current_verl.jsonl, every row held out (fit_split_current_verl.py), per verl version."""
    rows = ok_rows("fsdp_current_verl.jsonl")
    held_out_table(
        [r for r in rows if r.get("verl") == "1dda039b"],
        "verl 1dda039b (0.10.0.dev) rows (fsdp_current_verl.jsonl, held out), plan-memory --backend verl "
        "at its default version",
        None,
    )
    held_out_table(
        [r for r in rows if r.get("verl") == "b178a3cd"],
        "verl b178a3cd (0.8.0.dev) rows of fsdp_current_verl.jsonl (held out), plan-memory --backend verl "
        "--framework-version b178a3cd",
        "b178a3cd",
    )


def main() -> None:
    rows = []
    for name in ("fsdp_measured.jsonl", "fsdp_post_fit.jsonl"):
        rows += [r for r in map(json.loads, (HERE / "results" / name).read_text().splitlines())
                 if r.get("status") == "ok" and r["offload"] == "none"]  # fmt: skip
    old, new = [], []
    print(
        "| model | N | T | K | FSDP | ref | measured | old ZeRO formula | err | plan-memory --backend verl | err | GPU |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        p_old = zero_formula_peak(r)
        p_new = planner_peak(r)
        m = r["peak_alloc_gib"]
        old.append(p_old / m - 1)
        new.append(p_new / m - 1)
        print(f"| {r['model']} | {r['world']} | {r['seq']} | {r['micro_batches']} | {r['fsdp']} | {r['ref']} | "
              f"{m:.2f} | {p_old:.2f} | {old[-1]:+.1%} | {p_new:.2f} | {new[-1]:+.2%} | {r['gpu']} |")  # fmt: skip
    for label, e in (("old ZeRO formula", old), ("plan-memory --backend verl", new)):
        a = [abs(x) for x in e]
        print(f"{label}: median |err| {statistics.median(a):.1%}, max {max(a):.1%} over {len(a)} rows")
    heldout2()
    current_verl()


if __name__ == "__main__":
    main()
