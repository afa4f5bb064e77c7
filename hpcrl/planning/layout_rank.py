"""The order in which the planner offers layouts (pure): the fastest estimated step first."""

from __future__ import annotations

from typing import Any

Layout = Any  # planning/layout.py's Layout (not imported: layout.py imports this module)

STEP_TIE = 0.10  # mid step estimates closer than this are not told apart (they rest on fitted efficiencies)


def rank(layouts: list[Layout]) -> list[Layout]:
    """Order: the fastest mid step estimate, where steps within STEP_TIE of the fastest left count as
    equal and go to the layout with the fewest idle GPUs, then the fewest learners per node, then the
    most learner memory headroom, then the smaller TP.

    Idle GPUs only break ties: the layouts are planned on whole (exclusive) nodes, where an idle GPU
    costs nothing extra, so a slower step is never bought with fewer idle GPUs (issue 26: a ~304 s
    TP 1 layout ranked above a ~182 s TP 2 one for "no idle GPU"). Among near-equal steps,
    spreading learners gives each one a node's NICs, host RAM and CPUs for ZeRO-3 traffic and
    offload, and avoids several NCCL ranks per node, which failed with "Duplicate GPU detected" on
    GH200 nodes (the users' notes).
    """
    group = sorted(layouts, key=lambda x: x.step_time_s)
    ordered: list[Layout] = []
    while group:
        best = group[0].step_time_s
        tied = [x for x in group if x.step_time_s <= best * (1 + STEP_TIE)]
        tied.sort(key=lambda x: (x.idle_gpus, x.learners_per_node, -round(x.learner_headroom, 3), x.tp))
        ordered.extend(tied)
        group = [x for x in group if x not in tied]
    return ordered


__all__ = ["STEP_TIE", "rank"]
