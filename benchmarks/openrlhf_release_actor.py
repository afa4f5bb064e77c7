"""Measure OpenRLHF 0.11.2's own actor update (its Actor, DeepspeedStrategy and PolicyLoss, from the release's
wheel): per-GPU peak memory of a ZeRO-3 PPO update, without Ray and without vLLM.

    torchrun --nproc_per_node 2 benchmarks/openrlhf_release_actor.py --model-dir DIR --model qwen2.5-1.5b \
        --seqs 2 --seq-len 8192 --out rows.jsonl

Nothing of OpenRLHF is copied here. The run's arguments are parsed by OpenRLHF's own parser (the statements of
cli/train_ppo_ray.py's __main__ block before its final train(args): parse_args, hierarchize and the defaults it
fills in, train_ppo_ray.py:627-760). Then, as PolicyModelActor.init_model_from_pretrained
(trainer/ray/ppo_actor.py:495-564) does: get_strategy(args) and setup_distributed(); Actor(...) with the
strategy's ZeRO-3 train config; gradient checkpointing; strategy.prepare((actor, actor_cfg)). Each micro-batch
then goes as ActorPPOTrainer.training_step (ppo_actor.py:259-360) takes it: Actor forward with return_output,
PolicyLoss (built as ppo_actor.py:76-86) over get_loss_batch_info, strategy.backward, strategy.optimizer_step
(DeepSpeed steps at the accumulation boundary). Ray is not imported on this path; vLLM is not needed.
flash-attn is not built on the GPU machines: its pure files (bert_padding, utils.distributed and the Triton
cross-entropy OpenRLHF's log-probs use, models/utils.py:172-188) are carried from its 2.8.3 sdist.
Rows: benchmarks/results/openrlhf_release_actor.jsonl, each with the OpenRLHF release that produced it.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys
import time
from pathlib import Path

GIB = float(1 << 30)


def openrlhf_args(argv: list[str]):
    """OpenRLHF's own parser on `argv`: its entry file's standard-library imports and __main__ statements before
    train(args) (parse_args, hierarchize and the defaults it sets)."""
    import importlib.util

    path = os.path.join(os.path.dirname(importlib.util.find_spec("openrlhf").origin), "cli", "train_ppo_ray.py")
    tree = ast.parse(Path(path).read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test))
    body = [
        n
        for n in tree.body
        if isinstance(n, (ast.Import, ast.ImportFrom))
        and not getattr(n, "level", 0)
        and all(
            (x.name if isinstance(n, ast.Import) else n.module or "").split(".")[0] in sys.stdlib_module_names
            for x in n.names
        )
    ]  # the file's standard-library imports (datetime)
    # Every statement of the __main__ block but the last, train(args) (which starts Ray): the parser, hierarchize
    # and the block's own defaulting of the arguments (eps_clip_low_high, the IS threshold, ...).
    assert "train(" in ast.unparse(block.body[-1]), "the __main__ block no longer ends with train(args)"
    body += block.body[:-1]
    scope: dict = {"argparse": argparse}
    saved, sys.argv = sys.argv, [path, *argv]
    try:
        exec(compile(ast.Module(body=body, type_ignores=[]), path, "exec"), scope)  # noqa: S102 - its own parser
    finally:
        sys.argv = saved
    return scope["args"]


def measure(a: argparse.Namespace) -> dict:
    import importlib.metadata as md

    import torch
    from openrlhf.models import Actor, PolicyLoss
    from openrlhf.utils import get_strategy
    from openrlhf.utils.loss_utils import get_loss_batch_info

    world = int(os.environ.get("WORLD_SIZE", 1))
    flags = [
        "--actor.model_name_or_path",
        a.model_dir,
        "--data.prompt_dataset",
        "unused",
        "--ds.zero_stage",
        "3",
        "--actor.gradient_checkpointing_enable",
        "--ds.attn_implementation",
        "sdpa",
        "--train.micro_batch_size",
        str(a.micro_batch),
        "--train.batch_size",
        str(a.seqs * world),
        "--algo.advantage.estimator",
        "group_norm",
        "--rollout.n_samples_per_prompt",
        "2",
        "--algo.advantage.is_correction_level",
        a.is_level,
    ]
    args = openrlhf_args(flags)
    strategy = get_strategy(args)
    strategy.setup_distributed()
    rank = torch.distributed.get_rank()
    actor = Actor(
        a.model_dir,
        attn_implementation=args.ds.attn_implementation,
        experts_implementation=args.ds.experts_implementation,
        param_dtype=args.ds.param_dtype,
        load_in_4bit=args.ds.load_in_4bit,
        lora_rank=args.ds.lora.rank,
        lora_alpha=args.ds.lora.alpha,
        target_modules=args.ds.lora.target_modules,
        lora_dropout=args.ds.lora.dropout,
        ds_config=strategy.get_ds_train_config(),
        packing_samples=args.ds.packing_samples,
        temperature=args.rollout.temperature,
        use_liger_kernel=args.ds.use_liger_kernel,
    )
    actor.gradient_checkpointing_enable(
        gradient_checkpointing_kwargs={"use_reentrant": args.actor.gradient_checkpointing_reentrant}
    )
    actor_cfg = dict(
        optim=args.actor.optim,
        muon=vars(args.actor.muon),
        adam=vars(args.actor.adam),
        lr_scheduler=args.actor.lr_scheduler,
        lr_warmup_ratio=args.actor.lr_warmup_ratio,
        min_lr_ratio=args.actor.min_lr_ratio,
        max_norm=args.actor.max_norm,
        scheduler_steps=10,
    )
    actor, optim, sched = strategy.prepare((actor, actor_cfg))
    adv = args.algo.advantage
    loss_fn = PolicyLoss(
        clip_eps_low=args.actor.eps_clip_low_high[0],
        clip_eps_high=args.actor.eps_clip_low_high[1],
        dual_clip=args.actor.dual_clip,
        token_level_loss=args.actor.loss_agg_mode == "token-mean",
        policy_loss_type=args.actor.policy_loss_type,
        is_correction_level=adv.is_correction_level,
        is_correction_mode=adv.is_correction_mode,
        is_correction_gating=adv.is_correction_gating,
        is_correction_threshold=adv.is_correction_threshold,
    )
    torch.cuda.synchronize()
    after_init = torch.cuda.memory_allocated() / GIB
    vocab = json.loads((Path(a.model_dir) / "config.json").read_text())["vocab_size"]
    g = torch.Generator().manual_seed(rank)
    peaks, times = [], []
    dev = torch.cuda.current_device()
    for _step in range(a.steps):
        torch.cuda.empty_cache()  # as the actor does before training (ppo_actor.py ppo_train)
        torch.cuda.reset_peak_memory_stats()
        t0 = time.time()
        for _k in range(a.seqs // a.micro_batch):
            actor.train()
            seq = torch.randint(0, vocab, (a.micro_batch, a.seq_len), generator=g).to(dev)
            attention_mask = torch.ones_like(seq)
            action_mask = torch.ones((a.micro_batch, a.response_len), dtype=torch.bool, device=dev)
            old = -torch.rand((a.micro_batch, a.response_len), generator=g).to(dev)
            advantages = torch.randn((a.micro_batch, a.response_len), generator=g).to(dev)
            rollout = (old + 0.01) if a.is_level != "off" else None
            log_probs, output = actor(
                seq,
                action_mask,
                attention_mask=attention_mask,
                return_output=True,
                ring_attn_group=strategy.ring_attn_group,
                packed_seq_lens=None,
                return_entropy=args.actor.entropy_coef is not None,
            )
            info = get_loss_batch_info(strategy, action_mask)
            loss = loss_fn(log_probs, old, advantages, action_mask=action_mask, rollout_log_probs=rollout, **info)[0]
            strategy.backward(loss, actor, optim)
            strategy.optimizer_step(optim, actor, sched, name="actor")
            del output, log_probs, loss
        torch.cuda.synchronize()
        times.append(time.time() - t0)
        peaks.append((torch.cuda.max_memory_allocated() / GIB, torch.cuda.max_memory_reserved() / GIB))
    p = torch.cuda.get_device_properties(0)
    import deepspeed

    return {
        "harness": "openrlhf_release_actor",
        "framework": "openrlhf",
        "release": md.version("openrlhf"),
        "release_source": "PyPI wheel openrlhf-0.11.2-cp311-cp311-manylinux1_x86_64.whl (sha256 c969d70d...)",
        "model": a.model,
        "world": world,
        "rank": rank,
        "zero_stage": 3,
        "seqs_per_gpu": a.seqs,
        "seq_len": a.seq_len,
        "micro_batch": a.micro_batch,
        "micro_batches": a.seqs // a.micro_batch,
        "tokens_per_micro_batch": a.micro_batch * a.seq_len,
        "is_correction_level": a.is_level,
        "gc": 1,
        "logprob_impl": "fp32_flash_attn_triton_ce",
        "gpu": p.name,
        "total_gib": p.total_memory / GIB,
        "torch": torch.__version__,
        "deepspeed": deepspeed.__version__,
        "transformers": md.version("transformers"),
        "after_init_gib": after_init,
        "peak_alloc_gib": peaks[-1][0],
        "peak_reserved_gib": peaks[-1][1],
        "step_peaks_gib": peaks,
        "step_s": times,
        "status": "ok",
        "tag": a.tag,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="the benchmarks/configs name the model folder was made from")
    p.add_argument("--model-dir", required=True, help="an HF folder (benchmarks/verl_release_engine.py --make-model)")
    p.add_argument("--seqs", type=int, default=2, help="sequences per GPU per optimizer step")
    p.add_argument("--seq-len", type=int, default=8192)
    p.add_argument("--response-len", type=int, default=1024)
    p.add_argument("--micro-batch", type=int, default=1, help="--train.micro_batch_size")
    p.add_argument(
        "--is-level",
        choices=["off", "token", "seq"],
        default="off",
        help="--algo.advantage.is_correction_level (0.11.2)",
    )
    p.add_argument("--steps", type=int, default=2, help="optimizer steps; the last one is measured")
    p.add_argument("--out")
    p.add_argument("--tag", default="")
    a = p.parse_args()
    try:
        row = measure(a)
    except Exception as exc:  # one row saying why: a configuration that failed is recorded, not lost
        import traceback

        traceback.print_exc()
        row = {
            "harness": "openrlhf_release_actor",
            "model": a.model,
            "status": "error",
            "error": f"{type(exc).__name__}: {exc}"[:500],
            "rank": int(os.environ.get("RANK", 0)),
            "tag": a.tag,
        }
    print("ROW " + json.dumps(row), flush=True)
    if a.out and row.get("rank", 0) == 0:
        with open(a.out, "a") as fh:
            fh.write(json.dumps(row) + "\n")
    return 0 if row["status"] == "ok" else 1


if __name__ == "__main__":
    raise SystemExit(main())
