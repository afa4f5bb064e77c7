"""Measure GPU memory of DeepSpeed ZeRO-3 RL training steps (one configuration per launch).

Launch one process per GPU, e.g.
    torchrun --nproc_per_node 2 benchmarks/zero3_memory.py --model qwen2.5-1.5b --seq 4096 \
        --gc 1 --logprob-impl eager --out rows.jsonl

Method (shared/DESIGN.md, "Memory: what the measurements say"): the model is built from a
Qwen2.5 config with random bf16 weights under deepspeed.zero.Init; a client
torch.optim.AdamW(fused=True) goes to deepspeed.initialize, as open-instruct's grpo_fast does;
one micro-batch of T tokens runs forward -> logits -> per-token log-probs of the next token ->
policy-gradient loss -> engine.backward -> engine.step, three times. Rank 0 appends one JSON row
to --out; a rank that runs out of memory appends a row with status "oom" and ends the launch.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
GIB = float(1 << 30)
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="name of a file in benchmarks/configs, e.g. qwen2.5-1.5b")
    p.add_argument("--seq", type=int, required=True, help="packed tokens in the one micro-batch (T)")
    p.add_argument("--gc", type=int, choices=[0, 1], default=1, help="gradient checkpointing")
    p.add_argument("--offload", choices=["none", "optimizer", "params"], default="none")
    p.add_argument("--logprob-impl", choices=["eager", "compiled"], default="eager")
    p.add_argument("--lora-rank", type=int, default=0, help="0 = full fine-tuning")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--docs", type=int, default=1, help="documents packed in the micro-batch (position_ids restart)")
    p.add_argument("--attn", default="auto", help="auto = flash_attention_2 if installed, else sdpa")
    p.add_argument(
        "--offload-optimizer-impl",
        choices=["torch_adamw", "ds_cpu_adam"],
        default="torch_adamw",
        help="with offload: the client torch AdamW (needs zero_force_ds_cpu_optimizer false) or DeepSpeedCPUAdam",
    )
    p.add_argument(
        "--hold-logits",
        type=int,
        choices=[0, 1],
        default=0,
        help="1 = keep the bf16 logits referenced until after backward (a plain training loop); "
        "0 = drop them once the log-probs exist, as open-instruct's forward_for_logprobs does",
    )
    p.add_argument("--out", required=True, help="jsonl file to append the row to")
    p.add_argument("--tag", default="", help="free text copied into the row")
    return p.parse_args(argv)


def ds_config(args: argparse.Namespace) -> dict:
    """The DeepSpeed config: ZeRO-3 with DeepSpeed's own defaults for every bucket and threshold."""
    zero: dict = {"stage": 3}
    if args.offload in ("optimizer", "params"):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if args.offload == "params":
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    cfg = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "bf16": {"enabled": True},
        "zero_optimization": zero,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if args.offload != "none" and args.offload_optimizer_impl == "torch_adamw":
        # DeepSpeed refuses a client optimizer other than DeepSpeedCPUAdam with offload unless told.
        cfg["zero_force_ds_cpu_optimizer"] = False
    return cfg


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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rank = int(os.environ.get("RANK", 0))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    t_start = time.time()

    import torch

    torch.cuda.set_device(local_rank)
    peaks = Peaks(torch)
    row: dict = {
        "model": args.model,
        "params": None,
        "seq": args.seq,
        "mb": 1,
        "gc": args.gc,
        "offload": args.offload,
        "world": world,
        "rank": rank,
        "status": "error",
        "gpu": torch.cuda.get_device_name(local_rank),
        "total_gib": torch.cuda.get_device_properties(local_rank).total_memory / GIB,
        "after_init_gib": None,
        "peak_alloc_gib": None,
        "peak_reserved_gib": None,
        "step_s": [],
        "torch": torch.__version__,
        "deepspeed": None,
        "logprob_impl": "eager_fp32" if args.logprob_impl == "eager" else "compiled",
        "lora_rank": args.lora_rank,
        "trainable_params": None,
        "zero_stage": 3,
        "phase_peaks_gib": {},
        "phase_peaks_reserved_gib": {},
        "attn_impl": None,
        "optimizer": None,
        "ds_config": None,
        "vocab_size": None,
        "docs": args.docs,
        "hold_logits": args.hold_logits,
        "steps": args.steps,
        "phase": "setup",
        "tag": args.tag,
        "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "concurrent_on_gpu": int(os.environ.get("ZERO3_CONCURRENT_ON_GPU", "1")),
    }

    def write_row() -> None:
        peaks.fold()
        row["peak_alloc_gib"] = peaks.alloc / GIB
        row["peak_reserved_gib"] = peaks.reserved / GIB
        row["host_maxrss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1 << 20)
        row["wall_s"] = time.time() - t_start
        with open(args.out, "a") as f:
            f.write(json.dumps(row) + "\n")

    try:
        import deepspeed
        import torch.distributed as dist
        import transformers
        from transformers import AutoModelForCausalLM

        row["deepspeed"] = deepspeed.__version__
        row["transformers"] = transformers.__version__
        if not dist.is_initialized():
            # as open-instruct: init the process group first, then let DeepSpeed wrap it
            dist.init_process_group(backend="nccl")
        deepspeed.init_distributed()

        config = ds_config(args)
        try:
            from transformers.integrations import HfDeepSpeedConfig
        except ImportError:
            from transformers.deepspeed import HfDeepSpeedConfig
        # keep a reference: transformers looks it up through a weakref to activate zero.Init
        dschf = HfDeepSpeedConfig(config)  # noqa: F841

        model_cfg, expected = load_model_config(args.model)
        row["vocab_size"] = model_cfg.vocab_size
        attn = pick_attn(args.attn)
        row["attn_impl"] = attn
        model = AutoModelForCausalLM.from_config(model_cfg, dtype=torch.bfloat16, attn_implementation=attn)
        if not all(hasattr(p, "ds_id") for p in model.parameters()):
            raise RuntimeError("model was not partitioned by deepspeed.zero.Init")
        row["zero_init"] = "transformers.from_config+HfDeepSpeedConfig"
        row["attn_impl"] = getattr(model.config, "_attn_implementation", attn)
        row["params"] = sum(ds_numel(p) for p in model.parameters())
        if expected is not None and row["params"] != expected:
            row["params_mismatch_reference"] = expected
        row["rope_theta"] = (getattr(model.config, "rope_parameters", None) or {}).get(
            "rope_theta", getattr(model.config, "rope_theta", None)
        )
        model.config.use_cache = False

        if args.gc:
            # no kwargs, as open-instruct; transformers 5 then uses use_reentrant=False
            model.gradient_checkpointing_enable()
            row["gc_use_reentrant"] = False
        if args.lora_rank > 0:
            from peft import LoraConfig, get_peft_model

            lcfg = LoraConfig(
                r=args.lora_rank,
                lora_alpha=2 * args.lora_rank,
                lora_dropout=0.0,
                target_modules=LORA_TARGETS,
                bias="none",
                task_type="CAUSAL_LM",
            )
            # base weights are already ZeRO-3 partitioned; the new adapter weights are ordinary
            # tensors that deepspeed.initialize converts to ZeRO parameters. Keep them bf16 so the
            # engine's bf16 check passes (peft would otherwise upcast adapters to fp32).
            model = get_peft_model(model, lcfg, autocast_adapter_dtype=False)
            for p in model.parameters():
                if p.requires_grad and p.dtype != torch.bfloat16:
                    p.data = p.data.to(torch.bfloat16)
            import peft

            row["peft"] = peft.__version__
        trainable = [p for p in model.parameters() if p.requires_grad]
        row["trainable_params"] = sum(ds_numel(p) for p in trainable)

        if args.offload != "none" and args.offload_optimizer_impl == "ds_cpu_adam":
            from deepspeed.ops.adam import DeepSpeedCPUAdam

            optimizer = DeepSpeedCPUAdam(trainable, lr=1e-6, adamw_mode=True)
        else:
            optimizer = torch.optim.AdamW(trainable, lr=1e-6, fused=True)
        row["optimizer"] = type(optimizer).__name__
        row["phase"] = "deepspeed.initialize"
        engine, optimizer, _, _ = deepspeed.initialize(
            model=model, optimizer=optimizer, config=config, dist_init_required=False
        )
        torch.cuda.synchronize()
        row["after_init_gib"] = torch.cuda.memory_allocated() / GIB
        row["after_init_reserved_gib"] = torch.cuda.memory_reserved() / GIB
        zc = engine._config.zero_config
        row["ds_config"] = zc.model_dump(mode="json") if hasattr(zc, "model_dump") else dict(zc)
        row["ds_top"] = {
            "gradient_clipping": engine.gradient_clipping(),
            "bf16": engine.bfloat16_enabled(),
            "zero_force_ds_cpu_optimizer": engine.zero_force_ds_cpu_optimizer(),
            "train_micro_batch_size_per_gpu": engine.train_micro_batch_size_per_gpu(),
            "gradient_accumulation_steps": engine.gradient_accumulation_steps(),
        }
        row["ds_optimizer"] = type(engine.optimizer).__name__

        device = torch.device("cuda", local_rank)
        gen = torch.Generator(device=device).manual_seed(1234 + rank)
        T = args.seq
        input_ids = torch.randint(0, model_cfg.vocab_size, (1, T), device=device, generator=gen)
        doc_len = -(-T // max(1, args.docs))
        position_ids = (torch.arange(T, device=device) % doc_len).unsqueeze(0)
        advantages = torch.randn(1, T - 1, device=device, generator=gen)
        logprob_fn = build_logprob_fns()[args.logprob_impl]

        engine.train()
        for step in range(args.steps):
            last = step == args.steps - 1
            torch.cuda.synchronize()
            t0 = time.time()
            row["phase"] = f"step{step}.forward"
            if last:
                peaks.phase_start()
            out = engine(input_ids=input_ids, position_ids=position_ids, use_cache=False)
            logits = out.logits
            del out
            if last:
                row["logits_dtype"] = str(logits.dtype).replace("torch.", "")
                torch.cuda.synchronize()
                row["phase_peaks_gib"]["forward"], row["phase_peaks_reserved_gib"]["forward"] = peaks.fold()
                peaks.phase_start()
            row["phase"] = f"step{step}.logprob"
            logprobs = logprob_fn(logits, input_ids)
            held = logits if args.hold_logits else None
            del logits  # open-instruct's forward_for_logprobs drops the logits on return
            loss = -(logprobs.float() * advantages).mean()
            del logprobs
            if last:
                torch.cuda.synchronize()
                row["phase_peaks_gib"]["logprob"], row["phase_peaks_reserved_gib"]["logprob"] = peaks.fold()
                peaks.phase_start()
            row["phase"] = f"step{step}.backward"
            engine.backward(loss)
            del held
            if last:
                torch.cuda.synchronize()
                row["phase_peaks_gib"]["backward"], row["phase_peaks_reserved_gib"]["backward"] = peaks.fold()
                peaks.phase_start()
            row["phase"] = f"step{step}.step"
            engine.step()
            torch.cuda.synchronize()
            if last:
                row["phase_peaks_gib"]["step"], row["phase_peaks_reserved_gib"]["step"] = peaks.fold()
            row["step_s"].append(time.time() - t0)
            row["loss"] = float(loss.detach())
            del loss
        row["phase"] = "done"
        row["status"] = "ok"
        if rank == 0:
            write_row()
        dist.barrier()
        dist.destroy_process_group()
        return 0
    except BaseException as exc:  # noqa: BLE001 - every failure becomes a row
        msg = f"{type(exc).__name__}: {exc}"
        oom = isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in msg.lower()
        row["status"] = "oom" if oom else "error"
        row["error"] = msg[:2000]
        if not oom:
            row["traceback"] = traceback.format_exc()[-4000:]
        write_row()
        sys.stdout.flush()
        sys.stderr.write(f"[rank {rank}] {row['status']} in {row['phase']}: {msg[:500]}\n")
        # leave at once: the other ranks would otherwise wait in a collective forever
        os._exit(3)


if __name__ == "__main__":
    sys.exit(main())
