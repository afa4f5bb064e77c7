"""verl's learner as the memory model sees it at b178a3cd (its `memory` facts, hpcrl/planning/backends/facts.py).

FSDP reduces gradients in fp32 (mixed_precision reduce_dtype) and frees them after the step; the
actor update is hpcrl/memory/fsdp_learner.py's; the plan-memory flags verl has no setting for are
refused with the reason.
"""

from __future__ import annotations

from hpcrl.memory.fsdp_learner import VerlUpdate
from hpcrl.memory.sharding import FSDP
from hpcrl.memory.vllm_accounting import VllmEngineFacts
from hpcrl.planning.backends.facts import MemoryDefault, MemoryFacts

# Why every GPU of a verl node trains (Backend.fills_learner_nodes): the pool and the colocated workers.
FILLS_NODES = (
    "verl's resource pool takes trainer.n_gpus_per_node on every node (main_ppo.py:204 at b178a3cd, "
    "ppo/v1/trainer_base.py:760 at 1dda039b), and its colocated workers all train"
)


def memory_facts(actor: str, rollout: str, micro_key: str, flag_table: str) -> MemoryFacts:
    """verl's MemoryFacts, in its keys (verl.py's actor and rollout key prefixes, micro-batch key, key table)."""
    return MemoryFacts(
        defaults=(
            MemoryDefault("grad_accum_dtype", None, ("fsdp", "mixed_precision")),
            MemoryDefault("load_ref_policy", "actor_rollout_ref.actor.use_kl_loss", ("features", "ref_policy")),
            MemoryDefault(
                "gradient_checkpointing",
                "actor_rollout_ref.model.enable_gradient_checkpointing",
                ("features", "gradient_checkpointing"),
            ),
            MemoryDefault(
                "util", "actor_rollout_ref.rollout.gpu_memory_utilization", ("vllm", "gpu_memory_utilization")
            ),
        ),
        colocated=True,
        grads_resident=False,
        grad_dtype_origin="FSDP mixed precision",
        grad_dtype="fp32",
        sharding=FSDP,
        fsdp_version=1,
        fsdp_version_origin=f"verl's default {actor}strategy fsdp (its FSDPActorConfig, {flag_table})",
        fsdp_version_key=actor + "strategy",
        micro_batches_origin=f"{actor}ppo_mini_batch_size x {rollout}n / GPUs / {micro_key} (dp_actor.py:551-559 at b178a3cd; "
        "the mini-batch at ppo/v1/trainer_base.py:1724-1725 at 1dda039b)",
        refused_flags={
            "--zpg": "verl's actor is FSDP, which keeps no ZeRO++ secondary weight copy",
            "--zero-stage": "verl's actor is FSDP (FULL_SHARD), not DeepSpeed ZeRO; say --fsdp-version 1|2",
            "--grad-accum-dtype": "verl's FSDP reduces gradients in fp32 (MixedPrecision reduce_dtype, "
            "fsdp_workers.py:496 at b178a3cd, engine/fsdp/transformer_impl.py:378-382 at 1dda039b)",
            "--logprob-impl": "verl's log-prob path is its own (flash-attn's in-place cross-entropy after a "
            "temperature divide in place at b178a3cd, dp_actor.py:259, out of place at 1dda039b, "
            "transformer_impl.py:1357), which hpcrl models per verl version",
            "--offload optimizer": "verl's FSDP has no optimizer-only offload during the update (its "
            "param/optimizer offload moves state between phases); FSDP2's "
            "CPUOffloadPolicy is --offload params --fsdp-version 2",
        },
        vllm=vllm_facts(None),
    )


# The vLLM each verl version installs, read at its commit.
_VLLM_PINS = {
    "b178a3cd56f58b2d502255daba591e92833930a7": (
        "0.11.0",
        "verl 0.8.0.dev (b178a3cd) allows vllm>=0.8.5,<=0.12.0 (setup.py:52) and installs vllm==0.11.0 "
        "(scripts/install_vllm_sglang_mcore.sh:12; its images are verlai/verl:vllm011, docs/start/install.rst:60)",
    ),
    "1dda039b9c6311889a9c9a26040677e1254814f9": (
        "0.24.0",
        "verl 0.10.0.dev (1dda039b) pins vllm==0.24.0 (pyproject.toml:95)",
    ),
    "0.9.1": ("0.24.0", "verl 0.9.1's vllm extra pins vllm==0.24.0 (METADATA:81 in its wheel)"),
}


def vllm_facts(
    version: str | None,
    max_num_seqs: int = 256,
    max_num_batched_tokens: int = 8192,
    enforce_eager: bool = False,
    logprobs_mode: str = "processed_logprobs",
) -> VllmEngineFacts:
    """The vLLM a run of verl `version` (hpcrl.framework_version; None: the newest hpcrl knows) gets, with
    the scheduler sizes and enforce_eager its rollout passes (the run's keys; verl's defaults without a config)."""
    from hpcrl.planning.backends import versions

    pin, why = _VLLM_PINS[versions.resolve("verl", version).key]
    return VllmEngineFacts(
        pin,
        max_num_batched_tokens=max_num_batched_tokens,
        max_num_seqs=max_num_seqs,
        enforce_eager=enforce_eager,
        logprobs_mode=logprobs_mode,
        source=f"{why}; verl passes rollout.max_num_seqs / max_num_batched_tokens / enforce_eager / logprobs_mode to "
        "vLLM (verl/workers/rollout/vllm_rollout/vllm_async_server.py:272-278 at b178a3cd, :310-316 at "
        "1dda039b), 256 / 8192 / false / processed_logprobs by default (rollout.yaml:62,68 and "
        "workers/config/rollout.py:167 at b178a3cd; rollout.py:197 at 1dda039b)",
    )


def sleep_level(backend: str, version: str | None) -> int:
    """The level verl's hybrid (colocated) vLLM sleeps at, read at the run's verl version
    (capabilities vllm.sleep_level: 2 at b178a3cd and 1dda039b, vllm_async_server.py)."""
    from hpcrl.planning.backends import versions

    facts = versions.capabilities(backend, version).get("vllm", {})
    return int(facts.get("sleep_level", {}).get("default", 1))


def grad_sync_key(backend: str, version: str | None) -> str | None:
    """The config key that turns the version's gradient-sync default around (0.9.1's
    fsdp_config.use_no_sync_for_gradient_accumulation), None where the version has none."""
    from hpcrl.planning.backends import versions

    fact = versions.capabilities(backend, version).get("fsdp", {}).get("update_grad_sync", {})
    return fact.get("key") if "when_true" in fact else None


def fsdp_update(backend: str, version: str | None, no_sync: bool | None = None, temperature: float = 1.0) -> VerlUpdate:
    """What the actor update does at the run's verl version (capabilities fsdp.update_*: b178a3cd's
    dp_actor.py, 1dda039b's engine workers, 0.9.1's engine with its no_sync switch), for
    hpcrl/memory/fsdp_learner.py. no_sync: the run's grad_sync_key value (None: the version's default);
    temperature: the run's rollout.temperature (0.9.1 skips the divide at exactly 1)."""
    from hpcrl.planning.backends import versions

    v = versions.resolve(backend, version)
    facts = versions.capabilities(backend, v.key).get("fsdp", {})
    sync = facts["update_grad_sync"]
    grad_sync = sync["when_true"] if (no_sync and "when_true" in sync) else sync["value"]
    if "when_true" in sync:
        said = "true" if no_sync else "false" if no_sync is not None else "false, its default"
        why = f"{backend} {v.name}, {sync['key']} {said} ({sync['source']} {v.at()})"
    else:
        why = f"{backend} {v.label()}, {sync['source']} {v.at()}"
    divide = facts["update_temperature_divide"]
    skipped = divide.get("at_unit_temperature") == "skipped" and float(temperature) == 1.0
    return VerlUpdate(
        version=v.name,
        temperature_divide="none" if skipped else divide["value"],
        grad_sync=grad_sync,
        lm_head_own_unit_fsdp2="lm_head (untied)" in facts["update_fsdp2_units"]["value"],
        grad_sync_why=why,
        tied_once=facts.get("update_flat_tied", {}).get("value") == "once",
    )
