"""Print the measured rows as a markdown table (and the check against the given rows).

Run: python benchmarks/summarize.py [results/zero3_measured.jsonl] [given.jsonl]
     python benchmarks/summarize.py results/fsdp_measured.jsonl   (fsdp_memory.py rows)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
KEY = ("model", "seq", "gc", "offload", "world", "logprob_impl")


def load(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def table(rows: list[dict]) -> str:
    head = (
        "| model | world | T | gc | offload | logprobs | lora | hold | status | after init | peak alloc "
        "| peak reserved | fwd / logprob / bwd / step peaks | shared |"
    )
    out = [head, "|" + "---|" * (head.count("|") - 1)]
    order = sorted(
        rows, key=lambda r: (r["world"], r["model"], r["lora_rank"], r["offload"], r["gc"], r["seq"], r["logprob_impl"])
    )
    for r in order:
        ph = r.get("phase_peaks_gib") or {}
        phases = " / ".join(f"{ph[k]:.1f}" for k in ("forward", "logprob", "backward", "step") if k in ph)
        fmt = lambda v: f"{v:.2f}" if isinstance(v, (int, float)) else "-"  # noqa: E731
        out.append(
            f"| {r['model']} | {r['world']} | {r['seq']} | {r['gc']} | {r['offload']} | {r['logprob_impl']} | "
            f"{r['lora_rank']} | {r.get('hold_logits', 0)} | {r['status']} | {fmt(r.get('after_init_gib'))} | "
            f"{fmt(r.get('peak_alloc_gib'))} | {fmt(r.get('peak_reserved_gib'))} | {phases} | {r.get('shared_gpu_with', 0)} |"
        )
    return "\n".join(out)


def fsdp_table(rows: list[dict]) -> str:
    """fsdp_memory.py rows: memory per phase and the times issue 26 asks for (micro-batch, step)."""
    head = ("| model | world | T | K | FSDP | ref | offload | entropy | expandable | status | after init | peak alloc "
            "| peak reserved | old logprob / last fwd / last bwd / step peaks | micro-batch s | step s | shared | GPU |")  # fmt: skip
    out = [head, "|" + "---|" * (head.count("|") - 1)]
    order = sorted(
        rows, key=lambda r: (r["world"], r["model"], r["seq"], r["micro_batches"], r["fsdp"], r["ref"], r["offload"])
    )
    fmt = lambda v: f"{v:.2f}" if isinstance(v, (int, float)) else "-"  # noqa: E731
    for r in order:
        ph = r.get("phase_peaks_gib") or {}
        last = [
            ph.get("old_logprob"),
            (ph.get("forward") or [None])[-1],
            (ph.get("backward") or [None])[-1],
            ph.get("step"),
        ]
        mb = r.get("micro_batch_s") or []
        out.append(
            f"| {r['model']}{f' LoRA r{lr}' if (lr := r.get('lora_rank')) else ''} | {r['world']} | {r['seq']} | "
            f"{r['micro_batches']} | {r['fsdp']} | {r['ref']} | "
            f"{r['offload']} | {r.get('entropy', 0)} | {r.get('expandable', 1)} | {r['status']} | "
            f"{fmt(r.get('after_init_gib'))} | {fmt(r.get('peak_alloc_gib'))} | {fmt(r.get('peak_reserved_gib'))} | "
            f"{' / '.join(fmt(v) for v in last)} | {' '.join(f'{t:.2f}' for t in mb) or '-'} | "
            f"{fmt(r.get('optimizer_step_s'))} | {r.get('shared_gpu_with', 0)} | {r.get('gpu', '-').replace('NVIDIA ', '')} |"
        )
    return "\n".join(out)


def check(rows: list[dict], given: list[dict]) -> str:
    out = ["| given row | hold logits | given peak | measured peak | diff (MiB) | given after init | measured after init |",
           "|---|---|---|---|---|---|---|"]  # fmt: skip
    for g in given:
        for r in rows:
            if all(r.get(k) == g.get(k) for k in KEY) and r.get("lora_rank", 0) == 0:
                out.append(
                    f"| {g['model']} T={g['seq']} gc={g['gc']} world={g['world']} | {r.get('hold_logits', 0)} | "
                    f"{g['peak_alloc_gib']:.4f} | {r['peak_alloc_gib']:.4f} | "
                    f"{(r['peak_alloc_gib'] - g['peak_alloc_gib']) * 1024:+.1f} | {g['after_init_gib']:.4f} | "
                    f"{r['after_init_gib']:.4f} |"
                )
    return "\n".join(out)


def main() -> None:
    rows = load(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "results" / "zero3_measured.jsonl")
    default_given = HERE.parent.parent / "shared" / "reference" / "zero3_calibration_given.jsonl"
    given_path = Path(sys.argv[2]) if len(sys.argv) > 2 else default_given
    if rows and rows[0].get("harness") == "fsdp_memory":
        print(fsdp_table(rows))
        return
    print(table(rows))
    if given_path.exists():
        print()
        print(check(rows, load(given_path)))


if __name__ == "__main__":
    main()
