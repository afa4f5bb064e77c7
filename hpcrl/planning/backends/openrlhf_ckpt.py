"""OpenRLHF's checkpoint flags from hpcrl's disk budget (hpcrl/planning/disk_backends.py).

What OpenRLHF writes at 3c3be623 is listed there with its source: DeepSpeed state in
`ckpt.path/_actor` (at most `ckpt.max_num`; under LoRA with the frozen base, a full-model-sized
part), HF saves with `--ckpt.save_hf` (never deleted), the final save in `ckpt.output_dir`.

When the config sets none of the checkpoint flags and the DeepSpeed state does not fit the run
root's quota (with the HF model cache when it lives there), hpcrl renders `--ckpt.disable_ds
--ckpt.save_hf --ckpt.max_num N`, as the users did by hand (`--disable_ds_ckpt --save_hf_ckpt
--max_ckpt_num 2` before the renames), and says what it costs: a restart cannot resume, and
the HF saves accumulate. Flags the config sets are the user's: render checks them against the
quota and refuses, naming settings that fit (hpcrl/planning/disk_check.py).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from hpcrl.planning.disk import GIB
from hpcrl.planning.disk_backends import budget
from hpcrl.planning.disk_budget import DiskInputs, shares_quota

if TYPE_CHECKING:
    from hpcrl.planning.layout import Workload
    from hpcrl.planning.run_types import HpcrlSection
    from hpcrl.profiles import ClusterProfile

DEFAULT_MAX_NUM = 3  # OpenRLHF's --ckpt.max_num default
USER_KEYS = ("ckpt.disable_ds", "ckpt.save_hf", "ckpt.max_num")


def checkpoint_flags(args: dict[str, Any], w: Workload, learner_gpus: int, profile: ClusterProfile,
                     section: HpcrlSection) -> tuple[dict[str, Any], list[str]]:
    """Flags to render (name -> value) and warnings, from the disk budget and the run root's quota."""
    max_num = int(args.get("ckpt.max_num", DEFAULT_MAX_NUM))
    keep = {} if "ckpt.max_num" in args else {"ckpt.max_num": max_num}
    quota_gib = profile.storage.run_root.quota_gib
    if any(k in args for k in USER_KEYS) or quota_gib is None:
        return keep, []
    root = section.run_root or profile.storage.run_root.path
    # The interval is planned later (cadence): count ckpt.max_num saves, as a long run reaches.
    s = DiskInputs(w.model, learners=learner_gpus, lora_rank=w.lora_rank, total_steps=None, ckpt_every=1,
                   keep=max_num, model_cache=shares_quota(root, profile.storage.hf_home), quota_bytes=quota_gib * GIB,
                   lora_hf_save=section.lora_hf_save)
    now = budget("openrlhf", s)
    if now.fits:
        return keep, []
    state, final = now.item("deepspeed_state"), now.item("final_save")
    assert state is not None and final is not None
    cache = now.item("model_cache")
    what = (f"DeepSpeed state checkpoints do not fit the run root's {quota_gib:,.0f} GiB quota: ckpt.max_num "
            f"{max_num} x {state.one_bytes / GIB:,.0f} GiB + the final {final.one_bytes / GIB:,.0f} GiB save"
            + (f" + the {cache.one_bytes / GIB:,.0f} GiB model cache" if cache else ""))
    room = quota_gib * GIB - (cache.one_bytes if cache else 0.0)
    n = max(1, min(max_num, int(room // final.one_bytes) - 1))
    flags = {"ckpt.disable_ds": True, "ckpt.save_hf": True, "ckpt.max_num": n}
    after = budget("openrlhf", replace(s, disable_ds=True, save_hf=True, keep=n))
    return flags, [
        f"{what}; rendering --ckpt.disable_ds --ckpt.save_hf --ckpt.max_num {n}: a restart cannot resume (no "
        f"DeepSpeed state) and starts training over, and OpenRLHF never deletes HF saves "
        f"({final.one_bytes / GIB:,.1f} GiB each; the quota holds {int(room // final.one_bytes)}"
        + ("" if after.fits else "; even one does not fit") + ")"
    ]


__all__ = ["checkpoint_flags"]
