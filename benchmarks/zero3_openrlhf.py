"""What zero3_memory.py's `--mode openrlhf` does differently, each as OpenRLHF does it.

File:line at OpenRLHF/OpenRLHF@3c3be6234e0cb353e76bb8019947db9dfe99fca7 (the commit hpcrl's
openrlhf backend knows, hpcrl/planning/backends/data/versions.json):
* DeepSpeed config: openrlhf/utils/deepspeed/deepspeed_utils.py:7-75. Every "auto" value is dropped
  by DeepSpeed's config model (DeepSpeed's defaults apply), zero_hpz_partition_size is --ds.zpg
  (default 1, cli/train_ppo_ray.py:321), reduce_scatter on, offload_optimizer cpu with pin_memory
  under --ds.adam_offload; the optimizer is a config section {"type": "AdamW"}
  (utils/deepspeed/deepspeed.py:357-365, 412-420), so DeepSpeed builds FusedAdam on the GPU or
  DeepSpeedCPUAdam with adam offload; train_batch_size / micro size set gradient accumulation
  (deepspeed.py:455-456), and the trainer calls backward and engine.step() on every micro-batch
  (trainer/ray/ppo_actor.py:354-359; DeepSpeed steps the optimizer at the boundary only).
* logits: cast to fp32 in place of the bf16 ones (models/actor.py:267), log-probs through flash-attn's
  Triton cross-entropy (models/utils.py:143-150; flash-attn==2.8.3 is in requirements.txt), whose
  backward allocates a new fp32 gradient (flash_attn/ops/triton/cross_entropy.py:262 at v2.8.3).
* `output` (holding the fp32 logits) lives until training_step returns, i.e. through backward and
  the optimizer step (ppo_actor.py:294, 354-359).
* LoRA: enable_input_require_grads, then get_peft_model(model, LoraConfig(...)) with peft's default
  autocast_adapter_dtype, i.e. fp32 adapters (models/actor.py:177-188); target all-linear
  (cli/train_ppo_ray.py:367).
* reference model: its own Ray actor (process) on the same GPU with --train.colocate_actor_ref
  (cli/train_ppo_ray.py:41-50, 89-101), a bf16 Actor under the eval DeepSpeed config
  (trainer/ray/launcher.py:104-124, deepspeed_utils.py:78-117), forward under no_grad
  (launcher.py:145-154), then empty_cache on it before the actor goes on
  (trainer/ppo_utils/experience_maker.py:100-106, 174-179); the actor empties its cache before
  training (ppo_actor.py:599).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

GIB = float(1 << 30)


def ds_optimizer_section(torch_adam: int = 0) -> dict:
    """OpenRLHF's optimizer section (deepspeed.py:357-365) with its CLI defaults."""
    params = {"lr": 1e-6, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.0}
    if torch_adam:
        params["torch_adam"] = True
    return {"type": "AdamW", "params": params}


def ds_ops_ready(timeout_s: float = 600.0) -> bool:
    """Wait for the device script's build of FusedAdam/CPUAdam (ZERO3_OPS_MARKER); False if it failed."""
    marker = os.environ.get("ZERO3_OPS_MARKER")
    if not marker:
        return True
    t0 = time.time()
    while not Path(marker).exists() and time.time() - t0 < timeout_s:
        time.sleep(1.0)
    return Path(marker).exists() and Path(marker).read_text().strip() == "ok"


def fp32_logprobs(out, input_ids, cross_entropy):
    """OpenRLHF's log-prob path: fp32 logits replace the bf16 ones inside `out`, then flash-attn CE."""
    import torch

    out["logits"] = out["logits"].to(torch.float32)
    logits = out["logits"]
    rolled = torch.roll(input_ids, shifts=-1, dims=1)
    V = logits.shape[-1]
    if cross_entropy is not None:
        losses = cross_entropy(logits.reshape(-1, V), rolled.reshape(-1))
        logprobs = -losses[0].view(*logits.shape[:-1])
    else:  # OpenRLHF's own fallback without flash-attn (models/utils.py:151-155)
        picked = torch.gather(logits, dim=-1, index=rolled.unsqueeze(-1)).squeeze(-1)
        flat = logits.reshape(-1, V)
        lse = torch.zeros(flat.shape[0], device=flat.device, dtype=flat.dtype)
        for s in range(0, flat.shape[0], 1024):
            lse[s : s + 1024] = torch.logsumexp(flat[s : s + 1024], dim=-1)
        logprobs = picked - lse.view(*logits.shape[:-1])
    return logprobs[:, :-1]


def device_used_gib(torch_mod) -> float:
    """Everything on the GPU, every process and context included."""
    free, total = torch_mod.cuda.mem_get_info()
    return (total - free) / GIB


class RefProcess:
    """The reference model's own process on this GPU (its rank in a group of its own)."""

    def __init__(self, script: str, argv: list[str], rank: int, out_dir: Path):
        self.dir = out_dir
        self.rank = rank
        self.dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env["MASTER_PORT"] = str(int(env.get("MASTER_PORT", "29500")) + 1)
        # torchrun's agent store lives on its own port; the reference group needs a store of its own
        env["TORCHELASTIC_USE_AGENT_STORE"] = "False"
        cmd = [sys.executable, script, *argv, "--role", "ref", "--handshake", str(self.dir)]
        self.log = open(self.dir / f"ref_r{rank}.log", "w")
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT)

    def wait_for(self, name: str, timeout_s: float = 900.0) -> dict:
        path = self.dir / f"{name}_r{self.rank}.json"
        t0 = time.time()
        while not path.exists():
            if self.proc.poll() is not None:
                tail = (self.dir / f"ref_r{self.rank}.log").read_text(errors="replace")[-1500:]
                raise RuntimeError(f"reference process ended (rc {self.proc.returncode}) before {name}: {tail}")
            if time.time() - t0 > timeout_s:
                raise TimeoutError(f"reference process: no {name} in {timeout_s:.0f}s")
            time.sleep(0.05)
        return json.loads(path.read_text())

    def signal(self, name: str) -> None:
        (self.dir / f"{name}_r{self.rank}.json").write_text("{}")

    def close(self) -> None:
        self.signal("exit")
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def wait_file(path: Path, timeout_s: float = 900.0) -> None:
    t0 = time.time()
    while not path.exists():
        if time.time() - t0 > timeout_s:
            raise TimeoutError(f"no {path.name} in {timeout_s:.0f}s")
        time.sleep(0.05)


def ref_main(args, seqs, build_model, make_batches, eval_config, cross_entropy) -> int:
    """The reference process: ZeRO-3 eval engine, K no-grad forwards per step when the actor says go."""
    import deepspeed
    import torch
    import torch.distributed as dist

    rank = int(os.environ.get("RANK", 0))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local_rank)
    hs = Path(args.handshake)

    def put(name: str, data: dict) -> None:
        tmp = hs / f".{name}_r{rank}.json"
        tmp.write_text(json.dumps(data))
        tmp.rename(hs / f"{name}_r{rank}.json")

    dist.init_process_group(backend="nccl")
    deepspeed.init_distributed()
    cfg = eval_config()
    model, model_cfg = build_model(cfg)
    engine, *_ = deepspeed.initialize(model=model, config=cfg, dist_init_required=False)
    engine.eval()
    torch.cuda.synchronize()
    put("ready", {"after_init_gib": torch.cuda.memory_allocated() / GIB,
                  "after_init_reserved_gib": torch.cuda.memory_reserved() / GIB})  # fmt: skip
    for si, seq in enumerate(seqs):
        batches = make_batches(model_cfg, seq, torch.device("cuda", local_rank))
        for step in range(args.steps):
            ref_forward(engine, batches, cross_entropy, hs, put, f"{si}_{step}", rank)
        del batches
    wait_file(hs / f"exit_r{rank}.json")
    dist.destroy_process_group()
    return 0


def ref_forward(engine, batches, cross_entropy, hs: Path, put, name: str, rank: int) -> None:
    """One experience-making pass of the reference: K no-grad forwards, then empty_cache."""
    import torch

    wait_file(hs / f"go{name}_r{rank}.json")
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.synchronize()
    t0 = time.time()
    with torch.no_grad():
        for b in batches:
            out = engine(input_ids=b["input_ids"], position_ids=b["position_ids"], use_cache=False)
            lp = fp32_logprobs(out, b["input_ids"], cross_entropy)
            del out, lp
    torch.cuda.synchronize()
    data = {"forward_s": time.time() - t0, "peak_alloc_gib": torch.cuda.max_memory_allocated() / GIB,
            "peak_reserved_gib": torch.cuda.max_memory_reserved() / GIB,
            "device_used_at_forward_gib": device_used_gib(torch)}  # fmt: skip
    torch.cuda.empty_cache()  # experience_maker.py:103-105 with colocate_actor_ref
    data["after_empty_gib"] = torch.cuda.memory_allocated() / GIB
    data["after_empty_reserved_gib"] = torch.cuda.memory_reserved() / GIB
    put(f"done{name}", data)
