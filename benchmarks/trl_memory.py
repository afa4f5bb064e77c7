"""GPU memory of TRL's own GRPOTrainer learner step under DeepSpeed ZeRO-3 (one row per shape).

Run under `accelerate launch --config_file ACC.yaml benchmarks/trl_memory.py ...` with the accelerate
config and DeepSpeed JSON hpcrl's trl backend writes (hpcrl/planning/backends/trl_launch.py). TRL 1.16.0's
GRPOTrainer is built for real (GRPOConfig, the fused LM head of trl/trainer/utils.py:1548, the reference
model when beta > 0, DeepSpeed through accelerate and transformers' Trainer loop); only generation and
scoring are replaced: `_generate_and_score_completions` returns synthetic completions of a chosen
length (the batch TRL pads to its longest prompt and completion, grpo_trainer.py:2443-2465), random
advantages, and computes old and reference log-probs with TRL's own `_get_per_token_logps_and_entropies`
under no_grad as grpo_trainer.py:2634-2720 does. The model is a Qwen2.5 config (benchmarks/configs) with
random weights under zero.Init; the tokenizer a small word-level one (the model's vocabulary is the
config's). Each shape runs `--steps` optimizer steps of `--ga` micro-batches; the peak of each step is
recorded from torch.cuda.max_memory_allocated/reserved, reset at the step's start.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
GIB = float(1 << 30)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)  # a benchmarks/configs/<name>.json
    p.add_argument("--batch", type=int, default=4)  # per_device_train_batch_size
    p.add_argument("--ga", type=int, default=2)  # gradient_accumulation_steps
    p.add_argument("--shapes", required=True)  # "P:C,P:C": prompt and completion lengths, one shape each
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--beta", type=float, default=0.0)
    p.add_argument("--old-logps", type=int, default=1)  # vLLM runs compute them every step (grpo_trainer.py:2642)
    p.add_argument("--gc", type=int, default=1)
    p.add_argument("--configs-dir", default=str(HERE / "configs"))
    p.add_argument("--out", required=True)
    p.add_argument("--tag", default="")
    return p.parse_args(argv)


def model_config(path: Path):
    from transformers import AutoConfig

    raw = json.loads(path.read_text())
    for k in ("_reference_total_params", "architectures", "torch_dtype"):
        raw.pop(k, None)
    model_type = raw.pop("model_type")
    return AutoConfig.for_model(model_type, **raw)


def tiny_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{f"w{i}": i + 3 for i in range(64)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    import torch
    import transformers
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback

    import trl
    from trl import GRPOConfig, GRPOTrainer
    from trl.trainer import grpo_trainer as gt

    cuda = torch.cuda.is_available()  # False only for the CPU dry run of the harness itself
    shapes = [tuple(int(x) for x in s.split(":")) for s in args.shapes.split(",")]
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    out_dir = Path(f"/tmp/trl_mem_{os.getpid()}")
    cfg = GRPOConfig(
        output_dir=str(out_dir),
        per_device_train_batch_size=args.batch,
        gradient_accumulation_steps=args.ga,
        num_generations=2,
        max_completion_length=max(c for _, c in shapes),
        beta=args.beta,
        max_steps=args.steps * len(shapes),
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        gradient_checkpointing=bool(args.gc),
        bf16=cuda,
        use_cpu=not cuda,
        learning_rate=1e-6,
        disable_tqdm=True,
        use_vllm=False,
        seed=0,
    )
    mcfg = model_config(Path(args.configs_dir) / f"{args.model}.json")
    mcfg._attn_implementation = "sdpa"
    model = AutoModelForCausalLM.from_config(mcfg, dtype=torch.bfloat16, attn_implementation="sdpa")
    zero_ok = all(hasattr(p, "ds_id") for p in model.parameters())
    n_params = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())
    model.name_or_path = args.model
    if args.beta:
        # The reference model of grpo_trainer.py:1003, built like the policy (random weights under zero.Init)
        # since nothing can be downloaded here.
        gt.create_model_from_path = lambda *_a, **_k: AutoModelForCausalLM.from_config(
            mcfg, dtype=torch.bfloat16, attn_implementation="sdpa"
        )

    def reward(completions, **_kw):
        return [0.0 for _ in completions]

    data = Dataset.from_dict({"prompt": [f"w{i % 64} w{(i * 7) % 64}" for i in range(4096)]})
    tok = tiny_tokenizer()
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=cfg, train_dataset=data, processing_class=tok)
    dev = trainer.accelerator.device
    vocab = mcfg.vocab_size

    def synthetic(self, inputs):
        """A generation batch of the current shape, scored as grpo_trainer.py:2634-2720 scores one."""
        prompt_len, comp_len = shapes[min(self.state.global_step // args.steps, len(shapes) - 1)]
        n = len(inputs)
        g = torch.Generator(device="cpu").manual_seed(1000 * self.state.global_step + rank)
        prompt_ids = torch.randint(3, vocab, (n, prompt_len), generator=g).to(dev)
        prompt_mask = torch.ones(n, prompt_len, dtype=torch.long, device=dev)
        prompt_mask[0, : min(8, prompt_len - 1)] = 0  # one left-padded prompt: TRL pads prompts on the left
        completion_ids = torch.randint(3, vocab, (n, comp_len), generator=g).to(dev)
        completion_mask = torch.ones(n, comp_len, dtype=torch.long, device=dev)
        ids = torch.cat([prompt_ids, completion_ids], 1)
        mask = torch.cat([prompt_mask, completion_mask], 1)
        out = {
            "prompt_ids": prompt_ids,
            "prompt_mask": prompt_mask,
            "completion_ids": completion_ids,
            "completion_mask": completion_mask,
            "advantages": torch.randn(n, generator=g).to(dev),
            "num_items_in_batch": self.accelerator.gather(completion_mask.sum()).sum(),
        }
        with torch.no_grad(), gt.disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
            if args.old_logps:
                out["old_per_token_logps"], _, _ = self._get_per_token_logps_and_entropies(
                    self.model, ids, mask, comp_len, batch_size=self.args.per_device_train_batch_size
                )
            if self.beta != 0.0:
                out["ref_per_token_logps"], _, _ = self._get_per_token_logps_and_entropies(
                    self.ref_model, ids, mask, comp_len, batch_size=self.args.per_device_train_batch_size
                )
        return out

    GRPOTrainer._generate_and_score_completions = synthetic
    rows: list[dict] = []

    class Peaks(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            self.t0 = time.time()

        def on_step_end(self, a, state, control, **kw):
            step = state.global_step - 1
            p, c = shapes[min(step // args.steps, len(shapes) - 1)]
            row = {"step": step, "prompt": p, "completion": c, "step_s": time.time() - self.t0}
            if cuda:
                torch.cuda.synchronize()
                free, total = torch.cuda.mem_get_info()
                row.update(
                    peak_alloc_gib=torch.cuda.max_memory_allocated() / GIB,
                    peak_reserved_gib=torch.cuda.max_memory_reserved() / GIB,
                    device_used_gib=(total - free) / GIB,
                )
            rows.append(row)

    trainer.add_callback(Peaks())
    status, err = "ok", ""
    t0 = time.time()
    try:
        trainer.train()
    except torch.cuda.OutOfMemoryError as e:
        status, err = "oom", str(e)[:300]
    try:
        import deepspeed

        ds_version = deepspeed.__version__
    except ImportError:  # the CPU dry run
        ds_version = None
    base = {
        "harness": "trl_memory",
        "model": args.model,
        "params": n_params,
        "vocab_size": vocab,
        "tie_word_embeddings": bool(getattr(mcfg, "tie_word_embeddings", False)),
        "world": world,
        "rank": rank,
        "batch": args.batch,
        "ga": args.ga,
        "beta": args.beta,
        "old_logps": args.old_logps,
        "gc": args.gc,
        "zero_stage": 3,
        "zero_init": zero_ok,
        "attn_impl": "sdpa",
        "status": status,
        "error": err,
        "gpu": torch.cuda.get_device_name(0) if cuda else "cpu",
        "total_gib": torch.cuda.get_device_properties(0).total_memory / GIB if cuda else None,
        "trl": trl.__version__,
        "deepspeed": ds_version,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "accelerate": __import__("accelerate").__version__,
        "wall_s": time.time() - t0,
        "tag": args.tag,
    }
    if rank == 0:
        # one row per shape: its last step (the first of a shape can carry a new shape's compile/cache growth)
        last: dict[tuple, dict] = {}
        for r in rows:
            last[(r["prompt"], r["completion"])] = r
        with open(args.out, "a") as f:
            for (p, c), r in last.items():
                steps = [x for x in rows if (x["prompt"], x["completion"]) == (p, c)]
                f.write(
                    json.dumps(
                        {
                            **base,
                            "seq": p + c,
                            "tokens_per_gpu": args.batch * (p + c),
                            "completion_tokens_per_gpu": args.batch * c,
                            "shape_tag": f"{args.tag}:{args.model}:w{world}:b{args.batch}:p{p}:c{c}:beta{args.beta:g}",
                            **r,
                            "steps": steps,
                        }
                    )
                    + "\n"
                )
            if status != "ok" and not rows:
                f.write(json.dumps(base) + "\n")
    return 0 if status == "ok" else 3


if __name__ == "__main__":
    sys.exit(main())
