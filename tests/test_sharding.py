"""The learner's sharding strategy (hpcrl/memory/sharding.py) and the plan-memory learner JSON it writes
into plan.json: stored plans, old and new, read back as the strategy they were planned with.

Expected strategies come from the framework each committed run was rendered for (verl runs FSDP, open-instruct
and OpenRLHF DeepSpeed ZeRO-3), and expected fields from the setups written here, never from the strategy."""

from __future__ import annotations

import json

import pytest

from hpcrl.errors import HpcrlError
from hpcrl.memory.engine import EngineSetup
from hpcrl.memory.fsdp_learner import VerlUpdate
from hpcrl.memory.learner import LearnerSetup
from hpcrl.memory.plan import plan_memory
from hpcrl.memory.sharding import FSDP, ZERO, from_plan, sharding_named
from hpcrl.models import resolve_model
from hpcrl.profiles import resolve_profile

from helpers import ROOT

# Committed scripts' plan.json (rendered by earlier hpcrl), by the framework each run starts.
GOLDEN = {
    "isambard-ai__grpo-olmo3-32b__16.sh": (ZERO, "ZeRO-3"),  # open-instruct: DeepSpeed ZeRO-3
    "isambard-ai__openrlhf-grpo-qwen2.5-7b__4.sh": (ZERO, "ZeRO-3"),  # OpenRLHF: --ds.zero_stage 3
    "isambard-ai__verl-grpo-qwen2.5-7b__4.sh": (FSDP, "FSDP1"),
}  # verl: actor.strategy fsdp
FSDP_ONLY = {"sharding", "fsdp_version", "micro_batches", "framework_version"}


def golden_learner(name: str) -> dict:
    text = (ROOT / "tests" / "golden" / name).read_text()
    body = text.split("<<'HPCRL_PLAN_JSON'\n", 1)[1].split("\nHPCRL_PLAN_JSON", 1)[0]
    learner: dict = json.loads(body)["memory"]["learner"]
    return learner


def learner_json(setup: LearnerSetup) -> dict:
    model = setup.model
    plan = plan_memory(
        resolve_profile("isambard-ai", None),
        setup,
        EngineSetup(model=model, gpu_memory_utilization=0.5, max_seq_len=4096),
    )
    learner: dict = plan.to_dict()["learner"]
    return learner


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_a_committed_run_s_plan_json_reads_back_as_its_framework_s_sharding(name):
    learner = golden_learner(name)
    sharding, label = GOLDEN[name]
    assert (from_plan(learner), from_plan(learner).plan_label(learner)) == (sharding, label)


def test_a_plan_written_before_fsdp_was_planned_is_zero_with_its_stage():
    # plan-memory's learner JSON as it was before the "sharding" key existed: no key, a ZeRO stage.
    old = {"gpus": 8, "tokens_per_gpu": 8192, "zero_stage": 2, "offload": "none", "logprob_impl": "compiled"}
    assert (from_plan(old), from_plan(old).plan_label(old)) == (ZERO, "ZeRO-2")


def test_a_zero_learner_writes_its_stage_and_no_fsdp_field():
    learner = learner_json(LearnerSetup(model=resolve_model("qwen2.5-0.5b"), n_gpus=2, tokens_per_gpu=4096))
    assert (learner["zero_stage"], FSDP_ONLY & set(learner), from_plan(learner)) == (3, set(), ZERO)


def test_an_fsdp_learner_writes_its_version_micro_batches_and_framework_version_and_reads_back():
    setup = LearnerSetup(
        model=resolve_model("qwen2.5-0.5b"),
        n_gpus=2,
        tokens_per_gpu=4096,
        sharding=FSDP,
        fsdp_version=2,
        micro_batches=3,
        fsdp_update=VerlUpdate(version="0.9.1"),
    )
    learner = learner_json(setup)
    written = {k: learner[k] for k in FSDP_ONLY | {"zero_stage"}}
    assert written == {
        "zero_stage": None,
        "sharding": "fsdp",
        "fsdp_version": 2,
        "micro_batches": 3,
        "framework_version": "0.9.1",
    }
    assert (from_plan(learner), from_plan(learner).plan_label(learner)) == (setup.sharding, "FSDP2")


def test_a_stored_name_builds_the_same_setup_as_the_strategy():
    model = resolve_model("qwen2.5-0.5b")
    assert LearnerSetup(model=model, sharding="fsdp") == LearnerSetup(model=model, sharding=FSDP)  # type: ignore[arg-type]


def test_an_unknown_stored_sharding_is_refused_with_the_known_ones():
    with pytest.raises(HpcrlError, match="'megatron' is not known; valid: zero, fsdp"):
        sharding_named("megatron")
