"""The order in which the planner offers layouts (pure): the fastest estimated step first."""

from __future__ import annotations

from typing import Any

Layout = Any  # planning/layout.py's Layout (not imported: layout.py imports this module)

STEP_TIE = 0.10  # mid step estimates closer than this are not told apart (they rest on fitted efficiencies)


def rank(layouts: list[Layout], exclusive: bool = True) -> list[Layout]:
    """Order: the fastest mid step estimate, where steps within STEP_TIE of the fastest left count as
    equal and go to the layout with the fewest idle GPUs, then the fewest learners per node, then the
    most learner memory headroom, then the smaller TP. On part of a node (`exclusive` False: --gpus N,
    where each GPU asked is one another job could have had) layouts that use every GPU come first.

    On whole (exclusive) nodes idle GPUs only break ties: an idle GPU there
    costs nothing extra, so a slower step is never bought with fewer idle GPUs (issue 26: a ~304 s
    TP 1 layout ranked above a ~182 s TP 2 one for "no idle GPU"). Among near-equal steps,
    spreading learners gives each one a node's NICs, host RAM and CPUs for ZeRO-3 traffic and
    offload, and avoids several NCCL ranks per node, which failed with "Duplicate GPU detected" on
    GH200 nodes (the users' notes).
    """
    ordered: list[Layout] = []
    for part in (
        [layouts] if exclusive else [[x for x in layouts if not x.idle_gpus], [x for x in layouts if x.idle_gpus]]
    ):
        ordered.extend(_by_step(part))
    return ordered


def _by_step(layouts: list[Layout]) -> list[Layout]:
    # Sorted by step, the layouts within STEP_TIE of the fastest left are a prefix of what is left:
    # one sort and one pass, not a comparison of every layout against every group (over 8 million
    # Layout.__eq__ calls at 1,362 Isambard-AI nodes, cProfile).
    steps = [x.step_time_s for x in layouts]
    order = sorted(range(len(layouts)), key=steps.__getitem__)
    ordered: list[Layout] = []
    i = 0
    while i < len(order):
        limit = steps[order[i]] * (1 + STEP_TIE)
        j = i
        while j < len(order) and steps[order[j]] <= limit:
            j += 1
        tied = [layouts[t] for t in order[i:j]]
        tied.sort(key=lambda x: (x.idle_gpus, x.learners_per_node, -round(x.learner_headroom, 3), x.tp))
        ordered.extend(tied)
        i = j
    return ordered


__all__ = ["STEP_TIE", "rank"]
