"""The profile's learners-per-node cap inside each backend's layout search (issue 27, item 5).

The profile is local-dev (4 declared H200 per node) with planning.max_learners_per_node 1, the cap
Isambard-AI's profile carries.
"""

from __future__ import annotations

import pytest

from hpcrl.planning.request import RunRequest, plan_data, plan_request

CAPPED = "name: capped-dev\nextends: local-dev\nplanning:\n  max_learners_per_node: 1\n  why: a test cap\n"
SHORT = 'hpcrl.time="00:30:00"'  # local-dev's debug partition allows 1 h


@pytest.fixture
def capped(tmp_path):
    path = tmp_path / "capped.yaml"
    path.write_text(CAPPED)
    return str(path)


def planned(capped: str, config: str, nodes: int, sets: tuple[str, ...] = (), pins: tuple[str, ...] = ()) -> dict:
    return plan_data(
        plan_request(RunRequest(config=config, cluster_file=capped, nodes=nodes, sets=(SHORT, *sets), pins=pins)),
        top=100,
    )


def test_open_instruct_places_one_learner_per_node(capped):
    """open-instruct takes num_learners_per_node per node (a STRICT_SPREAD group): with the cap, every
    layout the search keeps has 1 learner on each learner node."""
    layouts = planned(capped, "grpo-olmo3-7b", 2)["layouts"]
    assert {n for lay in layouts for n in lay["num_learners_per_node"]} == {1}


def test_openrlhf_keeps_its_actor_inside_the_cap(capped):
    """OpenRLHF PACKs the actor's one-GPU bundles onto as few nodes as hold them (launcher.py:244-251 at
    3c3be623): only an actor of 1 GPU in all is sure to put at most 1 on a node, so by hand the plan is
    actor.num_nodes 1 x actor.num_gpus_per_node 1 (7B fits one 139.8 GiB GPU with the optimizer offloaded)."""
    args = planned(capped, "openrlhf-grpo-qwen2.5-7b", 4, sets=("ds.adam_offload=true",))["backend_args"]
    assert (args["actor.num_nodes"], args["actor.num_gpus_per_node"]) == (1, 1)


def test_openrlhf_says_what_fits_inside_the_cap_when_nothing_does(capped):
    """Without offload a 7B actor on one GPU does not fit: the actor fills whole nodes, and the warning names
    the change that keeps the cap (hpcrl at f9257de said only "hpcrl cannot plan fewer")."""
    warnings = planned(capped, "openrlhf-grpo-qwen2.5-7b", 4)["warnings"]
    assert any("would fit inside it: --set ds.adam_offload=true" in w for w in warnings)


def test_a_pin_overrides_the_cap_for_openrlhf(capped):
    args = planned(capped, "openrlhf-grpo-qwen2.5-7b", 4, sets=("ds.adam_offload=true",), pins=("learners=4",))[
        "backend_args"
    ]
    assert args["actor.num_gpus_per_node"] == 4


CUSTOM = ("launcher=torchrun", "hpcrl.gpus=null")  # a whole 4-GPU node, one torchrun process per GPU


def test_custom_torchrun_runs_as_many_processes_as_the_cap_allows(capped):
    """torchrun --nproc-per-node is the learners on the node: 4 GPUs, cap 1, so 1 process."""
    args = planned(capped, "custom-ppo-qwen2.5-3b-qlora", 1, sets=CUSTOM)["backend_args"]
    assert args["processes"] == 1


def test_a_pin_overrides_the_cap_for_custom(capped):
    args = planned(capped, "custom-ppo-qwen2.5-3b-qlora", 1, sets=CUSTOM, pins=("learners=4",))["backend_args"]
    assert args["processes"] == 4


def test_verls_node_fix_past_the_qos_says_so():
    """Isambard-AI's 32gpu_qos holds 32 GPUs = 8 of its 4-GPU nodes (clusters/isambard-ai.yaml): a colocated
    fix of more nodes is marked as open-instruct's are (hpcrl at f9257de offered it unmarked). At verl b178a3cd:
    at 1dda039b no node count fits this run (its unsharded gradients under accumulation, below)."""
    import re
    import subprocess
    import sys

    err = subprocess.run(
        [
            sys.executable,
            "-m",
            "hpcrl",
            "plan",
            "--config",
            "verl-grpo-qwen2.5-7b",
            "--model",
            "72b",
            "--nodes",
            "1",
            "--set",
            "data.max_response_length=16384",
            "--set",
            "hpcrl.framework_version=b178a3cd",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    ).stderr
    over = re.search(r"--nodes (\d+) \(over the partition/QOS node limit\)", err)
    assert over and int(over.group(1)) > 32 // 4
