"""Measure GPU memory and time of a verl-faithful FSDP actor update (one configuration per launch).

    torchrun --nproc_per_node 2 benchmarks/fsdp_memory.py --model qwen2.5-1.5b --seq 8192 \
        --micro-batches 2 --fsdp 1 --out rows.jsonl

What verl b178a3cd does, and what this harness does the same way (file:line at b178a3cd):
* actor weights fp32: verl/workers/fsdp_workers.py:324-326 (model_dtype unset -> fp32 for the actor).
* FSDP1: FULL_SHARD (fsdp_workers.py:521, reshard_after_forward true), one unit per decoder layer
  (`_no_split_modules`, verl/utils/fsdp_utils.py:95-133), MixedPrecision(param bf16, reduce fp32,
  buffer fp32) (fsdp_workers.py:495-503), no CPUOffload for the actor (fsdp_workers.py:526),
  use_orig_params false (fsdp_workers.py:196).
* FSDP2: fully_shard per decoder layer, then the embedding when untied, then the root
  (fsdp_utils.py:507-537), MixedPrecisionPolicy(bf16, fp32, cast_forward_inputs) (fsdp_workers.py:544);
  `--offload cpu_policy` is FSDP2's CPUOffloadPolicy(pin_memory=True) for the actor
  (fsdp_workers.py:547-550).
* gradient checkpointing with use_reentrant=False (fsdp_workers.py:440).
* optimizer: torch.optim.AdamW(lr, weight_decay=0.01, betas=(0.9, 0.999)) with torch's defaults,
  i.e. the foreach implementation (verl/workers/config/optimizer.py:42-44,146-200).
* use_remove_padding: the micro-batch is one packed row [1, T] with attention_mask None
  (verl/workers/actor/dp_actor.py:164-246); flash-attn's varlen kernel is not installed on the GPU
  machines, so attention is SDPA causal over the whole pack (position_ids 0..T-1).
* forward under torch.autocast(bf16) (dp_actor.py:155); logits squeezed to [T, V] and divided by the
  temperature in place (dp_actor.py:258-259); log-probs from flash-attn's Triton cross-entropy with
  inplace_backward unless entropy is computed (dp_actor.py:262-269, verl/utils/torch_functional.py:72-126);
  entropy through torch.compile(entropy_from_logits) (dp_actor.py:86-90, torch_functional.py:224-238).
* update_policy: zero_grad, then K micro-batches each scaled by 1/K and backward, then
  clip_grad_norm_(1.0) and step, then zero_grad again (dp_actor.py:560, 660, 665, 668, 391-416).
* reference policy: an FSDP module of the same dtype with CPUOffload(offload_params=True) (FSDP1) or
  CPUOffloadPolicy (FSDP2) (fsdp_workers.py:526, 552), forward only, before the update.
* `--offload verl`: actor param_offload + optimizer_offload: the flat shards and Adam states go to
  the CPU after the update and come back before it (fsdp_workers.py:893-898, 928-932;
  fsdp_utils.py:144-225).
* `--lora-rank R`: enable_input_require_grads, then peft get_peft_model(LoraConfig(task_type
  CAUSAL_LM, r=R, lora_alpha 16, target_modules all-linear, bias none)) on the fp32 model
  (fsdp_workers.py:442-471; defaults from verl/trainer/config/_generated_ppo_trainer.yaml:307-310), so the
  adapters are fp32; FSDP1 wraps each trainable leaf (lora_A/lora_B) as its own unit besides the
  decoder layers, use_orig_params false (fsdp_utils.py:106-138, fsdp_workers.py:505-509, 539); FSDP2
  wraps as without LoRA (fsdp_utils.py:507-537); the optimizer gets every parameter and steps only
  those with gradients (fsdp_workers.py:577).
* expandable segments on (verl's weight sync leaves them on: fsdp_workers.py:756; verl/utils/device.py:142).

`--verl 1dda039b` (verl-project/verl main, 0.10.0.dev, the engine-based workers of the v1 trainer)
does what that commit does where it differs (file:line at 1dda039b); everything above holds there too
(fp32 actor: engine/fsdp.yaml:33, transformer_impl.py:239-245; MixedPrecision bf16/fp32/fp32:
transformer_impl.py:377-382; FULL_SHARD: :401; gradient checkpointing use_reentrant False: :317;
foreach AdamW(weight_decay 0.01): workers/config/optimizer.py:298-351, optim/fsdp.yaml:5-30; flash-attn
cross-entropy, inplace_backward unless entropy: transformer_impl.py:1390-1399, torch_functional.py:73-133;
clip 1.0 then step: transformer_impl.py:764-803; zero_grad before the micro-batches and on leaving
train mode: engine/base.py:126, transformer_impl.py:1115; the reference an fp32 forward-only engine with
CPUOffload(offload_params) / CPUOffloadPolicy: ref/dp_ref.yaml:20, transformer_impl.py:413-414, 440-444;
expandable segments back on after the weight sync: engine_workers.py:820). What differs:
* temperature divided out of place by a per-token fp32 temperature cast to the logits dtype
  (transformer_impl.py:1357; b178a3cd divided a squeezed view in place).
* gradient accumulation under no_sync: every micro-batch but the last runs inside FSDP1 `no_sync()` /
  FSDP2 `set_requires_gradient_sync(False)` (transformer_impl.py:672-698, 725-730), so gradients stay
  unsharded until the last backward (b178a3cd reduce-scattered after every micro-batch).
* FSDP2 with untied embeddings wraps `embed_tokens` and `lm_head` as their own units
  (verl/utils/fsdp_utils.py:549-570, 589-595; b178a3cd wrapped the embedding only).
* the actor's no-grad old-log-prob pass computes entropy (v1/trainer_base.py:1546-1553), so its
  cross-entropy runs without inplace_backward there (transformer_impl.py:1392-1394).
* with LoRA the reference is the actor with its adapter disabled (v1/trainer_base.py:316-324,
  engine_workers.py:424): no separate module (not measured here: give --ref 0 with LoRA).

Rank 0 appends one JSON row to --out: after-init memory, per-phase peaks (allocated and reserved) of
the last update, per-micro-batch forward+backward time and the optimizer-step time.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
GIB = float(1 << 30)
CE_PATHS = [HERE / ".whl" / "fa" / "flash_attn_cross_entropy.py"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="name of a file in benchmarks/configs, e.g. qwen2.5-1.5b")
    p.add_argument("--seq", type=int, required=True, help="packed tokens per micro-batch (T)")
    p.add_argument("--micro-batches", type=int, default=2, help="micro-batches per optimizer step (K)")
    p.add_argument("--fsdp", type=int, choices=[1, 2], default=1)
    p.add_argument("--ref", type=int, choices=[0, 1], default=0, help="a reference policy forward each step")
    p.add_argument("--offload", choices=["none", "verl", "cpu_policy"], default="none")
    p.add_argument("--entropy", type=int, choices=[0, 1], default=0, help="entropy_coeff != 0")
    p.add_argument("--gc", type=int, choices=[0, 1], default=1)
    p.add_argument("--expandable", type=int, choices=[0, 1], default=1)
    p.add_argument("--lora-rank", type=int, default=0, help="verl's model.lora_rank (0: full fine-tuning)")
    p.add_argument("--verl", choices=["b178a3cd", "1dda039b"], default="b178a3cd", help="the verl commit to follow")
    p.add_argument("--steps", type=int, default=2, help="updates; the last one is measured")
    p.add_argument("--out", required=True)
    p.add_argument("--tag", default="")
    p.add_argument(
        "--segments",
        type=int,
        choices=[0, 1],
        default=0,
        help="record the reserved memory after every phase of every update and, after each update, the "
        "allocator's segments per CUDA stream (torch.cuda.memory._snapshot): where reserved grows; "
        "stream_trace: after every phase, per named stream (default, actor.<FSDP stream>, ref.<...>)",
    )
    return p.parse_args(argv)


def load_model_config(name: str):
    from transformers import AutoConfig

    raw = json.loads((HERE / "configs" / f"{name}.json").read_text())
    raw.pop("_reference_total_params", None)
    model_type = raw.pop("model_type")
    raw.pop("architectures", None)
    raw.pop("torch_dtype", None)
    cfg = AutoConfig.for_model(model_type, **raw)
    cfg.use_cache = False
    return cfg


def load_cross_entropy():
    """flash-attn's Triton cross-entropy (the kernel verl uses), loaded from its one file."""
    for path in CE_PATHS:
        if path.exists():
            spec = importlib.util.spec_from_file_location("fa_cross_entropy", path)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            return mod.cross_entropy_loss
    return None


def init_params(module, device, materialize: bool = True) -> None:
    """Fill one module's own parameters with random values (weights are random anyway)."""
    import torch

    if materialize:
        module.to_empty(device=device, recurse=False)
    with torch.no_grad():
        for name, p in module.named_parameters(recurse=False):
            t = p.to_local() if hasattr(p, "to_local") else p
            if name.endswith("bias"):
                t.zero_()
            elif t.dim() >= 2:
                t.normal_(0.0, 0.02)
            else:
                t.fill_(1.0)


def fix_rotary(model, cfg, device) -> None:
    """Recompute rotary buffers that meta initialisation left empty."""
    for m in model.modules():
        if hasattr(m, "inv_freq"):
            try:
                fresh = type(m)(config=cfg, device=device)
            except TypeError:
                fresh = type(m)(config=cfg).to(device)
            for name, buf in fresh.named_buffers(recurse=False):
                getattr(m, name).copy_(buf.to(getattr(m, name).dtype))
            for k, v in vars(fresh).items():
                if hasattr(v, "device") and hasattr(m, k) and not k.startswith("_"):
                    setattr(m, k, v.to(device))


def build_fsdp(cfg, args, device, offload_params: bool):
    """The model wrapped as verl wraps it; weights fp32, random."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation="sdpa")
    n_params = sum(p.numel() for p in model.parameters())
    model.config.use_cache = False
    if args.gc:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    layer_cls = set(model._no_split_modules or [])
    if args.lora_rank:
        from peft import LoraConfig, TaskType, get_peft_model

        model.enable_input_require_grads()
        model = get_peft_model(model, LoraConfig(task_type=TaskType.CAUSAL_LM, r=args.lora_rank, lora_alpha=16,
                                                 target_modules="all-linear", bias="none"))  # fmt: skip
        args.trainable_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if args.fsdp == 1:
        import functools

        from torch.distributed.fsdp import (
            CPUOffload,
            FullyShardedDataParallel as FSDP,
            MixedPrecision,
            ShardingStrategy,
        )
        from torch.distributed.fsdp.wrap import _or_policy, lambda_auto_wrap_policy, transformer_auto_wrap_policy

        classes = {type(m) for m in model.modules() if type(m).__name__ in layer_cls}
        policies = [functools.partial(transformer_auto_wrap_policy, transformer_layer_cls=classes)]
        if args.lora_rank:
            # a trainable leaf (a LoRA matrix) gets its own unit: a flat parameter must not mix frozen and trainable
            def trainable_leaf(m) -> bool:
                w = getattr(m, "weight", None)
                return not list(m.children()) and w is not None and w.requires_grad

            policies.insert(0, functools.partial(lambda_auto_wrap_policy, lambda_fn=trainable_leaf))
        wrapped = FSDP(
            model,
            cpu_offload=CPUOffload(offload_params=True) if offload_params else None,
            param_init_fn=lambda m: init_params(m, device),
            auto_wrap_policy=functools.partial(_or_policy, policies=policies),
            device_id=device,
            sharding_strategy=ShardingStrategy.FULL_SHARD,
            mixed_precision=MixedPrecision(torch.bfloat16, torch.float32, torch.float32),
            sync_module_states=False,
            use_orig_params=False,
            forward_prefetch=False,
        )
        fix_rotary(wrapped, cfg, device)
        return wrapped, n_params
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    kw = {
        "mp_policy": MixedPrecisionPolicy(
            param_dtype=torch.bfloat16, reduce_dtype=torch.float32, cast_forward_inputs=True
        ),
        "reshard_after_forward": True,
    }
    if offload_params:
        kw["offload_policy"] = CPUOffloadPolicy(pin_memory=True)
    # 1dda039b also wraps an untied lm_head on its own (fsdp_utils.py:558-569); b178a3cd the embedding only
    own_unit = {"embed_tokens", "lm_head"} if args.verl == "1dda039b" and not cfg.tie_word_embeddings else set()
    for name, m in model.named_modules():
        if (
            type(m).__name__ in layer_cls
            or (isinstance(m, torch.nn.Embedding) and not cfg.tie_word_embeddings)
            or (name.rsplit(".", 1)[-1] in own_unit and hasattr(m, "weight"))
        ):
            fully_shard(m, **kw)
    fully_shard(model, **kw)
    home = torch.device("cpu") if offload_params else device
    model.to_empty(device=home)
    for m in model.modules():
        init_params(m, home, materialize=False)
    if offload_params:
        # buffers (rotary) stay with the activations on the GPU; FSDP2 offloads parameters only
        for m in model.modules():
            for name, b in list(m.named_buffers(recurse=False)):
                m._buffers[name] = b.to(device)
    fix_rotary(model, cfg, device)
    return model, n_params


def offload_actor(model, optimizer, fsdp: int, to_gpu: bool, device) -> None:
    """verl's param_offload + optimizer_offload moves (fsdp_utils.py:144-225), in this harness's words."""
    import torch

    target = device if to_gpu else torch.device("cpu")
    if fsdp == 1:
        from torch.distributed.fsdp._runtime_utils import _lazy_init

        _lazy_init(model, model)
        for handle in model._all_handles:
            handle.flat_param_to(target, non_blocking=True)
            handle.flat_param._local_shard = handle.flat_param.data
    else:
        model.to(target)
    for group in optimizer.param_groups:
        for p in group["params"]:
            st = optimizer.state.get(p, {})
            for k, v in st.items():
                if torch.is_tensor(v) and k != "step":
                    st[k] = v.to(target, non_blocking=True)
    if not to_gpu:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def segments_by_stream(torch_mod) -> dict[str, list[float]]:
    """The caching allocator's segments per CUDA stream: [reserved GiB, allocated GiB, segments]."""
    out: dict[str, list[float]] = {}
    for seg in torch_mod.cuda.memory._snapshot()["segments"]:
        entry = out.setdefault(str(seg["stream"]), [0.0, 0.0, 0])
        entry[0] += seg["total_size"] / GIB
        entry[1] += seg["allocated_size"] / GIB
        entry[2] += 1
    return out


def stream_names(torch_mod, modules: dict) -> dict[str, str]:
    """CUDA stream handle -> a name: "default", or "<module>.<attribute>" for each stream an FSDP root
    holds (FSDP1: the FullyShardedDataParallel root's _unshard_stream, _post_backward_stream, ...; FSDP2:
    the root state's comm context: all_gather_copy_in_stream, reduce_scatter_stream, ...). Roots create
    them lazily, so ask after a forward."""
    names = {"0": "default", str(torch_mod.cuda.current_stream().cuda_stream): "default"}
    for prefix, mod in modules.items():
        if mod is None:
            continue
        objs = [mod]
        get_state = getattr(mod, "_get_fsdp_state", None)
        if get_state is not None:
            state = get_state()
            objs += [state, getattr(state, "_comm_ctx", None)]
        for obj in objs:
            for attr, value in vars(obj).items() if obj is not None else ():
                if isinstance(value, torch_mod.cuda.Stream):
                    names.setdefault(str(value.cuda_stream), f"{prefix}.{attr.lstrip('_')}")
    return names


def by_stream_name(segments: dict[str, list[float]], names: dict[str, str]) -> dict[str, list[float]]:
    """segments_by_stream keyed by stream name (an unnamed stream keeps its handle)."""
    out: dict[str, list[float]] = {}
    for handle, (reserved, allocated, count) in segments.items():
        entry = out.setdefault(names.get(handle, handle), [0.0, 0.0, 0])
        entry[0] += reserved
        entry[1] += allocated
        entry[2] += count
    return out


class Peaks:
    def __init__(self, torch_mod):
        self.torch = torch_mod
        self.alloc = 0
        self.reserved = 0

    def fold(self) -> tuple[float, float]:
        a, r = self.torch.cuda.max_memory_allocated(), self.torch.cuda.max_memory_reserved()
        self.alloc, self.reserved = max(self.alloc, a), max(self.reserved, r)
        return a / GIB, r / GIB

    def start(self) -> None:
        self.fold()
        self.torch.cuda.reset_peak_memory_stats()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.expandable:
        os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    rank = int(os.environ.get("RANK", 0))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    t_start = time.time()
    import torch

    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    peaks = Peaks(torch)
    K = args.micro_batches
    row: dict = {
        "harness": "fsdp_memory",
        "model": args.model,
        "params": None,
        "seq": args.seq,
        "micro_batches": K,
        "fsdp": args.fsdp,
        "ref": args.ref,
        "offload": args.offload,
        "entropy": args.entropy,
        "gc": args.gc,
        "expandable": args.expandable,
        "world": world,
        "rank": rank,
        "status": "error",
        "gpu": torch.cuda.get_device_name(local_rank),
        "total_gib": torch.cuda.get_device_properties(local_rank).total_memory / GIB,
        "torch": torch.__version__,
        "after_init_gib": None,
        "after_init_reserved_gib": None,
        "peak_alloc_gib": None,
        "peak_reserved_gib": None,
        "phase_peaks_gib": {},
        "phase_peaks_reserved_gib": {},
        "micro_batch_s": [],
        "optimizer_step_s": None,
        "update_s": [],
        "phase": "setup",
        "tag": args.tag,
        "steps": args.steps,
        "lora_rank": args.lora_rank,
        "verl": args.verl,
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
        import torch.distributed as dist
        import transformers

        row["transformers"] = transformers.__version__
        # a gloo group beside NCCL, as verl (fsdp_workers.py:155-156): CPUOffloadPolicy's norm needs it
        dist.init_process_group(backend="cpu:gloo,cuda:nccl", device_id=device)
        cfg = load_model_config(args.model)
        row["vocab_size"] = cfg.vocab_size
        ce = load_cross_entropy()
        row["logprob_impl"] = "flash_attn_triton_ce" if ce is not None else "verl_logprobs_from_logits_v2"
        if args.offload == "cpu_policy" and args.fsdp != 2:
            raise ValueError("cpu_policy is FSDP2's CPUOffloadPolicy; FSDP1 actors have no CPU offload in verl")
        actor, row["params"] = build_fsdp(cfg, args, device, offload_params=args.offload == "cpu_policy")
        if args.lora_rank:
            import peft

            row["peft"] = peft.__version__
            row["trainable_params"] = args.trainable_params
            row["adapter_dtypes"] = sorted({str(p.dtype) for n, p in actor.named_parameters() if p.requires_grad})
        optimizer = torch.optim.AdamW(actor.parameters(), lr=1e-6, weight_decay=0.01, betas=(0.9, 0.999))
        if args.ref and args.lora_rank:
            raise ValueError(
                "with LoRA verl's reference is the actor with its adapters disabled (fsdp_workers.py:1042-1044): give --ref 0"
            )
        ref = build_fsdp(cfg, args, device, offload_params=True)[0] if args.ref else None
        torch.cuda.synchronize()
        row["after_init_gib"] = torch.cuda.memory_allocated() / GIB
        row["after_init_reserved_gib"] = torch.cuda.memory_reserved() / GIB
        if args.segments:
            row["segments"] = {"init": segments_by_stream(torch)}

        def trace_streams(phase: str) -> None:
            """Per named stream [reserved GiB, allocated GiB, segments] after a phase (streams named anew each
            time: FSDP roots create theirs at their first forward)."""
            names = stream_names(torch, {"actor": actor, "ref": ref})
            row["stream_names"] = names
            row.setdefault("stream_trace", []).append([phase, by_stream_name(segments_by_stream(torch), names)])

        T = args.seq
        gen = torch.Generator(device=device).manual_seed(1234 + rank)
        batches = []
        for _ in range(K):
            ids = torch.randint(0, cfg.vocab_size, (1, T), device=device, generator=gen)
            batches.append({
                "input_ids": ids, "position_ids": torch.arange(T, device=device).unsqueeze(0),
                "labels": torch.roll(ids, shifts=-1, dims=1).squeeze(0),
                "advantages": torch.randn(T, device=device, generator=gen),
            })  # fmt: skip
        current = args.verl == "1dda039b"
        entropy_fn = None
        if args.entropy or current:

            def entropy_from_logits(logits):
                pd = torch.nn.functional.softmax(logits, dim=-1)
                return torch.logsumexp(logits, dim=-1) - torch.sum(pd * logits, dim=-1)

            entropy_fn = torch.compile(entropy_from_logits, dynamic=True)

        def forward_logprobs(module, mb, calculate_entropy: bool):
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                out = module(
                    input_ids=mb["input_ids"], attention_mask=None, position_ids=mb["position_ids"], use_cache=False
                )
                logits = out.logits.squeeze(0)
                if current:  # a new tensor, divided by a per-token temperature (transformer_impl.py:1357)
                    logits = logits / temperature.clamp(min=1e-8).unsqueeze(-1).to(logits.dtype)
                else:
                    logits.div_(1.0)  # temperature, in place as dp_actor.py:259
                if ce is not None:
                    losses, _ = ce(logits, mb["labels"], inplace_backward=not calculate_entropy)
                    logp = -losses
                else:
                    logp = torch.stack([torch.log_softmax(r, -1).gather(-1, lab.view(1)).squeeze(-1)
                                        for r, lab in zip(logits, mb["labels"])])  # fmt: skip
                ent = entropy_fn(logits) if calculate_entropy else None
            return logp, ent

        temperature = torch.ones(T, dtype=torch.float32, device=device)

        def no_grad_logprobs(module, calculate_entropy: bool = False):
            with torch.no_grad():
                return [forward_logprobs(module, mb, calculate_entropy)[0] for mb in batches]

        def sync_context(i: int):
            """1dda039b: no gradient reduce until the last micro-batch (transformer_impl.py:672-698, 725-730)."""
            import contextlib

            if not current or i == K - 1:
                return contextlib.nullcontext()
            if args.fsdp == 1:
                return actor.no_sync()

            @contextlib.contextmanager
            def fsdp2_no_sync():
                actor.set_requires_gradient_sync(False)
                try:
                    yield
                finally:
                    actor.set_requires_gradient_sync(True)

            return fsdp2_no_sync()

        last_step = args.steps - 1
        for step in range(args.steps):
            last = step == last_step
            row["phase"] = f"step{step}.ref"
            if last:
                peaks.start()
            if ref is not None:
                ref_logp = no_grad_logprobs(ref)  # noqa: F841 - verl keeps them in the batch
            if last and ref is not None:
                torch.cuda.synchronize()
                row["phase_peaks_gib"]["ref_logprob"], row["phase_peaks_reserved_gib"]["ref_logprob"] = peaks.fold()
            if args.offload == "verl" and step > 0:
                t0 = time.time()
                offload_actor(actor, optimizer, args.fsdp, True, device)
                torch.cuda.synchronize()
                row["load_s"] = time.time() - t0
            if args.segments and ref is not None:
                torch.cuda.synchronize()
                trace_streams(f"step{step}.ref")
            row["phase"] = f"step{step}.old_logprob"
            if last:
                peaks.start()
            old_logp = no_grad_logprobs(actor, calculate_entropy=current)  # entropy: v1/trainer_base.py:1548
            if last:
                torch.cuda.synchronize()
                row["phase_peaks_gib"]["old_logprob"], row["phase_peaks_reserved_gib"]["old_logprob"] = peaks.fold()
            torch.cuda.synchronize()
            if args.segments:
                trace_streams(f"step{step}.old_logprob")
            t_update = time.time()
            optimizer.zero_grad()
            for i, mb in enumerate(batches):
                t0 = time.time()
                row["phase"] = f"step{step}.mb{i}.forward"
                if last:
                    peaks.start()
                no_sync = sync_context(i)  # entered around forward and backward, as verl's `with` (:736)
                no_sync.__enter__()
                logp, ent = forward_logprobs(actor, mb, bool(args.entropy))
                ratio = torch.exp(logp - old_logp[i])
                adv = mb["advantages"]
                pg = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 0.8, 1.2)).mean()
                if ent is not None:
                    pg = pg - 0.001 * ent.mean()
                loss = pg * (1.0 / K)
                del logp, ent, ratio
                if last:
                    torch.cuda.synchronize()
                    a, r = peaks.fold()
                    row["phase_peaks_gib"].setdefault("forward", []).append(a)
                    row["phase_peaks_reserved_gib"].setdefault("forward", []).append(r)
                    peaks.start()
                if args.segments:
                    row.setdefault("reserved_trace", []).append(
                        [f"step{step}.mb{i}.forward", torch.cuda.memory_reserved() / GIB]
                    )
                    trace_streams(f"step{step}.mb{i}.forward")
                row["phase"] = f"step{step}.mb{i}.backward"
                loss.backward()
                del loss
                no_sync.__exit__(None, None, None)
                torch.cuda.synchronize()
                if args.segments:
                    row.setdefault("reserved_trace", []).append(
                        [f"step{step}.mb{i}.backward", torch.cuda.memory_reserved() / GIB]
                    )
                    trace_streams(f"step{step}.mb{i}.backward")
                if last:
                    a, r = peaks.fold()
                    row["phase_peaks_gib"].setdefault("backward", []).append(a)
                    row["phase_peaks_reserved_gib"].setdefault("backward", []).append(r)
                    row["micro_batch_s"].append(time.time() - t0)
            row["phase"] = f"step{step}.optimizer"
            if last:
                peaks.start()
            t0 = time.time()
            if args.fsdp == 1:
                gn = actor.clip_grad_norm_(max_norm=1.0)
            else:
                gn = torch.nn.utils.clip_grad_norm_(actor.parameters(), max_norm=1.0)
                if hasattr(gn, "full_tensor"):
                    gn = gn.full_tensor()
            if torch.isfinite(gn):
                optimizer.step()
            else:
                row["nonfinite_grad_norm"] = True
                optimizer.zero_grad()
            torch.cuda.synchronize()
            if last:
                row["optimizer_step_s"] = time.time() - t0
                row["phase_peaks_gib"]["step"], row["phase_peaks_reserved_gib"]["step"] = peaks.fold()
            if args.segments:
                torch.cuda.synchronize()
                row.setdefault("reserved_trace", []).append(
                    [f"step{step}.optimizer", torch.cuda.memory_reserved() / GIB]
                )
                row.setdefault("segments", {})[f"step{step}"] = segments_by_stream(torch)
                trace_streams(f"step{step}.optimizer")
            optimizer.zero_grad()
            row["update_s"].append(time.time() - t_update)
            if args.offload == "verl":
                t0 = time.time()
                offload_actor(actor, optimizer, args.fsdp, False, device)
                row["offload_s"] = time.time() - t0
                row["after_offload_gib"] = torch.cuda.memory_allocated() / GIB
            del old_logp
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
        sys.stderr.write(f"[rank {rank}] {row['status']} in {row['phase']}: {msg[:500]}\n")
        os._exit(3)


if __name__ == "__main__":
    sys.exit(main())
