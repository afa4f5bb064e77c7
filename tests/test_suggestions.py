"""Every fix hpcrl prints plans when typed (issue 39): each shipped config on each shipped cluster (and node type)
at a range of node counts; every `would fit: ...` of a refusal is typed into the same request, as a user would
type it, and must plan. Seed 004's verl OOM on one Berzelius fat node is the case that failed: `--nodes 3` was
offered to a `gpus: 4` config, and micro-batch 16, the fix that works, was not."""

from __future__ import annotations

import re
import shlex
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

import pytest

from hpcrl.errors import HpcrlError, PlanError
from hpcrl.planning.request import RunRequest, plan_request

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted(p.stem for p in (ROOT / "configs").glob("*.yaml"))
CLUSTERS = ["isambard-ai", "berzelius:thin", "berzelius:fat", "berzelius-hopper", "local-dev"]
NODES = (1, 2, 3, 5, 9)
GPUS = (2, 4)  # jobs of part of one node (`--gpus N`, a config's hpcrl.gpus): a fix must keep that shape


def printed_fixes(message: str) -> list[str]:
    """The fixes of a refusal as printed: between 'would fit: ' and the first ';' or ' (or ' after them."""
    found = re.search(r"; would fit: (.*?)(?:; |\s\(or --set |$)", message)
    return found.group(1).split(" | ") if found else []


def typed(req: RunRequest, fix: str) -> RunRequest:
    """A fix typed as a user would: each `--set K=V` replaces the user's own --set of K (a repeated key is
    refused), `--nodes`/`--gpus`/`--cluster` replace theirs, `--pin` adds one. Notes in brackets are not typed."""
    words = shlex.split(re.sub(r"\s*\((?:[^()]|\([^()]*\))*\)", "", fix))
    assert words and len(words) % 2 == 0, f"not flags a user can type: {fix!r}"
    sets, pins, other = list(req.sets), list(req.pins), {}
    for flag, value in zip(words[::2], words[1::2]):
        if flag == "--set":
            sets = [s for s in sets if s.split("=")[0] != value.split("=")[0]] + [value]
        elif flag == "--pin":
            pins.append(value)
        elif flag in ("--nodes", "--gpus"):
            other[flag[2:]] = int(value)
        else:
            assert flag == "--cluster", f"not a flag of plan: {flag} in {fix!r}"
            other["cluster"] = value
    return replace(req, sets=tuple(sets), pins=tuple(pins), **other)


@lru_cache(maxsize=None)
def outcome(req: RunRequest) -> str | None:
    """None when the request plans, else its one-line refusal."""
    try:
        plan_request(req)
    except HpcrlError as exc:
        return str(exc)
    return None


CASES = [(c, cl, n, None) for c in CONFIGS for cl in CLUSTERS for n in NODES] + [
    (c, cl, 1, g) for c in CONFIGS for cl in CLUSTERS for g in GPUS
]


@pytest.mark.parametrize(
    "config, cluster, nodes, gpus", CASES, ids=[f"{c}@{cl}x{n}" + (f"g{g}" if g else "") for c, cl, n, g in CASES]
)
def test_every_printed_fix_plans_when_typed(config, cluster, nodes, gpus):
    req = RunRequest(config=config, cluster=cluster, nodes=nodes, gpus=gpus)
    said = outcome(req)
    fixes = printed_fixes(said) if said else [fix for w in plan_request(req).warnings for fix in warned_fixes(w)]
    for fix in fixes:
        after = outcome(typed(req, fix))
        assert after is None, f"{said}\n  typed {fix!r}: {after}"


def warned_fixes(warning: str) -> list[str]:
    """The fixes a warning names at its end: the allocator-margin note's, the learner-cap note's."""
    found = re.search(r"; would (?:clear it|fit inside it): (.*)$", warning)
    return found.group(1).split(" | ") if found else []


def seed004() -> RunRequest:
    """Seed 004's verl run: Qwen2.5-7B GRPO, batch 1024, mini-batch 256, micro-batch 32, n 4, no offload, one
    Berzelius fat node's 4 GPUs (its `#SBATCH --gres=gpu:4`)."""
    return RunRequest(
        config="verl-grpo-qwen2.5-7b",
        cluster="berzelius:fat",
        nodes=1,
        gpus=4,
        sets=(
            "data.train_batch_size=1024",
            "data.max_prompt_length=512",
            "data.max_response_length=1024",
            "actor_rollout_ref.actor.ppo_mini_batch_size=256",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32",
            "actor_rollout_ref.actor.fsdp_config.param_offload=false",
            "actor_rollout_ref.actor.fsdp_config.optimizer_offload=false",
            "actor_rollout_ref.rollout.n=4",
            "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
        ),
    )


def test_seed004_offers_micro_batch_16_first_and_every_fix_plans():
    said = outcome(seed004())
    assert said is not None and "training does not fit in GPU memory" in said
    fixes = printed_fixes(said)
    assert fixes[0] == "--set actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16", said
    assert "--nodes 3" not in fixes  # the job asks 4 GPUs of one node: whole nodes are another job
    for fix in fixes:
        assert outcome(typed(seed004(), fix)) is None, fix


def test_a_fix_that_does_not_plan_when_typed_is_not_printed():
    """The verifier itself: a refusal whose only computed fix fails when typed says nothing would fit."""
    err = PlanError("x", head="no layout", fixes=("--nodes 3",), none="nothing hpcrl tried fits")
    assert str(err.with_fixes([])) == "no layout; nothing hpcrl tried fits"
    assert printed_fixes(str(err.with_fixes(["--nodes 3"]))) == ["--nodes 3"]
