"""OpenRLHF's checkpoint flags from hpcrl's disk plan (hpcrl/disk.py).

What OpenRLHF does (read at 3c3be623, ppo_actor.save_checkpoint and
utils/deepspeed/deepspeed.py save_ckpt), every `--ckpt.save_steps` global steps:

* unless `--ckpt.disable_ds`: DeepSpeed state (ZeRO-3: fp32 master weights and Adam moments,
  12 bytes per trainable parameter over all ranks) in `ckpt.path/_actor/global_stepN`; before
  writing, the oldest are deleted so that at most `--ckpt.max_num` exist (and their total stays
  under `--ckpt.max_mem` GB). `--ckpt.load_enable` resumes from there; nothing else resumes.
* with `--ckpt.save_hf`: bf16 weights (or the LoRA adapter) in `ckpt.path/global_stepN_hf`,
  never deleted (`ckpt.max_num` does not apply to them).
* at the end, the final model in `ckpt.output_dir`.

So the peak is max_num state checkpoints plus the final save. When that exceeds the run
root's quota, hpcrl renders `--ckpt.disable_ds --ckpt.save_hf --ckpt.max_num N`, as the
users did by hand (`--disable_ds_ckpt --save_hf_ckpt --max_ckpt_num 2` before the renames),
and says what it costs: a restart cannot resume, and the HF saves accumulate.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hpcrl.disk import GIB, plan_disk

if TYPE_CHECKING:
    from hpcrl.layout import Workload
    from hpcrl.profiles import ClusterProfile

DEFAULT_MAX_NUM = 3  # OpenRLHF's --ckpt.max_num default


def checkpoint_flags(args: dict[str, Any], w: Workload, learner_gpus: int,
                     profile: ClusterProfile) -> tuple[dict[str, Any], list[str]]:
    """Flags to render (name -> value) and warnings, from the disk plan and the run root's quota."""
    max_num = int(args.get("ckpt.max_num", DEFAULT_MAX_NUM))
    keep = {} if "ckpt.max_num" in args else {"ckpt.max_num": max_num}
    if args.get("ckpt.disable_ds"):
        return keep, []
    disk = plan_disk(w.model, zero_stage=3, n_learners=learner_gpus, lora_rank=w.lora_rank)
    quota_gib = profile.storage.run_root.quota_gib
    peak = max_num * disk.state_bytes + disk.hf_bytes
    if quota_gib is None or peak <= quota_gib * GIB:
        return keep, []
    quota = quota_gib * GIB
    what = (f"DeepSpeed state checkpoints do not fit the run root's {quota_gib:,.0f} GiB quota: ckpt.max_num "
            f"{max_num} x {disk.state_bytes / GIB:,.0f} GiB + the final {disk.hf_bytes / GIB:,.0f} GiB save")
    if args.get("ckpt.save_hf") is False:
        return keep, [f"{what}; ckpt.save_hf is false in the config, so hpcrl leaves the checkpoint flags alone"]
    n = max_num if "ckpt.max_num" in args else max(1, min(max_num, int(quota // disk.hf_bytes) - 1))
    flags = {"ckpt.disable_ds": True, "ckpt.save_hf": True, "ckpt.max_num": n}
    return flags, [
        f"{what}; rendering --ckpt.disable_ds --ckpt.save_hf --ckpt.max_num {n}: a restart cannot resume (no "
        f"DeepSpeed state) and starts training over, and OpenRLHF never deletes HF saves "
        f"({disk.hf_bytes / GIB:,.1f} GiB each; the quota holds {int(quota // disk.hf_bytes)})"
    ]


__all__ = ["checkpoint_flags"]
