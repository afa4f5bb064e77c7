"""Peak allocated of `hpcrl plan-memory --backend verl` (today's ZeRO-based answer) and of
hpcrl/memory/fsdp_learner.py against the measured verl FSDP rows.

    PYTHONPATH=. python benchmarks/compare_fsdp_planner.py
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

from hpcrl.memory import fsdp_learner as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from fit_fsdp import setup_of  # noqa: E402

HF = {"qwen2.5-0.5b": "Qwen/Qwen2.5-0.5B", "qwen2.5-1.5b": "Qwen/Qwen2.5-1.5B", "qwen2.5-3b": "Qwen/Qwen2.5-3B",
      "qwen2.5-7b": "Qwen/Qwen2.5-7B"}  # fmt: skip


def planner_peak(row: dict, cache: dict) -> float:
    key = (row["model"], row["world"], row["seq"], row["ref"])
    if key not in cache:
        cmd = [sys.executable, "-m", "hpcrl", "plan-memory", "--backend", "verl", "--model", HF[row["model"]],
               "--learner-gpus", str(row["world"]), "--tokens-per-gpu", str(row["seq"]),
               "--ref-policy" if row["ref"] else "--no-ref-policy", "--json"]  # fmt: skip
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        cache[key] = json.loads(out)["learner"]["peak_allocated_gib"]
    return cache[key]


def main() -> None:
    rows = []
    for name in ("fsdp_measured.jsonl", "fsdp_post_fit.jsonl"):
        rows += [r for r in map(json.loads, (HERE / "results" / name).read_text().splitlines())
                 if r.get("status") == "ok" and r["offload"] == "none"]  # fmt: skip
    cache: dict = {}
    old, new = [], []
    print("| model | N | T | K | FSDP | ref | measured | plan-memory --backend verl | err | fsdp_learner | err |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        p_old = planner_peak(r, cache)
        p_new = F.fsdp_learner_memory(setup_of(r)).peak_gib
        m = r["peak_alloc_gib"]
        old.append(p_old / m - 1)
        new.append(p_new / m - 1)
        print(f"| {r['model']} | {r['world']} | {r['seq']} | {r['micro_batches']} | {r['fsdp']} | {r['ref']} | "
              f"{m:.2f} | {p_old:.2f} | {old[-1]:+.1%} | {p_new:.2f} | {new[-1]:+.2%} |")  # fmt: skip
    for label, e in (("plan-memory --backend verl", old), ("fsdp_learner", new)):
        a = [abs(x) for x in e]
        print(f"{label}: median |err| {statistics.median(a):.1%}, max {max(a):.1%} over {len(a)} rows")


if __name__ == "__main__":
    main()
