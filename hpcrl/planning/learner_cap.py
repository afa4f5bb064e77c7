"""The profile's learners-per-node cap (planning.max_learners_per_node) where the framework, not hpcrl,
places the learners on nodes (pure).

OpenRLHF puts its actor's one-GPU bundles in a PACK placement group (cli/train_ppo_ray.py:48-49 and
trainer/ray/launcher.py:244-251 at 3c3be623): Ray puts them on as few nodes as hold them. Only an actor
of at most `cap` GPUs in all is then sure to have at most `cap` on every node, so the search inside the
cap is one learner node with 1 to `cap` learners; where none fits, the actor fills whole nodes and the
plan says why and what would fit inside the cap.
"""

from __future__ import annotations

from dataclasses import replace

from hpcrl.planning.layout import Layout, Pins, Workload, enumerate_layouts
from hpcrl.planning.layout_advice import Fixes, suggest
from hpcrl.profiles import ClusterProfile


def packed_cap_pins(profile: ClusterProfile, pins: Pins) -> Pins | None:
    """The pins of the search inside the cap, or None where nothing need be kept: no cap below the
    node's GPUs, or the learners pinned (a pin overrides the profile, which then warns)."""
    cap = profile.planning.max_learners_per_node
    if not cap or cap >= profile.gpu.count_per_node or pins.learners_per_node is not None:
        return None
    if pins.learner_nodes not in (None, 1):
        return None
    return replace(pins, learner_nodes=1)  # enumerate_layouts takes 1..cap learners per node itself


def within_cap(profile: ClusterProfile, nodes: int, w: Workload, pins: Pins) -> list[Layout]:
    """The ranked layouts inside the cap; [] where there is no cap to keep or none fits."""
    capped = packed_cap_pins(profile, pins)
    return enumerate_layouts(profile, nodes, w, capped)[0] if capped else []


def cap_note(profile: ClusterProfile, nodes: int, w: Workload, pins: Pins, fixes: Fixes, placement: str) -> str:
    """Why the learners fill whole nodes past the cap (`placement`: how the framework places them), and
    the single changes that fit inside it; "" where there was no cap to keep."""
    capped = packed_cap_pins(profile, pins)
    if capped is None:
        return ""
    cap = profile.planning.max_learners_per_node
    assert cap is not None  # packed_cap_pins gave pins: there is a cap
    found = suggest(profile, nodes, w, capped, [], {k: v for k, v in fixes.items() if k != "learners"})
    inside = f"; would fit inside it: {' | '.join(found)}" if found else "; no single change hpcrl tried fits inside it"
    s = "s" if cap > 1 else ""
    return f"{placement}: only a learner group of at most {cap} GPU{s} in all keeps the cap, and none fits{inside}"


__all__ = ["cap_note", "packed_cap_pins", "within_cap"]
