"""Measure verl 0.9.1's own FSDP actor update (its TrainingWorker and FSDPEngine, from the release's wheel):
per-GPU peak memory of one PPO update, without Ray and without vLLM.

    python benchmarks/verl_release_engine.py --make-model DIR --model qwen2.5-1.5b   # random weights, once
    torchrun --nproc_per_node 2 benchmarks/verl_release_engine.py --model-dir DIR --model qwen2.5-1.5b \
        --seqs 8 --seq-len 4096 --micro-batch 4 --no-sync 0 --out rows.jsonl

Nothing of verl is copied here: each rank builds verl's own TrainingWorker (verl/workers/engine_workers.py:77)
with a TrainingWorkerConfig of HFModelConfig / FSDPEngineConfig / FSDPOptimizerConfig, calls its reset()
(the engine's initialize: fp32 FSDP1 actor, FULL_SHARD, bf16/fp32/fp32 mixed precision, gradient
checkpointing), sets verl's ppo_loss (verl/workers/utils/losses.py) with an ActorConfig, and calls
train_mini_batch() as ActorRolloutRefWorker.update_actor does, on a TensorDict made the way verl's own engine
test makes one (DataProto -> to_tensordict -> left_right_2_no_padding). verl's worker classes are called
in-process: their @register decorators only mark methods for Ray's dispatch. torchrun provides RANK,
WORLD_SIZE, MASTER_ADDR and MASTER_PORT, which verl's Worker reads (single_controller/base/worker.py:194-200).

What is varied: fsdp_config.use_no_sync_for_gradient_accumulation (0.9.1's default false,
verl/trainer/config/engine/fsdp.yaml:61) and the micro-batch count (the mini-batch over micro_batch_size).
Sequences are full length (no padding), so a micro-batch packs micro_batch x seq_len tokens (T).
Rows: benchmarks/results/verl_release_engine.jsonl, each with the verl release that produced it.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

GIB = float(1 << 30)
CONFIGS = Path(__file__).with_name("configs")


def stand_in_ray() -> str:
    """Ray where it is not installed (its wheel is larger than what the GPU machine can be sent): verl imports
    it at module level (verl/protocol.py) but the in-process path measured here calls none of it. Every `ray`
    and `ray.*` import gets a module whose every attribute is an inert stand-in; returns what was done."""
    import importlib.abc
    import importlib.machinery
    import importlib.util
    import sys
    import types

    if importlib.util.find_spec("ray") is not None:
        return "installed"

    class Inert:
        def __init__(self, *a: object, **k: object) -> None:
            pass

        def __call__(self, *a: object, **k: object) -> object:
            return a[0] if len(a) == 1 and callable(a[0]) and not k else Inert()

        def __getattr__(self, name: str) -> object:
            if name.startswith("__"):
                raise AttributeError(name)
            return Inert()

        def __mro_entries__(self, bases: tuple) -> tuple:
            return (object,)

    class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name: str, path: object, target: object = None) -> object:
            if name == "ray" or name.startswith("ray."):
                return importlib.machinery.ModuleSpec(name, self, is_package=True)
            return None

        def create_module(self, spec: object) -> types.ModuleType:
            mod = types.ModuleType(spec.name)
            mod.__path__ = []

            def attribute(attr: str) -> object:  # PEP 562; dunders stay missing (inspect, pickle look)
                if attr.startswith("__"):
                    raise AttributeError(attr)
                return Inert()

            mod.__getattr__ = attribute
            return mod

        def exec_module(self, module: types.ModuleType) -> None:
            pass

    sys.meta_path.insert(0, Finder())
    return "absent: import stand-in (no Ray call runs in this harness)"


def make_model(out: Path, model: str) -> None:
    """A Qwen2.5 model of the named config with random bf16 weights, written as an HF folder (no tokenizer)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    src = Path(model) if model.endswith(".json") else CONFIGS / f"{model}.json"
    cfg = AutoConfig.for_model(**{k: v for k, v in json.loads(src.read_text()).items() if not k.startswith("_")})
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        m = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16)
    m.save_pretrained(out, safe_serialization=True)
    print(f"model {model} -> {out}", flush=True)


def batch(vocab: int, seqs: int, seq_len: int, response_len: int, seed: int):
    """verl's update input for `seqs` full-length sequences (no padding): a no-padding TensorDict as the
    engine test builds it, with random advantages and old log-probs."""
    import torch
    from verl import DataProto
    from verl.utils.model import compute_position_id_with_mask
    from verl.workers.utils.padding import left_right_2_no_padding

    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, vocab, (seqs, seq_len), generator=g)
    attention_mask = torch.ones_like(input_ids)
    position_ids = compute_position_id_with_mask(attention_mask)
    responses = input_ids[:, -response_len:]
    response_mask = attention_mask[:, -response_len:]
    data = DataProto.from_single_dict(
        {
            "input_ids": input_ids,
            "prompts": input_ids[:, :-response_len],
            "attention_mask": attention_mask,
            "position_ids": position_ids,
            "responses": responses,
            "response_mask": response_mask,
            "advantages": torch.randn(responses.shape, generator=g),
            "old_log_probs": -torch.rand(responses.shape, generator=g),
        }
    )
    return left_right_2_no_padding(data.to_tensordict())


def measure(a: argparse.Namespace) -> dict:
    import importlib.metadata as md
    from functools import partial

    ray = stand_in_ray()
    import torch

    if torch.cuda.is_available():  # Ray gives each verl worker one GPU; torchrun's ranks share the host's
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    from verl.trainer.config import CheckpointConfig
    from verl.utils import tensordict_utils as tu
    from verl.workers.config import (
        ActorConfig,
        FSDPEngineConfig,
        FSDPOptimizerConfig,
        HFModelConfig,
    )
    from verl.workers.engine_workers import TrainingWorker, TrainingWorkerConfig
    from verl.workers.utils.losses import ppo_loss

    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    # flash-attn's CUDA kernels are not built on the GPU machines: SDPA over the packed micro-batch as one causal
    # sequence (it saves the same tensors); verl's default is flash_attention_2 (workers/config/model.py:185).
    model_config = HFModelConfig(
        path=a.model_dir,
        load_tokenizer=False,
        use_remove_padding=True,
        enable_gradient_checkpointing=True,
        override_config={"attn_implementation": "sdpa"},
    )
    engine_config = FSDPEngineConfig(
        forward_only=False,
        strategy="fsdp",
        use_dynamic_bsz=False,
        micro_batch_size_per_gpu=a.micro_batch,
        use_no_sync_for_gradient_accumulation=bool(a.no_sync),
        use_torch_compile=bool(a.compile),
    )
    config = TrainingWorkerConfig(
        model_type="language_model",
        model_config=model_config,
        engine_config=engine_config,
        optimizer_config=FSDPOptimizerConfig(lr=1e-6),
        checkpoint_config=CheckpointConfig(),
    )
    if not torch.cuda.is_available():  # a CPU check of the harness: verl would ask for NCCL
        torch.distributed.init_process_group("gloo")
    worker = TrainingWorker(config)
    worker.reset()
    actor = ActorConfig(
        strategy="fsdp", rollout_n=1, ppo_mini_batch_size=a.seqs * world, ppo_micro_batch_size_per_gpu=a.micro_batch
    )
    worker.set_loss_fn(partial(ppo_loss, config=actor))
    cuda = torch.cuda.is_available()  # a CPU run (gloo) only checks that the harness drives verl
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()
    after_init = torch.cuda.memory_allocated() / GIB if cuda else 0.0
    vocab = config.model_config.hf_config.vocab_size
    peaks, times = [], []
    for step in range(a.steps):
        td = batch(vocab, a.seqs, a.seq_len, a.response_len, seed=step * 1000 + rank)
        tu.assign_non_tensor(
            td,
            global_batch_size=a.seqs * world,
            mini_batch_size=a.seqs * world,
            epochs=1,
            seed=1,
            dataloader_kwargs={"shuffle": False},
            temperature=a.temperature,
            calculate_entropy=False,
            use_dynamic_bsz=False,
            micro_batch_size_per_gpu=a.micro_batch,
            global_token_num=[a.seq_len] * a.seqs,
        )
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        t0 = time.time()
        worker.train_mini_batch(td)
        sync()
        times.append(time.time() - t0)
        peaks.append(
            (torch.cuda.max_memory_allocated() / GIB, torch.cuda.max_memory_reserved() / GIB) if cuda else (0.0, 0.0)
        )
    gpu = (
        (torch.cuda.get_device_properties(0).name, torch.cuda.get_device_properties(0).total_memory / GIB)
        if cuda
        else ("cpu", 0.0)
    )
    return {
        "harness": "verl_release_engine",
        "framework": "verl",
        "release": md.version("verl"),
        "release_source": "PyPI wheel verl-0.9.1-py3-none-any.whl (sha256 db6e6f2a...)",
        "model": a.model,
        "world": world,
        "rank": rank,
        "seqs_per_gpu": a.seqs,
        "seq_len": a.seq_len,
        "micro_batch": a.micro_batch,
        "micro_batches": a.seqs // a.micro_batch,
        "tokens_per_micro_batch": a.micro_batch * a.seq_len,
        "no_sync": a.no_sync,
        "temperature": a.temperature,
        "fsdp": 1,
        "gc": 1,
        "compile": a.compile,
        "attn": "sdpa",
        "logprob_impl": "flash_attn_triton_ce (its 2.8.3 file)",
        "gpu": gpu[0],
        "total_gib": gpu[1],
        "torch": torch.__version__,
        "transformers": md.version("transformers"),
        "tensordict": md.version("tensordict"),
        "ray": ray,
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
    p.add_argument("--make-model", help="write a random-weight model folder here and exit")
    p.add_argument("--model", required=True, help="a file in benchmarks/configs, e.g. qwen2.5-1.5b")
    p.add_argument("--model-dir")
    p.add_argument("--seqs", type=int, default=8, help="sequences per GPU in the mini-batch")
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--response-len", type=int, default=1024)
    p.add_argument("--micro-batch", type=int, default=4, help="sequences per micro-batch (micro_batch_size_per_gpu)")
    p.add_argument(
        "--no-sync",
        type=int,
        choices=[0, 1],
        default=0,
        help="fsdp_config.use_no_sync_for_gradient_accumulation (0.9.1's default 0)",
    )
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--compile", type=int, choices=[0, 1], default=0, help="fsdp_config.use_torch_compile")
    p.add_argument("--steps", type=int, default=2, help="updates; the last one is measured")
    p.add_argument("--out")
    p.add_argument("--tag", default="")
    a = p.parse_args()
    if a.make_model:
        make_model(Path(a.make_model), a.model)
        return 0
    try:
        row = measure(a)
    except Exception as exc:  # one row saying why, so a failed configuration is recorded, not lost
        import traceback

        traceback.print_exc()
        row = {
            "harness": "verl_release_engine",
            "model": a.model,
            "no_sync": a.no_sync,
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
