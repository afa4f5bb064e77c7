"""hpcrl.framework_version in a run config: keys are checked against that version's table, the
default is the newest version hpcrl knows (said as an assumption), and the capability facts that
moved between verl b178a3cd and 1dda039b are read at the version the run names.

Expected versions and keys are verl's own (issue 23; verl/version/version and
verl/trainer/config/*.yaml at each commit), written here by hand.
"""

from __future__ import annotations

import pytest

from helpers import assert_user_error, shipped_hpcrl
from hpcrl.errors import PlanError
from hpcrl.planning.backends import get_backend
from hpcrl.planning.config import load_run_config

VERL = "verl-grpo-qwen2.5-7b"
LORA = "actor_rollout_ref.model.lora.rank=16"  # new at 1dda039b (model/hf_model.yaml:108)


def test_the_current_verl_s_lora_key_renders_and_the_version_is_named():
    out = shipped_hpcrl("render", "--config", VERL, "--set", LORA)
    assert (
        out.returncode == 0
        and "hpcrl: assumes verl 0.10.0.dev (1dda039b)" in out.stderr
        and "# Plan assumes verl 0.10.0.dev (1dda039b)" in out.stdout
    ), out.stderr


def test_an_unknown_version_exits_2_listing_the_known_ones_the_old_pin_among_them():
    line = assert_user_error(
        shipped_hpcrl("render", "--config", VERL, "--set", "hpcrl.framework_version=nope"), "'nope'"
    )
    assert "b178a3cd" in line and "1dda039b" in line, line


@pytest.mark.parametrize("pin", ["b178a3cd", "0.8.0.dev", "b178a3cd56f58b2d502255daba591e92833930a7"])
def test_the_lora_key_at_the_old_pin_exits_2_naming_the_version_that_has_it(pin):
    line = assert_user_error(
        shipped_hpcrl("render", "--config", VERL, "--set", LORA, "--set", f"hpcrl.framework_version={pin}"), "lora.rank"
    )
    assert "exists in 0.10.0.dev (1dda039b)" in line, line


def test_a_named_version_is_no_assumption_and_is_in_the_header():
    out = shipped_hpcrl("render", "--config", VERL, "--set", "hpcrl.framework_version=b178a3cd")
    assert (out.returncode, "assumes" in out.stderr, "# Framework: verl 0.8.0.dev (b178a3cd)" in out.stdout) == (
        0,
        False,
        True,
    ), out.stderr


def _cfg(*sets: str):
    return load_run_config(VERL, list(sets))


@pytest.mark.parametrize("version,key", [(None, "reward.reward_model.enable"), ("b178a3cd", "reward_model.enable")])
def test_a_gpu_reward_model_is_refused_under_its_key_at_each_version(version, key):
    sets = [f"{key}=true"] + ([f"hpcrl.framework_version={version}"] if version else [])
    with pytest.raises(PlanError, match=key.replace(".", r"\.")):
        get_backend("verl").workload_from_config(_cfg(*sets))


@pytest.mark.parametrize("version,expected", [(None, True), ("b178a3cd", False)])
def test_rollout_log_probs_default_as_verl_declares_at_each_version(version, expected):
    # rollout.yaml:233 at 1dda039b (true), rollout.yaml:206 at b178a3cd (false)
    cfg = _cfg(*([f"hpcrl.framework_version={version}"] if version else []))
    assert get_backend("verl").arg(cfg, "actor_rollout_ref.rollout.calculate_log_probs") is expected


def test_the_lora_rank_under_the_new_key_reaches_the_plan():
    assert get_backend("verl").workload_from_config(_cfg(LORA)).lora_rank == 16


def test_open_instruct_s_legacy_commit_asks_for_the_legacy_layout():
    assert_user_error(
        shipped_hpcrl("plan", "--config", "grpo-olmo3-7b", "--set", "hpcrl.framework_version=1611e3df"),
        "hpcrl.arg_layout=legacy",
    )


def test_a_custom_script_has_no_versions_to_name():
    assert_user_error(
        shipped_hpcrl("plan", "--config", "custom-ppo-qwen2.5-3b-qlora", "--set", "hpcrl.framework_version=1.0"),
        "no versions of backend custom",
    )
