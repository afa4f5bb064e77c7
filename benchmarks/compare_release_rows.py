"""hpcrl's learner model against the rows measured with the released frameworks' own update code.

    python benchmarks/compare_release_rows.py > benchmarks/results/release_rows_vs_planner.txt

verl 0.9.1 (benchmarks/results/verl_release_engine.jsonl: verl's TrainingWorker/FSDPEngine from the wheel) and
OpenRLHF 0.11.2 (benchmarks/results/openrlhf_release_actor.jsonl: its Actor and DeepspeedStrategy). No constant
of the model was fitted to these rows. Two 0.9.1 facts were read off them and say so in the release's capability
file: the tied weight held once in the FSDP1 flat parameters (their after-init memory), and the
divide skipped at temperature 1 (read in the engine's code; its 2 B x T x V is derived).
"""

from __future__ import annotations

import json
from pathlib import Path

from hpcrl.memory.constants import GIB
from hpcrl.memory.fsdp_learner import FsdpSetup, fsdp_learner_memory
from hpcrl.memory.learner import LearnerSetup, learner_memory
from hpcrl.models import resolve_model
from hpcrl.planning.backends import get_backend
from hpcrl.planning.backends.verl_memory import fsdp_update

RESULTS = Path(__file__).with_name("results")


def rows(name: str) -> list[dict]:
    return [r for r in map(json.loads, (RESULTS / name).read_text().splitlines()) if r.get("status") == "ok"]


def verl_prediction(r: dict) -> tuple[float, float]:
    update = fsdp_update("verl", r["release"], bool(r["no_sync"]), r["temperature"])
    b = fsdp_learner_memory(
        FsdpSetup(
            resolve_model(r["model"]),
            r["world"],
            r["tokens_per_micro_batch"],
            r["micro_batches"],
            r["fsdp"],
            False,
            "none",
            0,
            update,
        )
    )
    return b.peak_bytes / GIB, b.reserved_bytes / GIB


def openrlhf_prediction(r: dict) -> tuple[float, float]:
    backend = get_backend("openrlhf")
    s = LearnerSetup(
        model=resolve_model(r["model"]),
        n_gpus=r["world"],
        tokens_per_gpu=r["tokens_per_micro_batch"],
        zero_stage=3,
        gradient_checkpointing=True,
        logprob_impl="eager",
        grad_accum_dtype="bf16",
        reference_policy=False,
        hpz_partition_size=1,
        logits_copy=False,
        micro_batches=r["micro_batches"],
        **dict(backend.learner_fixed(r["release"])),
    )
    m = learner_memory(s)
    return m.peak_allocated / GIB, m.peak_reserved / GIB


def main() -> None:
    print(f"{'row':<58} {'GPU':<14} {'alloc meas':>10} {'pred':>7} {'err':>7} {'resv meas':>10} {'pred':>7} {'err':>7}")
    for name, predict in (
        ("verl_release_engine.jsonl", verl_prediction),
        ("openrlhf_release_actor.jsonl", openrlhf_prediction),
    ):
        for r in rows(name):
            alloc, resv = predict(r)
            what = (
                f"{r['framework']} {r['release']} {r['model']} N={r['world']} T={r['tokens_per_micro_batch']} "
                f"K={r['micro_batches']}" + (f" no_sync={r['no_sync']}" if "no_sync" in r else "")
            )
            gpu = f"{r['gpu'].removeprefix('NVIDIA ')} x{r['world']}"
            print(
                f"{what:<58} {gpu:<14} {r['peak_alloc_gib']:>10.2f} {alloc:>7.2f} {alloc / r['peak_alloc_gib'] - 1:>+7.1%} "
                f"{r['peak_reserved_gib']:>10.2f} {resv:>7.2f} {resv / r['peak_reserved_gib'] - 1:>+7.1%}"
            )


if __name__ == "__main__":
    main()
