"""Write the matrix files that run_matrix.py runs (benchmarks/matrices/*.txt).

Each line gets rough estimates of wall time and peak GPU memory, used only to schedule
(pack launches onto a GPU, skip what the budget cannot finish); they are not results.
Run: python benchmarks/make_matrices.py
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
GIB = float(1 << 30)


def arch(model: str) -> dict:
    return json.loads((HERE / "configs" / f"{model}.json").read_text())


def estimate(model, seq, gc=1, offload="none", impl="eager", lora=0, world=1, hold=0) -> tuple[float, float, float]:
    """(seconds, peak GiB per GPU, host GiB) guesses for one launch."""
    a = arch(model)
    P = a["_reference_total_params"]
    h, F, L, V = a["hidden_size"], a["intermediate_size"], a["num_hidden_layers"], a["vocab_size"]
    if lora:
        states = P * 2.2 / world
    elif offload != "none":
        states = P * 4.2 / world
    else:
        states = P * 16.6 / world
    gather = 4 * V * h
    # bytes per token per vocab entry at the peak, from the first H200 rows (eager 10, compiled 4)
    logits = seq * V * ((10 + 2 * hold) if impl == "eager" else 4)
    layer = seq * (12 * h + 4 * F) * 2
    acts = L * seq * h * 2 + layer if gc else L * seq * (16 * h + 3 * F) * 2
    gib = 1.2 * (states + gather + logits + acts) / GIB + 1.0
    flops = 8 * P * seq * (4 / 3 if gc else 1) / world
    secs = 22 + 3 * P / 1e9 + 3 * flops / 3.5e14 + (8 if impl == "compiled" else 0)
    host = 0.0
    if offload != "none" and not lora:
        secs += 3 * 3 * P / 1e9 / world
        host = 16.5 * P / GIB + 6
    if lora:
        secs += 25
    return secs, gib, host


def line(model, seq, gc=1, offload="none", impl="eager", lora=0, world=1, hold=0) -> str:
    s, g, host = estimate(model, seq, gc, offload, impl, lora, world, hold)
    parts = [str(world), f"{s:.0f}", f"{g:.0f}"]
    if host:
        parts.append(f"host={host:.0f}")
    parts += ["--model", model, "--seq", str(seq), "--gc", str(gc), "--logprob-impl", impl]
    # these lists were measured before the harness took K micro-batches: one per step, three steps
    parts += ["--micro-batches", "1", "--steps", "3", "--empty-cache", "0"]
    if offload != "none":
        parts += ["--offload", offload]
    if lora:
        parts += ["--lora-rank", str(lora)]
    if hold:
        parts += ["--hold-logits", "1"]
    return " ".join(parts)


def h200_1gpu_a() -> list[str]:
    out = ["# reproduction of the given rows: the given harness held the logits through backward"]
    out += [line("qwen2.5-1.5b", 4096, 1, hold=1), line("qwen2.5-1.5b", 4096, 0, hold=1)]
    out.append("# sequence sweeps, gradient checkpointing on, both log-prob paths")
    for model, seqs in [
        ("qwen2.5-0.5b", [4096, 8192, 16384, 32768]),
        ("qwen2.5-1.5b", [2048, 8192, 16384, 32768]),
        ("qwen2.5-3b", [2048, 4096, 8192, 16384, 32768]),
    ]:
        for seq in seqs:
            for impl in ("eager", "compiled"):
                out.append(line(model, seq, 1, impl=impl))
    out.append(line("qwen2.5-1.5b", 4096, 1, impl="compiled"))
    out.append("# gradient checkpointing off")
    out += [
        line("qwen2.5-0.5b", 8192, 0),
        line("qwen2.5-0.5b", 8192, 0, impl="compiled"),
        line("qwen2.5-1.5b", 4096, 0, impl="compiled"),
        line("qwen2.5-1.5b", 8192, 0),
        line("qwen2.5-3b", 4096, 0),
        line("qwen2.5-3b", 4096, 0, impl="compiled"),
    ]
    return out


def h200_1gpu_b() -> list[str]:
    L = line
    return [
        "# LoRA r16 (gc on) and optimizer offload, ordered to pack onto one GPU",
        L("qwen2.5-3b", 4096, lora=16),
        L("qwen2.5-3b", 16384, lora=16),
        L("qwen2.5-7b", 4096, lora=16),
        L("qwen2.5-1.5b", 4096, offload="optimizer"),
        L("qwen2.5-1.5b", 16384, offload="optimizer"),
        L("qwen2.5-7b", 16384, lora=16),
        L("qwen2.5-7b", 16384, impl="compiled", lora=16),
        L("qwen2.5-14b", 4096, lora=16),
        L("qwen2.5-3b", 4096, offload="optimizer"),
        L("qwen2.5-14b", 16384, lora=16),
        L("qwen2.5-3b", 16384, offload="optimizer"),
        "# left over from h200_1gpu_a",
        L("qwen2.5-1.5b", 4096, 0, impl="compiled"),
        L("qwen2.5-1.5b", 8192, 0),
        L("qwen2.5-3b", 4096, 0),
        L("qwen2.5-3b", 4096, 0, impl="compiled"),
        L("qwen2.5-3b", 32768, impl="compiled"),
    ]


def x2() -> list[str]:
    L = line
    off7 = dict(offload="optimizer")
    return [
        "# two GPUs, one process each; single-GPU 7B offload items run beside them (--share-multi)",
        "# reproductions of the two given world-2 rows (logits held through backward)",
        L("qwen2.5-7b", 4096, world=2, hold=1),
        L("qwen2.5-7b", 4096, **off7),
        L("qwen2.5-3b", 8192, world=2, hold=1),
        L("qwen2.5-1.5b", 4096, world=2),
        L("qwen2.5-1.5b", 16384, world=2),
        L("qwen2.5-1.5b", 16384, impl="compiled", world=2),
        L("qwen2.5-7b", 16384, impl="compiled", **off7),
        L("qwen2.5-3b", 4096, world=2),
        L("qwen2.5-3b", 16384, world=2),
        L("qwen2.5-3b", 16384, impl="compiled", world=2),
        L("qwen2.5-7b", 16384, **off7),
        L("qwen2.5-7b", 4096, world=2),
        L("qwen2.5-7b", 16384, world=2),
        L("qwen2.5-7b", 16384, impl="compiled", world=2),
        L("qwen2.5-7b", 4096, impl="compiled", **off7),
        L("qwen2.5-7b", 4096, impl="compiled", world=2),
        "# gradient checkpointing off",
        L("qwen2.5-1.5b", 4096, 0, world=2),
        L("qwen2.5-3b", 4096, 0, world=2),
        "# 14B: LoRA, full training without offload, compiled at 4k",
        L("qwen2.5-14b", 4096, lora=16, world=2),
        L("qwen2.5-14b", 16384, lora=16, world=2),
        L("qwen2.5-1.5b", 4096, impl="compiled", world=2),
        L("qwen2.5-3b", 4096, impl="compiled", world=2),
        L("qwen2.5-14b", 4096, world=2),
        "# 14B with optimizer offload needs ~240 GiB of host memory on two ranks: skipped below 256 GiB",
        L("qwen2.5-14b", 4096, offload="optimizer", world=2),
    ]


def x2_b() -> list[str]:
    """What the first two-GPU call had no time left for (a short second call)."""
    L = line
    return [
        L("qwen2.5-14b", 4096, lora=16, world=2),
        L("qwen2.5-7b", 16384, impl="compiled", world=2),
        L("qwen2.5-14b", 4096, world=2),
        L("qwen2.5-7b", 4096, impl="compiled", world=2),
        L("qwen2.5-1.5b", 4096, impl="compiled", world=2),
        L("qwen2.5-3b", 4096, impl="compiled", world=2),
    ]


def main() -> None:
    d = HERE / "matrices"
    d.mkdir(exist_ok=True)
    for name, fn in [("h200_1gpu_a", h200_1gpu_a), ("h200_1gpu_b", h200_1gpu_b), ("x2", x2), ("x2_b", x2_b)]:
        path = d / f"{name}.txt"
        path.write_text("\n".join(fn()) + "\n")
        print(path)


if __name__ == "__main__":
    main()
