"""When no layout fits, or the chosen one has a catch: computed fixes and warnings (pure).

`plan_layouts` is the planner's entry point for backends with separate learner and engine
GPUs: ranked layouts from hpcrl/planning/layout.py, else a PlanError listing every single-setting change
that makes one fit (each checked by the planner), else layouts that fit only inside the
allocator margin, carrying the warning.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace

from hpcrl.errors import would_fit
from hpcrl.memory import constants as C
from hpcrl.memory.plan import allocator_margin
from typing import Any

from hpcrl.planning.layout import Layout, PlanMemo, Pins, Workload, any_layout, enumerate_layouts, search_size
from hpcrl.profiles import ClusterProfile

# Where a long search says it has begun; the CLI shows it on a terminal (hpcrl/cli/output.py progress).
PROGRESS = logging.getLogger("hpcrl.progress")
# Candidate layouts from which a plan may take over ~2 s: about 50 us of CPU each on the development
# machine (32,000: 1.65 s; 64,000: 3.45 s; benchmarks/plan_speed.py --large, results/plan_speed_large.txt).
SLOW_SEARCH = 30_000


# The suggestions' wording comes from the backend (its `layout_fixes`: fix -> its words, with
# {tokens} or {k} filled in); a fix it lacks or maps to None is never offered.
Fixes = Mapping[str, "str | None"]


def suggest(
    profile: ClusterProfile, nodes: int, w: Workload, pins: Pins, variants: list[ClusterProfile], fixes: Fixes
) -> list[str]:
    """Every single-setting change that makes some layout fit, each checked by the planner. Order:
    fixes that keep the job inside the partition's and QOS's node limits first; within each,
    those that leave the allocator margin free before those that fit only inside it."""
    found: list[tuple[int, str]] = []  # (rank, fix)
    memo: PlanMemo = {}

    def fits(prof: ClusterProfile, n: int, wc: Workload, p: Pins, margin: bool = True) -> bool:
        return any_layout(prof, n, wc, p, margin=margin, memo=memo)

    def add(text: str, prof: ClusterProfile, n: int, p: Pins, **change: Any) -> bool:
        wc = replace(w, **change) if change else w
        if fits(prof, n, wc, p):
            tight = False
        elif fits(prof, n, wc, p, margin=False):
            tight = True
        else:
            return False
        # Only a fix that raises the node count past the limit is over it (the job as asked may be
        # over a QOS cap already: those are often raised, and the planner warns about it).
        over = prof.max_nodes is not None and n > prof.max_nodes and (n > nodes or prof is not profile)
        note = " (fits only inside the allocator margin)" if tight else ""
        found.append((2 * over + tight, text + note + (" (over the partition/QOS node limit)" if over else "")))
        return True

    if w.weight_sync == "whole_model" and fixes.get("per_param_sync"):
        add(str(fixes["per_param_sync"]), profile, nodes, pins, weight_sync="per_param")
    if w.hpz_partition_size > 1 and fixes.get("no_hpz"):
        add(str(fixes["no_hpz"]), profile, nodes, pins, hpz_partition_size=1)
    if w.offload == "none" and fixes.get("offload_optimizer"):
        add(str(fixes["offload_optimizer"]), profile, nodes, pins, offload="optimizer")
    if w.offload in ("none", "optimizer") and fixes.get("offload_params"):
        add(str(fixes["offload_params"]), profile, nodes, pins, offload="params")
    lo, hi, best = w.seq_len, w.pack_length - 1, None
    while lo <= hi and w.pack_length > w.seq_len and fixes.get("tokens"):
        mid = (lo + hi) // 2
        if fits(profile, nodes, replace(w, pack_length=mid), pins):
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    if best and "{micro}" in str(fixes["tokens"]):  # the framework counts whole sequences per micro-batch
        if (micro := best // w.seq_len) >= 1:
            add(str(fixes["tokens"]).format(micro=micro), profile, nodes, pins, pack_length=micro * w.seq_len)
    elif best:
        add(str(fixes["tokens"]).format(tokens=best), profile, nodes, pins, pack_length=best)
    cap = min(profile.planning.max_learners_per_node or profile.gpu.count_per_node, profile.gpu.count_per_node)
    if pins.learners_per_node and fixes.get("learners"):
        for k in range(pins.learners_per_node + 1, cap + 1):
            if add(str(fixes["learners"]).format(k=k), profile, nodes, replace(pins, learners_per_node=k)):
                break
    if w.lora_rank == 0 and fixes.get("lora"):
        add(str(fixes["lora"]), profile, nodes, pins, lora_rank=16)
    limit = max(nodes * 2, 64)

    def fewest_nodes(prof: ClusterProfile, lo: int, wc: Workload) -> int | None:
        """The fewest nodes in lo..limit where a layout fits. A layout that fits on n nodes fits on n + 1 (the
        same learners, more engine GPUs), so a bisection finds it: log2 of the range of plans, not the range."""
        hi = limit
        if lo > hi or not fits(prof, hi, wc, pins):
            return None
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if fits(prof, mid, wc, pins) else (mid + 1, hi)
        return lo

    if (n := fewest_nodes(profile, nodes + 1, w)) is not None:
        add(f"--nodes {n}", profile, n, pins)
    elif w.hpz_partition_size > 1 and fixes.get("no_hpz"):
        if (n := fewest_nodes(profile, nodes, replace(w, hpz_partition_size=1))) is not None:
            add(f"--nodes {n} {fixes['no_hpz']}", profile, n, pins, hpz_partition_size=1)
    for var in variants:
        if (n := fewest_nodes(var, nodes, w)) is not None:
            add(f"--cluster {var.name}:{var.variant} --nodes {n}", var, n, pins)
    return [text for _rank, text in sorted(found, key=lambda f: f[0])]


def idle_gpus_warning(layouts: list[Layout], engines_key: str = "engines") -> list[str]:
    """The chosen layout's idle GPUs, counted, with the reason and the layout that idles fewest (`engines_key`: the
    framework's key of the engine count)."""
    lay = layouts[0]
    if lay.colocated or lay.idle_gpus == 0:
        return []
    g, k, m, tp = lay.gpus_per_node, lay.learners_per_node, lay.learner_nodes, lay.tp
    why = []
    if (g - k) % tp:
        why.append(
            f"on each of its {m} learner nodes the {g - k} GPUs beside the learners hold "
            f"{(g - k) // tp} TP-{tp} engine{'s' if (g - k) // tp != 1 else ''} and leave {(g - k) % tp} idle"
        )
    if g % tp and lay.nodes > m:
        why.append(f"each of the {lay.nodes - m} other nodes leaves {g % tp} idle")
    slots = m * ((g - k) // tp) + (lay.nodes - m) * (g // tp)
    if lay.engines < slots:
        why.append(f"{slots - lay.engines} engine slots of {tp} GPUs stay empty ({engines_key} {lay.engines})")
    fewer = min(layouts, key=lambda x: (x.idle_gpus, x.step_time_s))
    alt = (
        f"; the layout with the fewest, {fewer.idle_gpus} idle ([{fewer.learners_per_node}] x {fewer.learner_nodes}, "
        f"{fewer.engines} x TP {fewer.tp}), steps ~{fewer.step_time_s:.0f} s (hpcrl plan lists it)"
        if fewer.idle_gpus < lay.idle_gpus
        else ""
    )
    return [
        f"the chosen layout leaves {lay.idle_gpus} of {lay.nodes * g} GPUs idle: {'; '.join(why)}; it was chosen "
        f"for its step estimate (~{lay.step_time_s:.0f} s){alt}"
    ]


def with_margin_note(layouts: list[Layout], fixes: list[str]) -> list[Layout]:
    """Layouts that fit only inside the allocator margin, the best one carrying the warning."""
    best = layouts[0]
    mem, g = best.memory, C.GIB
    full = allocator_margin(mem.learner_setup, mem.learner.peak_reserved)
    spare = mem.usable - mem.learner_peak
    clear = f"; would clear it: {' | '.join(fixes)}" if fixes else "; nothing hpcrl tried clears it"
    note = (
        f"the learner's peak {mem.learner_peak / g:.1f} GiB leaves {spare / g:.1f} GiB of the {mem.usable / g:.1f} "
        f"GiB GPU, inside the {full / g:.1f} GiB allocator margin (peak reserved memory varied that much in the "
        f"calibration): it may run out of memory{clear}"
    )
    return [replace(best, notes=best.notes + (note,)), *layouts[1:]]


def plan_layouts(
    profile: ClusterProfile,
    nodes: int,
    w: Workload,
    pins: Pins = Pins(),
    variants: list[ClusterProfile] | None = None,
    fixes: Fixes | None = None,
) -> list[Layout]:
    """Ranked layouts; PlanError with computed suggestions when none fits."""
    if (size := search_size(profile, nodes, w, pins)) >= SLOW_SEARCH:
        PROGRESS.info(f"planning {nodes:,} nodes: {size:,} candidate layouts...")
    layouts, rejected = enumerate_layouts(profile, nodes, w, pins)
    if layouts:
        return layouts
    why = max(rejected, key=lambda k: rejected[k]) if rejected else "no candidate layout"
    where = f"{nodes} {profile.name}{':' + profile.variant if profile.variant else ''} node{'s' if nodes > 1 else ''}"
    found = suggest(profile, nodes, w, pins, variants or [], fixes or {})
    tight, _ = enumerate_layouts(profile, nodes, w, pins, margin=False)
    if tight:
        return with_margin_note(tight, found)
    raise would_fit(
        f"no layout of {w.model.name} fits on {where} ({why})",
        tuple(found),
        none="nothing hpcrl tried fits (more nodes, offload, shorter pack_length, LoRA)",
    )


__all__ = ["PROGRESS", "SLOW_SEARCH", "Fixes", "idle_gpus_warning", "plan_layouts", "suggest", "with_margin_note"]
