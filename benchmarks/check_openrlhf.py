"""`hpcrl plan-memory --config openrlhf-grpo-qwen2.5-7b` against the OpenRLHF-faithful ZeRO-3 rows.

Each ok row of results/openrlhf_measured.jsonl is asked as that shipped config with the row's
setting through --set (model, tokens per GPU, adam offload, LoRA rank, the KL term that creates the
reference) and --learner-gpus; the planner's learner peak allocated is compared with the actor
process's measured peak allocated. The model has no constant fitted to these rows (its OpenRLHF
terms are derived from OpenRLHF's code, hpcrl/memory/constants.py), so every row is a check; the
rows zero3_steps_split.txt holds out are reported apart. Reserved memory and the GPU total (the
measured `cudaMemGetInfo` use, the reference process included) are printed beside, not held to a bound. Run: PYTHONPATH=. python3 benchmarks/check_openrlhf.py
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROWS = HERE / "results" / "openrlhf_measured.jsonl"
SPLIT = HERE / "zero3_steps_split.txt"
CONFIG = "openrlhf-grpo-qwen2.5-7b"
MODELS = {
    "qwen2.5-1.5b": "Qwen/Qwen2.5-1.5B",
    "qwen2.5-3b": "Qwen/Qwen2.5-3B",
    "qwen2.5-7b": "Qwen/Qwen2.5-7B",
    "llama-3.1-8b": "meta-llama/Llama-3.1-8B",
}


def held_out() -> set[str]:
    return {
        parts[1]
        for line in SPLIT.read_text().splitlines()
        if not line.startswith("#") and len(parts := line.split()) == 3 and parts[2] == "held"
    }


def command(row: dict) -> list[str]:
    """The plan-memory call that asks for the row's run."""
    t = int(row["seq"])
    sets = {
        "actor.model_name_or_path": MODELS[row["model"]],
        "train.micro_batch_size": 1,
        "data.max_len": t,
        "rollout.max_new_tokens": t // 2,
        "ds.adam_offload": str(row["offload"] == "optimizer").lower(),
        "ds.lora.rank": int(row["lora_rank"]),
        "algo.kl.init_coef": 0.001 if row["ref"] else 0,
        "actor.gradient_checkpointing_enable": str(bool(row["gc"])).lower(),
    }
    argv = [
        sys.executable,
        "-m",
        "hpcrl",
        "plan-memory",
        "--config",
        CONFIG,
        "--learner-gpus",
        str(row["world"]),
        "--json",
    ]
    for k, v in sets.items():
        argv += ["--set", f"{k}={v}"]
    return argv


def predicted(row: dict) -> dict:
    out = subprocess.run(command(row), capture_output=True, text=True, env=dict(os.environ), check=True).stdout
    return json.loads(out)["learner"]


def main() -> int:
    held = held_out()
    rows = [json.loads(x) for x in ROWS.read_text().splitlines() if x.strip()]
    errs: dict[str, list[float]] = {"held": [], "fit": []}
    print(
        "| row | model | GPUs | tokens | offload | LoRA | ref | measured GiB | planned GiB | error | moment "
        "| reserved: measured / planned | GPU total: measured / planned |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if r.get("status") != "ok":
            continue
        p = predicted(r)
        err = p["peak_allocated_gib"] / r["peak_alloc_gib"] - 1
        which = "held" if r["tag"] in held else "fit"
        errs[which].append(abs(err))
        print(
            f"| {r['tag']}{' (held)' if which == 'held' else ''} | {r['model']} | {r['world']} | {r['seq']} | "
            f"{r['offload']} | {r['lora_rank']} | {r['ref']} | {r['peak_alloc_gib']:.2f} | "
            f"{p['peak_allocated_gib']:.2f} | {err * 100:+.1f}% | {p['peak_phase']} | "
            f"{r['peak_reserved_gib']:.1f} / {p['peak_reserved_gib']:.1f} | "
            f"{r['device_used_max_gib']:.1f} / {p['device_total_gib']:.1f} |"
        )
    for which, e in errs.items():
        if e:
            print(
                f"\n{which} rows ({len(e)}): peak allocated median |error| {statistics.median(e) * 100:.2f}%, "
                f"max {max(e) * 100:.2f}%"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
