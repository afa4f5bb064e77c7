"""verl's capability and checkpoint facts per version, read from each version's data (issue 23
item 4). Expected values are typed from verl's source at each commit (file:line beside each)."""

from __future__ import annotations

from hpcrl.planning.backends import versions

PIN, CURRENT = "b178a3cd", "1dda039b"
# The FSDP engine builds its (dp, sp) mesh from fsdp_config.ulysses_sequence_parallel_size
# (1dda039b: workers/engine/fsdp/transformer_impl.py:225-230, engine/fsdp.yaml:45); b178a3cd's
# fsdp_workers.py:170 read actor.ulysses_sequence_parallel_size.
SP_ENGINE_KEY = "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size"


def _feature(version: str, name: str) -> dict:
    return versions.capabilities("verl", version)["features"][name]


def test_the_engine_sequence_parallel_key_is_a_fact_of_the_current_version_only():
    assert (
        SP_ENGINE_KEY in _feature(CURRENT, "sequence_parallel")["keys"],
        SP_ENGINE_KEY in _feature(PIN, "sequence_parallel")["keys"],
    ) == (True, False)


def test_the_critic_defaults_on_through_gae_at_both_versions():
    # adv_estimator: gae at ppo_trainer.yaml:81 (b178a3cd) and :74 (1dda039b)
    assert (_feature(PIN, "critic")["default"], _feature(CURRENT, "critic")["default"]) == ("gae", "gae")


def test_resume_mode_defaults_to_auto_at_the_current_version():
    # resume_mode: auto at ppo_trainer.yaml:183 (1dda039b), read by v1/trainer_base.py:795-797
    assert _feature(CURRENT, "resume")["default"] == "auto"


def test_no_version_saves_on_a_signal():
    # 1dda039b: no SIGTERM/SIGUSR1 handler in verl/ (only SIGALRM, utils/py_functional.py:93)
    assert (_feature(PIN, "save_on_signal")["supported"], _feature(CURRENT, "save_on_signal")["supported"]) == (
        False,
        False,
    )


def test_the_actor_checkpoint_retention_key_is_the_same_at_both_versions():
    # trainer.max_actor_ckpt_to_keep: ppo_trainer.yaml:199 (b178a3cd), :210 (1dda039b)
    keep = [
        versions.capabilities("verl", v)["checkpoints"]["actor_fsdp"]["key_keep"].split()[0] for v in (PIN, CURRENT)
    ]
    assert keep == ["trainer.max_actor_ckpt_to_keep", "trainer.max_actor_ckpt_to_keep"]


def test_the_current_version_has_no_unread_feature_or_checkpoint_facts():
    pending = versions.capabilities("verl", CURRENT).get("needs_reading", [])
    assert [p for p in pending if p.startswith(("features.", "fsdp.", "services and checkpoints"))] == []


def test_the_fsdp_master_weights_are_fp32_at_both_versions():
    # model_dtype: fp32 at engine/fsdp.yaml:33 (both commits); 1dda039b loads in it at transformer_impl.py:239-245
    assert [versions.capabilities("verl", v)["fsdp"]["master_weights_dtype"]["value"] for v in (PIN, CURRENT)] == [
        "fp32",
        "fp32",
    ]
