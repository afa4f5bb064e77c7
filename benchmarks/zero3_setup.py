"""The pieces of zero3_memory.py's launch: DeepSpeed configs, the model under zero.Init, batches, log-probs."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import zero3_openrlhf

HERE = Path(__file__).resolve().parent
GIB = float(1 << 30)
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def ds_config(args: argparse.Namespace) -> dict:
    """The DeepSpeed config: ZeRO-3 with DeepSpeed's own defaults for every bucket and threshold."""
    zero: dict = {"stage": 3}
    if args.offload in ("optimizer", "params"):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if args.offload == "params":
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    orl = args.mode == "openrlhf"
    cfg = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": args.micro_batches if orl else 1,
        "gradient_clipping": 1.0,
        "bf16": {"enabled": True},
        "zero_optimization": zero,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if orl:
        cfg["zero_optimization"]["reduce_scatter"] = True
        cfg["zero_optimization"]["zero_hpz_partition_size"] = 1
        cfg["optimizer"] = zero3_openrlhf.ds_optimizer_section(torch_adam=args.ds_torch_adam)
    elif args.offload != "none" and args.offload_optimizer_impl == "torch_adamw":
        # DeepSpeed refuses a client optimizer other than DeepSpeedCPUAdam with offload unless told.
        cfg["zero_force_ds_cpu_optimizer"] = False
    return cfg


def eval_ds_config() -> dict:
    """The reference policy's config: ZeRO-3, bf16, no optimizer (OpenRLHF deepspeed_utils.py:78-117)."""
    return {
        "train_micro_batch_size_per_gpu": 1,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": 3},
        "steps_per_print": 10**9,
    }


def load_model_config(name: str):
    from transformers import AutoConfig

    raw = json.loads((HERE / "configs" / f"{name}.json").read_text())
    expected = raw.pop("_reference_total_params", None)
    model_type = raw.pop("model_type")
    raw.pop("architectures", None)
    raw.pop("torch_dtype", None)
    cfg = AutoConfig.for_model(model_type, **raw)
    cfg.use_cache = False
    return cfg, expected


def pick_attn(requested: str) -> str:
    if requested != "auto":
        return requested
    try:
        from transformers.utils import is_flash_attn_2_available

        if is_flash_attn_2_available():
            return "flash_attention_2"
    except ImportError:
        pass
    return "sdpa"


def build_logprob_fns():
    """Both log-prob paths. `compiled` mirrors open-instruct: compiled log_softmax+gather in the logits' dtype."""
    import torch

    def eager_fp32(logits, input_ids):
        labels = input_ids[:, 1:]
        logprobs = torch.log_softmax(logits[:, :-1].float(), dim=-1)
        return torch.gather(logprobs, dim=-1, index=labels.unsqueeze(-1)).squeeze(-1)

    @torch.compile(dynamic=True)
    def log_softmax_and_gather(logits, index):
        logprobs = logits.log_softmax(dim=-1)
        return torch.gather(logprobs, dim=-1, index=index.unsqueeze(-1)).squeeze(-1)

    def compiled(logits, input_ids, temperature: float = 1.0):
        logits = logits / temperature
        logits = logits[:, :-1]
        labels = input_ids[:, 1:].clone()
        return log_softmax_and_gather(logits, labels)

    return {"eager": eager_fp32, "compiled": compiled}


class Peaks:
    """Peak memory over the whole run, surviving the per-phase resets of torch's peak counters."""

    def __init__(self, torch_mod):
        self.torch = torch_mod
        self.alloc = 0
        self.reserved = 0

    def fold(self) -> tuple[float, float]:
        cuda = self.torch.cuda
        a, r = cuda.max_memory_allocated(), cuda.max_memory_reserved()
        self.alloc, self.reserved = max(self.alloc, a), max(self.reserved, r)
        return a / GIB, r / GIB

    def phase_start(self) -> None:
        self.fold()
        self.torch.cuda.reset_peak_memory_stats()


def ds_numel(p) -> int:
    return int(getattr(p, "ds_numel", p.numel()))


def build_model(args: argparse.Namespace, config: dict):
    """The random-weight model under deepspeed.zero.Init; returns (model, its config, extras to keep)."""
    import torch
    from transformers import AutoModelForCausalLM

    try:
        from transformers.integrations import HfDeepSpeedConfig
    except ImportError:
        from transformers.deepspeed import HfDeepSpeedConfig
    # keep a reference: transformers looks it up through a weakref to activate zero.Init
    dschf = HfDeepSpeedConfig(config)
    model_cfg, expected = load_model_config(args.model)
    if args.mode == "openrlhf" and hasattr(model_cfg, "output_router_logits"):
        model_cfg.output_router_logits = True  # OpenRLHF models/actor.py:201-204 (MoE balancing loss)
    model = AutoModelForCausalLM.from_config(model_cfg, dtype=torch.bfloat16, attn_implementation=pick_attn(args.attn))
    if not all(hasattr(p, "ds_id") for p in model.parameters()):
        raise RuntimeError("model was not partitioned by deepspeed.zero.Init")
    model.config.use_cache = False
    return model, model_cfg, {"dschf": dschf, "expected": expected}


def make_batches(args: argparse.Namespace, T: int, vocab: int, device, rank: int) -> list[dict]:
    """K packed micro-batches of T random ids (position_ids restart every T/docs tokens)."""
    import torch

    gen = torch.Generator(device=device).manual_seed(1234 + rank)
    doc_len = -(-T // max(1, args.docs))
    out = []
    for _ in range(args.micro_batches):
        out.append({
            "input_ids": torch.randint(0, vocab, (1, T), device=device, generator=gen),
            "position_ids": (torch.arange(T, device=device) % doc_len).unsqueeze(0),
            "advantages": torch.randn(1, T - 1, device=device, generator=gen),
        })  # fmt: skip
    return out


def add_lora(model, args: argparse.Namespace, row: dict):
    """peft adapters after zero.Init: bf16 for open-instruct, peft's fp32 default for OpenRLHF."""
    import peft
    import torch
    from peft import LoraConfig, get_peft_model

    lcfg = LoraConfig(
        r=args.lora_rank,
        lora_alpha=2 * args.lora_rank,
        lora_dropout=0.0,
        target_modules=LORA_TARGETS,
        bias="none",
        task_type="CAUSAL_LM",
    )
    row["peft"] = peft.__version__
    if args.mode == "openrlhf":
        model.enable_input_require_grads()  # OpenRLHF models/actor.py:179
        model = get_peft_model(model, lcfg)
    else:
        # deepspeed.initialize converts the new adapter tensors to ZeRO parameters; bf16 here
        model = get_peft_model(model, lcfg, autocast_adapter_dtype=False)
        for p in model.parameters():
            if p.requires_grad and p.dtype != torch.bfloat16:
                p.data = p.data.to(torch.bfloat16)
    row["adapter_dtype"] = str(next(p.dtype for p in model.parameters() if p.requires_grad)).replace("torch.", "")
    return model
