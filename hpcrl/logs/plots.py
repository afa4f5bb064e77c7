"""Charts (matplotlib is an optional extra: `pip install 'hpcrl[plot]'`)."""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

from hpcrl.errors import HpcrlError
from hpcrl.memory.sharding import from_plan


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise HpcrlError("--plot needs matplotlib: pip install 'hpcrl[plot]'") from None
    return plt


def plot_memory(plan: dict, path: Path | BinaryIO) -> None:
    """Stacked bars of a learner GPU and an engine GPU against the GPU's usable memory (to a file or a binary
    stream)."""
    plt = _pyplot()
    learner = dict(plan["learner"]["breakdown"])
    learner["allocator reserve"] = plan["learner"]["peak_reserved_gib"] - plan["learner"]["peak_allocated_gib"]
    learner["CUDA context + NCCL"] = plan["learner"]["non_torch_gib"]
    e = plan["engine"]
    engine = {
        "weights": e["weights_gib"],
        "activation peak": e["activation_peak_gib"],
        "CUDA graphs": e["cuda_graphs_gib"],
        "CUDA context + NCCL": e["non_torch_gib"],
        "KV cache": e["kv_cache_gib"],
    }
    fig, ax = plt.subplots(figsize=(8, 6))
    for x, stack in ((0, learner), (1, engine)):
        bottom = 0.0
        for name, gib in stack.items():
            if gib <= 0:
                continue
            ax.bar(x, gib, bottom=bottom, width=0.6, edgecolor="white")
            if gib > 0.02 * plan["gpu"]["usable_gib"]:
                ax.text(x, bottom + gib / 2, f"{name} {gib:.1f}", ha="center", va="center", fontsize=7)
            bottom += gib
    ax.axhline(plan["gpu"]["usable_gib"], color="red", linestyle="--", label=f"{plan['gpu']['name']} usable")
    lr = plan["learner"]
    sharding = from_plan(lr).plan_label(lr)
    ax.set_xticks([0, 1], [f"learner ({lr['gpus']} GPUs, {sharding})", f"engine (vLLM TP={e['tp']})"])
    ax.set_ylabel("GiB per GPU")
    ax.set_title(plan["model"]["name"])
    ax.legend()
    try:
        fig.savefig(path, dpi=110, bbox_inches="tight")
    except OSError as exc:
        raise HpcrlError(f"cannot write plot {path}: {exc.strerror}") from None
    finally:
        plt.close(fig)
