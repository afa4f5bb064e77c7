"""Measure GPU memory and time of DeepSpeed ZeRO-3 RL training steps (one configuration per launch).

Launch one process per GPU, e.g.
    torchrun --nproc_per_node 2 benchmarks/zero3_memory.py --model qwen2.5-1.5b --seq 4096 \
        --micro-batches 4 --gc 1 --logprob-impl eager --out rows.jsonl

Method (shared/DESIGN.md, "Memory: what the measurements say"): the model is built from a
config in benchmarks/configs with random bf16 weights under deepspeed.zero.Init. A step is K
micro-batches of T tokens, each forward -> logits -> per-token log-probs of the next token ->
policy-gradient loss -> engine.backward, then one optimizer step (--steps steps; the last is
timed and its phase peaks recorded).

--mode open-instruct (open-instruct e6c3044a, open_instruct/grpo_fast.py): client
torch.optim.AdamW(fused=True); DeepSpeed gradient_accumulation_steps 1 (:341) with
set_gradient_accumulation_boundary, empty_cache before each backward and engine.step() at the
boundary only (:726-733); the reference policy (--ref 1) is a second ZeRO-3 engine in the same
process whose K log-prob forwards run before the training loop (:610-615).
--mode openrlhf: see zero3_openrlhf.py.
Rank 0 appends one JSON row to --out; a rank that runs out of memory appends a row with status
"oom" and ends the launch.
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

import zero3_openrlhf
from zero3_setup import (
    GIB,
    Peaks,
    add_lora,
    build_logprob_fns,
    build_model,
    ds_config,
    ds_numel,
    eval_ds_config,
    make_batches,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="name of a file in benchmarks/configs, e.g. qwen2.5-1.5b")
    p.add_argument(
        "--seq", required=True,
        help="packed tokens per micro-batch (T); a comma list runs each in turn on the same engine, one row each",
    )  # fmt: skip
    p.add_argument("--gc", type=int, choices=[0, 1], default=1, help="gradient checkpointing")
    p.add_argument("--offload", choices=["none", "optimizer", "params"], default="none")
    p.add_argument("--logprob-impl", choices=["eager", "compiled"], default="eager")
    p.add_argument("--lora-rank", type=int, default=0, help="0 = full fine-tuning")
    p.add_argument("--steps", type=int, default=2, help="optimizer steps; the last is timed")
    p.add_argument("--micro-batches", type=int, default=4, help="forward+backward passes per optimizer step (K)")
    p.add_argument("--mode", choices=["open-instruct", "openrlhf"], default="open-instruct")
    p.add_argument("--ref", type=int, choices=[0, 1], default=0, help="colocated reference policy forward")
    p.add_argument(
        "--empty-cache", type=int, choices=[0, 1], default=1,
        help="open-instruct: torch.cuda.empty_cache() before each backward (grpo_fast.py:726)",
    )  # fmt: skip
    p.add_argument(
        "--ds-torch-adam", type=int, choices=[0, 1], default=0,
        help="openrlhf: torch_adam in DeepSpeed's optimizer section (where FusedAdam/CPUAdam cannot be built)",
    )  # fmt: skip
    p.add_argument("--role", choices=["actor", "ref"], default="actor", help=argparse.SUPPRESS)
    p.add_argument("--handshake", default="", help=argparse.SUPPRESS)
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


def seq_list(text: str) -> list[int]:
    """`--seq 4096,8192`: ascending, so a length that runs out of memory ends the launch last."""
    return sorted(int(x) for x in str(text).split(",") if x.strip())


def run_step(args, step, si, engine, ref_engine, ref_proc, batches, row, phase_end, logprob_fn, cross_entropy):
    """One optimizer step: the reference forward, then K micro-batches; the last step is recorded."""
    import torch

    orl = args.mode == "openrlhf"
    last = step == args.steps - 1
    K = len(batches)
    if orl:
        torch.cuda.empty_cache()  # OpenRLHF ppo_actor.py:599, before fit
    if ref_proc is not None:
        row["phase"] = f"step{step}.ref_process"
        ref_proc.signal(f"go{si}_{step}")
        done = ref_proc.wait_for(f"done{si}_{step}")
        if last:
            row["ref_process"]["forward"] = done
            row["ref_forward_s"] = done["forward_s"]
    phase_end("idle", False)
    if ref_engine is not None:
        row["phase"] = f"step{step}.ref_forward"
        t0 = time.time()
        with torch.no_grad():
            for b in batches:
                out = ref_engine(input_ids=b["input_ids"], position_ids=b["position_ids"], use_cache=False)
                logprob_fn(out.logits, b["input_ids"])
                del out
        phase_end("ref_forward", last)
        if last:
            row["ref_forward_s"] = time.time() - t0
    mb_s = []
    t_step = time.time()
    for k, b in enumerate(batches):
        boundary = k == K - 1
        t0 = time.time()
        row["phase"] = f"step{step}.mb{k}.forward"
        out = engine(input_ids=b["input_ids"], position_ids=b["position_ids"], use_cache=False)
        if last and k == 0:
            row["logits_dtype"] = str(out.logits.dtype).replace("torch.", "")
        phase_end("forward", last)
        row["phase"] = f"step{step}.mb{k}.logprob"
        held = None
        if orl:
            logprobs = zero3_openrlhf.fp32_logprobs(out, b["input_ids"], cross_entropy)
            aux = getattr(out, "aux_loss", None)
            held = out  # OpenRLHF ppo_actor.py:294: `output` lives until training_step returns
        else:
            logits = out.logits
            del out
            logprobs = logprob_fn(logits, b["input_ids"])
            if args.hold_logits:
                held = logits
            del logits  # open-instruct's forward_for_logprobs drops the logits on return
            aux = None
        loss = -(logprobs.float() * b["advantages"]).mean()
        if aux is not None:
            loss = loss + 0.001 * aux
        del logprobs, aux
        phase_end("logprob", last)
        row["phase"] = f"step{step}.mb{k}.backward"
        if not orl:
            if args.empty_cache:
                torch.cuda.empty_cache()
            engine.set_gradient_accumulation_boundary(boundary)
        engine.backward(loss)
        if not orl:
            held = None
        if orl and not boundary:
            engine.step()  # not a boundary: DeepSpeed only counts the micro-step
        phase_end("backward", last)
        mb_s.append(time.time() - t0)
        if boundary:
            row["phase"] = f"step{step}.optimizer_step"
            t1 = time.time()
            engine.step()
            phase_end("step", last)
            if last:
                row["optimizer_step_s"] = time.time() - t1
        del held
        row["loss"] = float(loss.detach())
        del loss
    torch.cuda.synchronize()
    row["step_s"].append(time.time() - t_step)
    if last:
        row["micro_batch_s"] = mb_s


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    from fsdp_memory import load_cross_entropy

    if args.mode == "openrlhf" and not args.ds_torch_adam:
        args.ds_torch_adam = int(not zero3_openrlhf.ds_ops_ready())

    if args.role == "ref":
        cross_entropy = load_cross_entropy()
        return zero3_openrlhf.ref_main(
            args,
            seq_list(args.seq),
            lambda cfg: build_model(args, cfg)[:2],
            lambda model_cfg, seq, device: make_batches(
                args, seq, model_cfg.vocab_size, device, int(os.environ.get("RANK", 0))
            ),  # fmt: skip
            eval_ds_config,
            cross_entropy,
        )
    rank = int(os.environ.get("RANK", 0))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    t_start = time.time()
    orl = args.mode == "openrlhf"
    K = args.micro_batches

    import torch

    torch.cuda.set_device(local_rank)
    peaks = Peaks(torch)
    row: dict = {
        "harness": "zero3_memory",
        "harness_mode": args.mode,
        "model": args.model,
        "params": None,
        "seq": args.seq if "," in args.seq else int(args.seq),
        "mb": 1,
        "micro_batches": K,
        "gc": args.gc,
        "offload": args.offload,
        "ref": args.ref,
        "world": world,
        "rank": rank,
        "status": "error",
        "gpu": torch.cuda.get_device_name(local_rank),
        "total_gib": torch.cuda.get_device_properties(local_rank).total_memory / GIB,
        "after_init_gib": None,
        "peak_alloc_gib": None,
        "peak_reserved_gib": None,
        "step_s": [],
        "micro_batch_s": [],
        "optimizer_step_s": None,
        "ref_forward_s": None,
        "torch": torch.__version__,
        "deepspeed": None,
        "logprob_impl": None,
        "lora_rank": args.lora_rank,
        "trainable_params": None,
        "zero_stage": 3,
        "phase_peaks_gib": {},
        "phase_peaks_reserved_gib": {},
        "device_used_max_gib": 0.0,
        "attn_impl": None,
        "optimizer": None,
        "ds_config": None,
        "vocab_size": None,
        "docs": args.docs,
        "hold_logits": args.hold_logits,
        "empty_cache_before_backward": int(args.empty_cache and not orl),
        "steps": args.steps,
        "phase": "setup",
        "tag": args.tag,
        "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "concurrent_on_gpu": int(os.environ.get("ZERO3_CONCURRENT_ON_GPU", "1")),
    }
    ref_proc = None

    def write_row() -> None:
        peaks.fold()
        row["peak_alloc_gib"] = peaks.alloc / GIB
        row["peak_reserved_gib"] = peaks.reserved / GIB
        row["host_maxrss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1 << 20)
        row["wall_s"] = time.time() - t_start
        with open(args.out, "a") as f:
            f.write(json.dumps(row) + "\n")

    def phase_end(name: str, record: bool) -> None:
        """Fold the peak since the last phase into `name` (max over micro-batches), then reset."""
        torch.cuda.synchronize()
        a, r = peaks.fold()
        if record:
            pk, pr = row["phase_peaks_gib"], row["phase_peaks_reserved_gib"]
            pk[name], pr[name] = max(pk.get(name, 0.0), a), max(pr.get(name, 0.0), r)
            used = zero3_openrlhf.device_used_gib(torch)
            row["device_used_max_gib"] = max(row["device_used_max_gib"], used)
        torch.cuda.reset_peak_memory_stats()

    try:
        if orl and args.ref:
            # spawned first so both processes build their models at once, as OpenRLHF's groups do
            hs = Path(args.out).resolve().parent / f"refhs_{os.environ.get('MASTER_PORT', '0')}"
            ref_proc = zero3_openrlhf.RefProcess(str(Path(__file__).resolve()), argv, rank, hs)
        import deepspeed
        import torch.distributed as dist
        import transformers

        row["deepspeed"] = deepspeed.__version__
        row["transformers"] = transformers.__version__
        if not dist.is_initialized():
            # as open-instruct: init the process group first, then let DeepSpeed wrap it
            dist.init_process_group(backend="nccl")
        deepspeed.init_distributed()

        config = ds_config(args)
        model, model_cfg, keep = build_model(args, config)
        row["vocab_size"] = model_cfg.vocab_size
        row["zero_init"] = "transformers.from_config+HfDeepSpeedConfig"
        row["attn_impl"] = getattr(model.config, "_attn_implementation", None)
        row["params"] = sum(ds_numel(p) for p in model.parameters())
        if keep["expected"] is not None and row["params"] != keep["expected"]:
            row["params_mismatch_reference"] = keep["expected"]
        if args.gc and orl:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        elif args.gc:
            # no kwargs, as open-instruct; transformers 5 then uses use_reentrant=False
            model.gradient_checkpointing_enable()
        row["gc_use_reentrant"] = False if args.gc else None
        row["ds_torch_adam"] = args.ds_torch_adam
        if args.lora_rank > 0:
            model = add_lora(model, args, row)
        trainable = [p for p in model.parameters() if p.requires_grad]
        row["trainable_params"] = sum(ds_numel(p) for p in trainable)

        optimizer = None
        if orl:
            row["optimizer"] = "ds_config:AdamW"
        elif args.offload != "none" and args.offload_optimizer_impl == "ds_cpu_adam":
            from deepspeed.ops.adam import DeepSpeedCPUAdam

            optimizer = DeepSpeedCPUAdam(trainable, lr=1e-6, adamw_mode=True)
        else:
            optimizer = torch.optim.AdamW(trainable, lr=1e-6, fused=True)
        if optimizer is not None:
            row["optimizer"] = type(optimizer).__name__
        row["phase"] = "deepspeed.initialize"
        engine, optimizer, _, _ = deepspeed.initialize(
            model=model, optimizer=optimizer, model_parameters=trainable if orl else None,
            config=config, dist_init_required=False,
        )  # fmt: skip
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
        row["ds_inner_optimizer"] = type(getattr(engine.optimizer, "optimizer", None)).__name__

        ref_engine = None
        if args.ref and not orl:
            row["phase"] = "reference.initialize"
            ref_cfg = eval_ds_config()
            ref_model, _, ref_keep = build_model(args, ref_cfg)
            ref_engine, *_ = deepspeed.initialize(model=ref_model, config=ref_cfg, dist_init_required=False)
            ref_engine.eval()
            torch.cuda.synchronize()
            row["after_ref_init_gib"] = torch.cuda.memory_allocated() / GIB
        if ref_proc is not None:
            row["ref_process"] = {"ready": ref_proc.wait_for("ready")}
        row["device_used_after_init_gib"] = zero3_openrlhf.device_used_gib(torch)

        device = torch.device("cuda", local_rank)
        cross_entropy = load_cross_entropy() if orl else None
        if orl:
            row["logprob_impl"] = "fp32_flash_attn_triton_ce" if cross_entropy else "fp32_chunked_logsumexp"
        else:
            row["logprob_impl"] = "eager_fp32" if args.logprob_impl == "eager" else "compiled"
        logprob_fn = build_logprob_fns()[args.logprob_impl]
        engine.train()
        base = dict(row)
        for si, seq in enumerate(seq_list(args.seq)):
            # each length is its own row: peaks and times start afresh; the cache is emptied between
            torch.cuda.empty_cache()
            peaks.alloc = peaks.reserved = 0
            row.clear()
            row.update(json.loads(json.dumps(base)), seq=seq, seq_index=si, tag=f"{args.tag}:s{seq}")
            t_seq = time.time()
            batches = make_batches(args, seq, model_cfg.vocab_size, device, rank)
            for step in range(args.steps):
                run_step(args, step, si, engine, ref_engine, ref_proc, batches, row, phase_end, logprob_fn,
                         cross_entropy)  # fmt: skip
            del batches
            row["phase"] = "done"
            row["status"] = "ok"
            row["seq_wall_s"] = time.time() - t_seq
            if rank == 0:
                write_row()
        if ref_proc is not None:
            ref_proc.close()
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
        if ref_proc is not None:
            ref_proc.proc.kill()
        # leave at once: the other ranks would otherwise wait in a collective forever
        os._exit(3)


if __name__ == "__main__":
    sys.exit(main())
