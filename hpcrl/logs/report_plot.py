"""The GPU-memory plot of a report (`hpcrl report --plot`): matplotlib, imported only here."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import BinaryIO

from hpcrl.logs.report import MIB_PER_GIB, ROLE_COLORS, gpu_note, parse_time, read_gpu_csvs

GAP = timedelta(minutes=5)  # the plot breaks a GPU's line where the monitor was silent this long


def _line(pts: list[tuple[datetime, float]], limit: int = 2000) -> tuple[list, list]:
    """x, y in GiB of at most ~limit points, each bucket's highest reading (peaks stay visible), broken
    (NaN) across gaps of over GAP, such as between the jobs of a chain."""
    step = max(1, -(-len(pts) // limit))
    xs: list = []
    ys: list = []
    for t, used in (max(pts[i : i + step], key=lambda p: p[1]) for i in range(0, len(pts), step)):
        if xs and t - xs[-1] > GAP:
            xs, ys = xs + [xs[-1] + (t - xs[-1]) / 2], ys + [float("nan")]
        xs.append(t)
        ys.append(used / MIB_PER_GIB)
    return xs, ys


def plot_gpu_memory(report: dict, path: Path | BinaryIO) -> None:
    """PNG of GPU memory used over time, a line per node/GPU coloured by role, predictions dashed (to a file
    or a binary stream)."""
    from hpcrl.logs.plots import _pyplot  # matplotlib is an extra: a one-line error says how to install it

    plt = _pyplot()
    starts = [t for j in report["jobs"] if (t := parse_time(j["started"]))]
    data = read_gpu_csvs(Path(report["run_dir"]) / "hpcrl", min(starts) if starts else None, series=True)
    fig, ax = plt.subplots(figsize=(11, 6))
    labelled: set[str] = set()
    for (_node, _gpu, role), pts in data["series"].items():
        xs, ys = _line(pts)
        ax.plot(
            xs,
            ys,
            color=ROLE_COLORS.get(role, "tab:gray"),
            linewidth=1,
            alpha=0.8,
            marker="." if len(xs) < 200 else None,
            label=None if role in labelled else f"{role} GPUs",
        )
        labelled.add(role)
    pred = report["plan"] or {}
    for key, role, name in (
        ("learner_peak_gib", "learner", "learner predicted peak"),
        ("engine_reserved_gib", "engine", "vLLM predicted reservation"),
    ):
        if pred.get(key) is not None:
            ax.axhline(
                pred[key], color=ROLE_COLORS[role], linestyle="--", linewidth=1.5, label=f"{name} {pred[key]:.1f} GiB"
            )
    if not data["series"]:
        ax.text(0.5, 0.5, gpu_note(data), transform=ax.transAxes, ha="center", va="center")
        ax.set_xticks([])
    ax.set(
        ylabel="GPU memory used (GiB)", xlabel="time (UTC)", title=f"GPU memory: {report['run_id'] or report['name']}"
    )
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="lower right", fontsize=8)
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
