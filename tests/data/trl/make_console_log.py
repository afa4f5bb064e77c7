"""Write a real TRL console log: TRL's own GRPOTrainer (HF generate, no vLLM) on a tiny random Qwen2 on the CPU.

    python tests/data/trl/make_console_log.py --reward 0 --steps 12 > tests/data/trl/console_zero_reward.log 2>&1
    python tests/data/trl/make_console_log.py --reward mixed --steps 12 > tests/data/trl/console_mixed_reward.log 2>&1

Needs trl (1.16.0 made the committed logs), transformers, torch and datasets; the tests read the logs only.
`--reward 0` scores every completion 0.0 (the zero-reward failure); `mixed` scores by completion length parity.
"""

from __future__ import annotations

import argparse
import tempfile


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--reward", choices=("0", "mixed"), default="0")
    p.add_argument("--steps", type=int, default=12)
    a = p.parse_args()
    import torch
    from datasets import Dataset
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast
    from trl import GRPOConfig, GRPOTrainer

    torch.manual_seed(0)
    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{f"w{i}": i + 3 for i in range(61)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    cfg = AutoConfig.for_model("qwen2", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, vocab_size=64,
                               max_position_embeddings=256, tie_word_embeddings=True, eos_token_id=1, pad_token_id=0)
    model = AutoModelForCausalLM.from_config(cfg)
    model.name_or_path = "tiny-qwen2"

    def accuracy_reward(completions, **_kw):
        if a.reward == "0":
            return [0.0 for _ in completions]
        return [float(len(c) % 2) for c in completions]

    data = Dataset.from_dict({"prompt": [f"w{i % 61} w{(3 * i) % 61}" for i in range(256)]})
    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(output_dir=out, per_device_train_batch_size=4, num_generations=4, max_completion_length=8,
                          max_steps=a.steps, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True,
                          bf16=False, gradient_checkpointing=False, seed=0)
        GRPOTrainer(model=model, reward_funcs=accuracy_reward, args=args, train_dataset=data,
                    processing_class=tokenizer).train()


if __name__ == "__main__":
    main()
