"""Framework versions as data: each version's key table, the default, and the errors for an
unknown version or a key that only another version has. Expected values are verl's own
config at each commit (file:line cited beside each), not computed with the code under test."""

from __future__ import annotations

import re

import pytest

from hpcrl.errors import HpcrlError
from hpcrl.planning.backends import versions

PIN, CURRENT = "b178a3cd", "1dda039b"
LORA_RANK = "actor_rollout_ref.model.lora.rank"  # model/hf_model.yaml:100-108 at 1dda039b; no lora: block at b178a3cd


def test_the_current_lora_key_is_in_the_current_table_only():
    assert (LORA_RANK in versions.table("verl", CURRENT), LORA_RANK in versions.table("verl", PIN)) == (True, False)


def test_a_key_of_another_version_names_the_versions_that_have_it():
    with pytest.raises(
        versions.KeyNotInVersionError,
        match=r"verl 0\.8\.0\.dev \(b178a3cd\) has no such key; it exists in 0\.10\.0\.dev \(1dda039b\)",
    ):
        versions.check_key("verl", PIN, LORA_RANK)


def test_an_unknown_version_lists_the_known_ones():
    with pytest.raises(HpcrlError, match=r"known: 0\.8\.0\.dev \(b178a3cd\), 0\.10\.0\.dev \(1dda039b\)"):
        versions.resolve("verl", "0.9.0")


def test_the_default_is_the_newest_known_verl():
    assert versions.default("verl").commit == "1dda039b9c6311889a9c9a26040677e1254814f9"


def test_a_version_is_found_by_name_or_commit_prefix():
    assert versions.resolve("verl", "0.8.0.dev") == versions.resolve("verl", "b178a3cd5")


@pytest.mark.parametrize(
    "version,key,default",
    [
        (CURRENT, "trainer.use_v1", "true"),  # ppo_trainer.yaml:222 at 1dda039b
        (CURRENT, "actor_rollout_ref.rollout.calculate_log_probs", "true"),  # rollout/rollout.yaml:233 at 1dda039b
        (PIN, "actor_rollout_ref.rollout.calculate_log_probs", "false"),  # rollout/rollout.yaml:206 at b178a3cd
        (CURRENT, "reward.reward_model.enable", "false"),  # reward/reward.yaml:29 at 1dda039b
        (PIN, "reward_model.enable", "false"),  # reward_model/reward_model.yaml:7 at b178a3cd
    ],
)
def test_defaults_as_verl_declares_them(version, key, default):
    assert versions.table("verl", version)[key]["default"] == default


@pytest.mark.parametrize(
    "version,level,source",
    [
        (PIN, 2, "verl/workers/rollout/vllm_rollout/vllm_async_server.py:569"),
        (CURRENT, 2, "verl/workers/rollout/vllm_rollout/vllm_async_server.py:1143"),
    ],
)
def test_colocated_vllm_sleeps_at_level_2_at_both_versions(version, level, source):
    fact = versions.capabilities("verl", version)["vllm"]["sleep_level"]
    assert (fact["default"], fact["source"]) == (level, source)


@pytest.mark.parametrize(
    "backend,version",
    [(b, v.commit) for b in ("open-instruct", "verl", "openrlhf") for v in versions.known(b) if v.commit],
)
def test_each_version_s_key_table_was_read_at_its_commit(backend, version):
    assert versions.meta(backend, version)["commit"] == version


@pytest.mark.parametrize(
    "backend,release,wheel",
    [
        ("verl", "0.9.1", "verl-0.9.1-py3-none-any.whl"),
        ("openrlhf", "0.11.1", "openrlhf-0.11.1-cp311-cp311-manylinux1_x86_64.whl"),
        ("openrlhf", "0.11.2", "openrlhf-0.11.2-cp311-cp311-manylinux1_x86_64.whl"),
    ],
)
def test_each_release_s_key_table_was_read_from_its_wheel(backend, release, wheel):
    meta = versions.meta(backend, release)
    assert (meta["release"], meta["source"].split(",")[0]) == (release, wheel)


def test_every_fact_of_the_current_verl_cites_a_file_and_line():
    facts = versions.capabilities("verl", CURRENT)
    sources = [
        f["source"]
        for section in ("default_path", "features", "vllm", "install")
        for f in facts[section].values()
        if isinstance(f, dict)
    ]
    assert [s for s in sources if not re.match(r"^[\w./-]+:\d+$", s)] == []
