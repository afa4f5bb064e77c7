"""Each backend's checkpoint kinds at its pinned commit, as a disk budget (pure).

Read from the frameworks' source (backends/data/capabilities.json "checkpoints" names the
same lines):

* open-instruct e6c3044a: DeepSpeed state and HF saves, sized and counted by hpcrl/planning/disk.py.
* verl b178a3cd: one FSDP checkpoint per `trainer.save_freq` steps and at the last step
  (trainer/ppo/ray_trainer.py:1645-1647): per rank `model_world_size_W_rank_R.pt` (the actor's
  parameters, fp32: workers/fsdp_workers.py:324-326, the frozen base too under LoRA), `optim_...`
  (Adam's two fp32 moments of the trained parameters) and `extra_state_...`
  (utils/checkpoint/fsdp_checkpoint_manager.py:220-245); `huggingface/` gets the config and
  tokenizer, and the whole model gathered on rank 0 only when `checkpoint.save_contents` holds
  `hf_model` (:300-348: the gathered state dict, in the parameters' fp32); under LoRA,
  `lora_adapter/` (fsdp_workers.py:1088-1105, fp32 parameters). Rotation
  (checkpoint_manager.py:144-172) keeps `trainer.max_actor_ckpt_to_keep`, and with 1 keeps the
  old one until the new one is complete: two at the peak.
* OpenRLHF 3c3be623: every `ckpt.save_steps`, unless `ckpt.disable_ds`, DeepSpeed's state in
  `ckpt.path/_actor` after evicting down to `ckpt.max_num - 1` (utils/deepspeed/deepspeed.py:
  706-752; trainer/ray/ppo_actor.py:660-672); under LoRA it holds the frozen base weights too,
  a full-model-sized part (exclude_frozen_parameters is not passed: DeepSpeed edaa7221
  runtime/engine.py:4749). With `ckpt.save_hf`, an HF save in `ckpt.path/global_stepN_hf`
  (ppo_actor.py:674-680), never deleted; at the end one in `ckpt.output_dir` (:607-615). Under
  LoRA that save is the adapter only (deepspeed.py:565-574). OpenRLHF before 2d0b9854
  (2024-01-11) merged the adapter into the base and wrote the full model
  (utils/deepspeed.py:258-273 at 3efc5f82), the size of the users' 203 GB save (seed 000):
  `lora_hf_save: full` plans that behaviour.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hpcrl.planning.disk import GIB, HF_OVERHEAD_BYTES, RANK_OVERHEAD_BYTES, DiskSetup, plan_disk, state_checkpoint_terms
from hpcrl.planning.disk_budget import Budget, DiskInputs, Fix, Item, cache_items, interval_values, search, shares_quota
from hpcrl.profiles import ClusterProfile

# Each backend's name for the neutral settings (None: the backend has no such setting).
KEYS: dict[str, dict[str, str | None]] = {
    "open-instruct": {"ckpt_every": "checkpoint_state_freq", "keep": "keep_last_n_checkpoints", "hf_every": "save_freq",
                      "save_hf": None, "disable_ds": None, "zero_stage": "deepspeed_stage", "lora_rank": None},
    "verl": {"ckpt_every": "trainer.save_freq", "keep": "trainer.max_actor_ckpt_to_keep", "hf_every": None,
             "save_hf": "actor_rollout_ref.actor.checkpoint.save_contents", "disable_ds": None, "zero_stage": None,
             "lora_rank": "actor_rollout_ref.model.lora_rank"},
    "custom": {"ckpt_every": "save_steps", "keep": "keep_checkpoints", "hf_every": None, "save_hf": None,
               "disable_ds": None, "zero_stage": None, "lora_rank": "lora_rank"},
    "openrlhf": {"ckpt_every": "ckpt.save_steps", "keep": "ckpt.max_num", "hf_every": None, "save_hf": "ckpt.save_hf",
                 "disable_ds": "ckpt.disable_ds", "zero_stage": "ds.zero_stage", "lora_rank": "ds.lora.rank"},
}
OI = "open-instruct e6c3044a"
VERL_SRC = "verl b178a3cd: utils/checkpoint/fsdp_checkpoint_manager.py:180-362, workers/fsdp_workers.py:324-326"
ORL_DS = ("OpenRLHF 3c3be623: utils/deepspeed/deepspeed.py:679-752, trainer/ray/ppo_actor.py:660-672; frozen base: "
          "DeepSpeed edaa7221 runtime/engine.py:4749")
ORL_HF = "OpenRLHF 3c3be623: utils/deepspeed/deepspeed.py:533-590 (LoRA: 565-574)"
ORL_FULL = "OpenRLHF before 2d0b9854: utils/deepspeed.py:258-273 at 3efc5f82 (merge_and_unload); seed 000's 203 GB"


def budget(backend: str, s: DiskInputs) -> Budget:
    """The disk budget of a run of `backend`, with single settings that fit when it does not."""
    s.check()
    build = {"open-instruct": _open_instruct, "verl": _verl, "openrlhf": _openrlhf, "custom": _custom}[backend]
    b = build(s)
    if b.fits is False:
        b = replace(b, fixes=tuple(f for f in _fixes(backend, b, build) if f is not None))
    return b


def _trainable(s: DiskInputs) -> int:
    return s.model.lora_params(s.lora_rank) if s.lora_rank else s.model.total_params


def _saves(every: int, steps: int | None, at_end: bool = False) -> int | None:
    """Saves over the run: every `every` steps (and at the last step when at_end); None: unknown."""
    if every <= 0:
        return 0
    if steps is None:
        return None
    return steps // every + (1 if at_end and steps % every else 0)


def _open_instruct(s: DiskInputs) -> Budget:
    keep = -1 if s.keep is None else s.keep
    plan = plan_disk(s.model, zero_stage=s.zero_stage, n_learners=s.learners, lora_rank=s.lora_rank,
                     save_freq=s.hf_every, checkpoint_state_freq=s.ckpt_every, keep_last_n_checkpoints=keep,
                     total_steps=s.total_steps or 1)
    # <= 0 turns each off in grpo_fast (`if args.save_freq > 0`, :1664); the final HF save is unconditional (:2052).
    state_when = f"every {s.ckpt_every}, keep {keep}" if s.ckpt_every > 0 else "none: checkpoint_state_freq <= 0"
    hf_when = f"every {s.hf_every} + final" if s.hf_every > 0 else "final only: save_freq <= 0"
    items = [Item("deepspeed_state", f"DeepSpeed state (checkpoint_state_dir/global_stepN, {state_when})",
                  plan.state_bytes, plan.n_state_saves, plan.state_at_peak,
                  f"{OI}: open_instruct/grpo_fast.py:767, utils.py:838-857", plan.state_terms),
             Item("hf_save", f"HF save: {plan.hf_kind} ({hf_when})", plan.hf_bytes, plan.n_hf_saves,
                  plan.hf_at_peak, f"{OI}: open_instruct/grpo_fast.py:827, 1664-1669, 2052")]
    extra, notes = cache_items(s, True, f"{OI}: open_instruct/rl_utils.py:100-128 (save_traces)")
    settings = {"checkpoint_state_freq": s.ckpt_every, "keep_last_n_checkpoints": keep, "save_freq": s.hf_every,
                "deepspeed_stage": s.zero_stage, "total_steps": s.total_steps}
    return Budget("open-instruct", s, plan.trainable_params, settings, tuple(items + extra),
                  tuple(plan.notes + notes))


def _verl(s: DiskInputs) -> Budget:
    p, t = s.model.total_params, _trainable(s)
    terms = {"model shards (fp32 parameters" + (", the frozen base too)" if s.lora_rank else ")"):
             4.0 * (p + (t if s.lora_rank else 0)), "Adam moments (fp32)": 8.0 * t,
             "extra state, data.pt (per rank)": float(RANK_OVERHEAD_BYTES * s.learners),
             "huggingface/ config and tokenizer": float(HF_OVERHEAD_BYTES)}
    if s.save_hf:
        terms["huggingface/ whole model (hf_model; fp32 as gathered)"] = 4.0 * p
    if s.lora_rank:
        terms["lora_adapter/ (fp32)"] = 4.0 * t
    saves = _saves(s.ckpt_every, s.total_steps, at_end=True)
    keep = None if s.keep is None or s.keep <= 0 else s.keep
    bound = None if keep is None else max(keep, 2) if keep == 1 else keep
    notes = []
    if saves is None:
        at_peak = bound or 1
        if bound is None:
            notes.append("max_actor_ckpt_to_keep null keeps every checkpoint: one counted; give --total-steps")
    else:
        at_peak = saves if bound is None else min(saves, bound)
    items = [Item("fsdp_state", f"FSDP checkpoint (global_step_N/actor, every {s.ckpt_every} and at the end, keep "
                  f"{keep if keep is not None else 'all'})", sum(terms.values()), saves, at_peak,
                  f"{VERL_SRC}; checkpoint_manager.py:144-172", terms)]
    extra, more = cache_items(s, s.total_steps is not None, "verl b178a3cd: trainer/ppo/ray_trainer.py:396-422 "
                              "(trainer.rollout_data_dir)")
    contents = ["model", "optimizer", "extra"] + (["hf_model"] if s.save_hf else [])
    settings = {"trainer.save_freq": s.ckpt_every, "trainer.max_actor_ckpt_to_keep": keep,
                "actor_rollout_ref.actor.checkpoint.save_contents": contents,
                "actor_rollout_ref.model.lora_rank": s.lora_rank, "total_steps": s.total_steps}
    return Budget("verl", s, t, settings, tuple(items + extra), tuple(notes + more))


def _openrlhf(s: DiskInputs) -> Budget:
    p, t = s.model.total_params, _trainable(s)
    full = not s.lora_rank or s.lora_hf_save == "full"
    hf_one = 2.0 * (p if full else t) + HF_OVERHEAD_BYTES
    if not s.lora_rank:
        hf_what, hf_src = "full weights (bf16)", ORL_HF
    elif full:
        hf_what, hf_src = "full model under LoRA (lora_hf_save full)", ORL_FULL
    else:
        hf_what, hf_src = "LoRA adapter only", ORL_HF
    saves = _saves(s.ckpt_every, s.total_steps)
    items, notes = [], []
    if not s.disable_ds:
        terms = state_checkpoint_terms(DiskSetup(s.model, s.zero_stage, s.learners, s.lora_rank), t)
        at_peak = max(0, s.keep or 0) if saves is None else min(saves, max(0, s.keep or 0))
        if saves is None and s.ckpt_every > 0:
            notes.append(f"DeepSpeed state: ckpt.max_num {s.keep} counted (the run's step count depends on its dataset)")
        items.append(Item("deepspeed_state", f"DeepSpeed state (ckpt.path/_actor/global_stepN, every {s.ckpt_every}, "
                          f"ckpt.max_num {s.keep})", sum(terms.values()), saves, at_peak, ORL_DS, terms))
    if s.save_hf and s.ckpt_every > 0:
        n = saves if saves is not None else 1
        if saves is None:
            notes.append(f"HF saves are never deleted: one counted; each further save adds {hf_one / 1024**3:,.1f} GiB "
                         "(give --total-steps, or data.max_samples in the config)")
        items.append(Item("hf_save", f"HF save: {hf_what} (ckpt.path/global_stepN_hf, every {s.ckpt_every})", hf_one,
                          saves, n, hf_src + "; trainer/ray/ppo_actor.py:674-680"))
    items.append(Item("final_save", f"final save: {hf_what} (ckpt.output_dir)", hf_one, 1, 1,
                      hf_src + "; trainer/ray/ppo_actor.py:607-615"))
    if s.lora_rank and not full:
        notes.append("LoRA HF saves hold the adapter only at OpenRLHF 3c3be623 (rank 0 still gathers the whole bf16 "
                     "model in host RAM to write it); --lora-hf-save full plans a full-model save instead")
    extra, more = cache_items(s, s.total_steps is not None, None)
    settings = {"ckpt.save_steps": s.ckpt_every, "ckpt.max_num": s.keep, "ckpt.save_hf": s.save_hf,
                "ckpt.disable_ds": s.disable_ds, "ds.zero_stage": s.zero_stage, "ds.lora.rank": s.lora_rank,
                "lora_hf_save": s.lora_hf_save, "total_steps": s.total_steps}
    return Budget("openrlhf", s, t, settings, tuple(items + extra), tuple(notes + more))


def _custom(s: DiskInputs) -> Budget:
    """A user's script: an HF Trainer-style LoRA checkpoint (the adapter in fp32 and the optimizer's two fp32
    moments) every save_steps; how many it keeps is the script's (keep_checkpoints, HF save_total_limit).
    An assumption about the script, derived from what HF Trainer and PEFT write, not read from it."""
    t = _trainable(s)
    terms = {"adapter (fp32)": 4.0 * t, "optimizer state (AdamW moments, fp32)": 8.0 * t,
             "config, tokenizer, trainer state": float(HF_OVERHEAD_BYTES)}
    saves = _saves(s.ckpt_every, s.total_steps)
    keep = None if s.keep is None or s.keep <= 0 else s.keep
    at_peak = (keep or 1) if saves is None else saves if keep is None else min(saves, keep + 1)
    notes = ["the custom backend's checkpoint is assumed to be an HF Trainer-style LoRA checkpoint (derived)"]
    items = [Item("adapter_checkpoint", f"script checkpoint (every {s.ckpt_every}, keep {keep or 'all'})",
                  sum(terms.values()), saves, at_peak, "assumed: HF Trainer/PEFT LoRA checkpoint (derived)", terms)]
    extra, more = cache_items(s, s.total_steps is not None, None)
    settings = {"save_steps": s.ckpt_every, "keep_checkpoints": keep, "lora_rank": s.lora_rank,
                "total_steps": s.total_steps}
    return Budget("custom", s, t, settings, tuple(items + extra), tuple(notes + more))


def _fixes(backend: str, b: Budget, build) -> list[Fix | None]:
    s, keys = b.inputs, KEYS[backend]
    out: list[Fix | None] = []
    if backend == "open-instruct":
        state = b.item("deepspeed_state")
        if state and state.written:
            out.append(search(build, s, "keep", list(range(state.written, 0, -1)), keys["keep"]))
        out.append(search(build, s, "hf_every", interval_values(s.hf_every, s.total_steps), keys["hf_every"]))
        if state and state.written:
            out.append(search(build, s, "ckpt_every", interval_values(s.ckpt_every, s.total_steps, 1), keys["ckpt_every"]))
    elif backend == "custom":
        out.append(search(build, s, "keep", list(range((s.keep or b.items[0].written or 2) - 1, 0, -1)), keys["keep"]))
        out.append(search(build, s, "ckpt_every", interval_values(s.ckpt_every, s.total_steps, 1), keys["ckpt_every"]))
    elif backend == "verl":
        top = (s.keep if s.keep and s.keep > 0 else (b.items[0].written or 1)) - 1
        out.append(search(build, s, "keep", list(range(top, 0, -1)), keys["keep"]))
        if s.save_hf:
            out.append(search(build, s, "save_hf", [False], keys["save_hf"], lambda _: '["model","optimizer","extra"]'))
        out.append(search(build, s, "ckpt_every", interval_values(s.ckpt_every, s.total_steps, 1), keys["ckpt_every"]))
    else:
        if not s.disable_ds:
            out.append(search(build, s, "keep", list(range((s.keep or 1) - 1, 0, -1)), keys["keep"]))
            out.append(search(build, s, "disable_ds", [True], keys["disable_ds"]))
        if s.save_hf:
            out.append(search(build, s, "save_hf", [False], keys["save_hf"]))
            out.append(search(build, s, "ckpt_every", interval_values(s.ckpt_every, s.total_steps), keys["ckpt_every"]))
    return out


# Each backend's default for the number of state checkpoints kept: open-instruct's
# keep_last_n_checkpoints, what hpcrl renders for verl's trainer.max_actor_ckpt_to_keep, OpenRLHF's ckpt.max_num.
KEEP_DEFAULT = {"open-instruct": 3, "verl": 2, "openrlhf": 3}


def flag_inputs(backend: str, given: dict[str, Any], profile: ClusterProfile, quota_gib: float | None,
                hf_cache: bool | None, **extra: Any) -> tuple[DiskInputs, str]:
    """`plan-disk`'s flags (None: not given) as inputs, with the backend's defaults; and where the quota is from."""
    from hpcrl.errors import HpcrlError
    from hpcrl.models import resolve_model

    if backend not in KEEP_DEFAULT:
        raise HpcrlError(f"--backend {backend!r}: valid: {', '.join(KEEP_DEFAULT)}")
    store = profile.storage
    quota = quota_gib if quota_gib is not None else store.run_root.quota_gib
    cache = hf_cache if hf_cache is not None else quota_gib is None and shares_quota(store.run_root.path, store.hf_home)
    keep = given.get("keep_last_n_checkpoints")

    def get(name: str, default: Any) -> Any:
        return default if given.get(name) is None else given[name]

    s = DiskInputs(resolve_model(get("model", "32b")), learners=get("learners", 8), lora_rank=get("lora_rank", 0),
                   zero_stage=get("zero_stage", 3), total_steps=get("total_steps", 1000),
                   ckpt_every=get("checkpoint_state_freq", 200), hf_every=get("save_freq", 200),
                   keep=KEEP_DEFAULT[backend] if keep is None else None if keep == -1 and backend == "verl" else keep,
                   save_hf=bool(given.get("save_hf")), disable_ds=bool(given.get("disable_ds")),
                   lora_hf_save=get("lora_hf_save", "adapter"), model_cache=cache,
                   quota_bytes=None if quota is None else quota * GIB, **extra)
    return s, "--quota-gib" if quota_gib is not None else f"{profile.name} run_root ({store.run_root.path})"


def settings_text(b: Budget) -> str:
    """The settings that set the budget, in the backend's keys."""
    return ", ".join(f"{k} {_shown(v)}" for k, v in b.settings.items() if k != "total_steps")


def _shown(v: Any) -> str:
    return "null" if v is None else str(v).lower() if isinstance(v, bool) else str(v)


__all__ = ["KEEP_DEFAULT", "KEYS", "budget", "flag_inputs", "settings_text"]
