"""What a TRL job runs, as plain data: the DeepSpeed ZeRO-3 JSON and accelerate config hpcrl writes,
the `trl vllm-serve` server process, the `accelerate launch` trainer processes, and which nodes run
which (pure; the job description will format these, hpcrl/rendering does not read them yet).

Facts from TRL 1.16.0 (the release wheel; lines in data/trl/1.16.0/capabilities.json) and accelerate
1.15.0:

* `trl vllm-serve` parses its ScriptArguments (trl/scripts/vllm_serve.py:27-192, `--model`,
  `--tensor_parallel_size`, `--data_parallel_size`, `--host`, `--port`, `--gpu_memory_utilization`,
  `--max_model_len`, ...) and execs vLLM's own `vllm serve` with TRL's weight-transfer settings
  (vllm_serve.py:226-276, 293). Data parallelism above 1 is for MoE models only (vllm_serve.py:39-40).
* The trainer reaches it through `vllm_server_host`/`vllm_server_port` (trl/trainer/grpo_config.py:632,
  636; or `vllm_server_base_url`, :625) and first polls `GET {base_url}/health` until it answers, for
  at most `vllm_server_timeout` seconds (trl/generation/vllm_client.py:267-290; default 240 s,
  grpo_config.py:640-641). Then `init_communicator` opens an NCCL group on `vllm_group_port` (:647).
* The DeepSpeed JSON mirrors what accelerate 1.15 builds from TRL's own recipe
  (trl/accelerate_configs/zero3.yaml:1-22 -> accelerate/utils/dataclasses.py:1302-1326): ZeRO-3,
  DeepSpeed's own bucket and threshold defaults, the 16-bit weights gathered on save, "auto" batch
  sizes, gradient accumulation and clipping that transformers fills from GRPOConfig
  (transformers/integrations/deepspeed.py `trainer_config_process`). With optimizer offload hpcrl adds
  an `optimizer` section so that DeepSpeed builds its CPU Adam: transformers hands DeepSpeed its own
  torch AdamW otherwise (integrations/deepspeed.py:547-559), which DeepSpeed 0.19 refuses under
  offload unless `zero_force_ds_cpu_optimizer` is false.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

import yaml

from hpcrl.planning.backends.processes import HealthCheck, Process, ResumeRule, RunFile

# The trainer's module: `trl grpo` is trl/scripts/grpo.py run through accelerate launch
# (trl/cli/commands/training.py:39-72, trl/cli/accelerate_launcher.py:21-47).
GRPO_MODULE = "trl.scripts.grpo"
# The health path the trainer polls before it starts (trl/generation/vllm_client.py:278).
HEALTH_PATH = "/health"
# The ports TRL and accelerate default to, fixed for every job of every user (trl/scripts/vllm_serve.py:107-108
# and grpo_config.py:636 vllm_server_port 8000; grpo_config.py:647 vllm_group_port 51216, the NCCL weight-sync
# group; accelerate launch's --main_process_port 29500): on a shared node another job or user may hold them.
# hpcrl draws the job's own instead (processes.py `{port:NAME}`): the server's and the group's on the server
# node, the trainers' rendezvous on the first trainer node.
SERVER_PORT, GROUP_PORT, MAIN_PROCESS_PORT = "{port:server}", "{port:group}", "{port:main}"
# What the run dir holds for the launch (relative to $RUN_DIR).
ACCELERATE_CONFIG = "trl/accelerate.yaml"
DEEPSPEED_CONFIG = "trl/ds_zero3.json"


def deepspeed_config(offload: str = "none") -> dict[str, Any]:
    """The DeepSpeed ZeRO-3 JSON hpcrl writes ("none", "optimizer" or "params" offload to host RAM)."""
    zero: dict[str, Any] = {"stage": 3, "stage3_gather_16bit_weights_on_model_save": True}
    if offload in ("optimizer", "params"):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if offload == "params":
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    cfg: dict[str, Any] = {
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "bf16": {"enabled": "auto"},
        "zero_optimization": zero,
        "steps_per_print": 1_000_000_000,
    }
    if offload != "none":
        cfg["optimizer"] = {
            "type": "AdamW",
            "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"},
        }
    return cfg


def accelerate_config(num_machines: int, num_processes: int, deepspeed_file: str) -> dict[str, Any]:
    """The accelerate config hpcrl writes: TRL's zero3.yaml keys, with the DeepSpeed settings in a file.
    `machine_rank`, `main_process_ip` and `main_process_port` come on each node's command line. No
    `mixed_precision`: beside a `deepspeed_config_file` accelerate 1.15 refuses it (utils/dataclasses.py:1506-1530,
    seen on the GPU: benchmarks/results/trl_logs/); the DeepSpeed JSON's bf16 "auto" takes GRPOConfig's bf16."""
    return {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "DEEPSPEED",
        "deepspeed_config": {
            "deepspeed_config_file": deepspeed_file,
            "deepspeed_multinode_launcher": "standard",
            "zero3_init_flag": True,
        },
        "num_machines": num_machines,
        "num_processes": num_processes,
        "machine_rank": 0,
        "main_training_function": "main",
        "rdzv_backend": "static",
        "same_network": True,
        "use_cpu": False,
        "downcast_bf16": "no",
    }


@dataclass(frozen=True)
class TrlJob:
    """A TRL job's nodes, processes and the files they read: no Ray. Node 0 is the first node of the allocation."""

    mode: str  # "server" | "colocate"
    nodes: int
    roles: tuple[tuple[int, str], ...]  # node index -> role
    processes: tuple[Process, ...] = field(default=())
    files: tuple[RunFile, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "nodes": self.nodes,
            "roles": {str(i): r for i, r in self.roles},
            "processes": [asdict(p) for p in self.processes],
            "files": [f.path for f in self.files],
            "ray": False,
        }


def config_files(deepspeed: dict[str, Any], accelerate: dict[str, Any]) -> tuple[RunFile, ...]:
    """The DeepSpeed JSON and the accelerate YAML as the files the job writes."""
    return (
        RunFile(DEEPSPEED_CONFIG, json.dumps(deepspeed, indent=2, sort_keys=True) + "\n"),
        RunFile(ACCELERATE_CONFIG, yaml.safe_dump(accelerate, sort_keys=True)),
    )


__all__ = [
    "ACCELERATE_CONFIG",
    "DEEPSPEED_CONFIG",
    "GRPO_MODULE",
    "GROUP_PORT",
    "HEALTH_PATH",
    "HealthCheck",
    "MAIN_PROCESS_PORT",
    "Process",
    "ResumeRule",
    "RunFile",
    "SERVER_PORT",
    "TrlJob",
    "accelerate_config",
    "config_files",
    "deepspeed_config",
]
