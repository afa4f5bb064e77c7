"""Write HF config.json files for the Qwen2.5 sizes the memory harness measures.

Architecture numbers come from shared/reference/model_configs.json; the fixed
Qwen2 fields (activation, norm epsilon, dtype, sliding window off) are the same
for every size. Run: python benchmarks/make_configs.py [path/to/model_configs.json]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SIZES = ["0.5B", "1.5B", "3B", "7B", "14B"]
HERE = Path(__file__).resolve().parent
DEFAULT_REF = HERE.parent.parent / "shared" / "reference" / "model_configs.json"


def qwen2_config(ref: dict) -> dict:
    """One HF-style config.json dict for a qwen2 model from its architecture facts."""
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": ref["hidden_size"],
        "intermediate_size": ref["intermediate_size"],
        "num_hidden_layers": ref["num_hidden_layers"],
        "num_attention_heads": ref["num_attention_heads"],
        "num_key_value_heads": ref["num_key_value_heads"],
        "vocab_size": ref["vocab_size"],
        "tie_word_embeddings": ref["tie_word_embeddings"],
        "max_position_embeddings": ref["max_position_embeddings"],
        "rope_theta": ref["rope_theta"],
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "initializer_range": 0.02,
        "attention_dropout": 0.0,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": ref["num_hidden_layers"],
        "use_cache": False,
        "bos_token_id": 151643,
        "eos_token_id": 151643,
        "torch_dtype": "bfloat16",
    }


def main() -> None:
    ref_path = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_REF
    refs = json.loads(ref_path.read_text())
    out = HERE / "configs"
    out.mkdir(exist_ok=True)
    for size in SIZES:
        ref = refs[f"Qwen/Qwen2.5-{size}"]
        cfg = qwen2_config(ref)
        # the expected count lets the harness check that the built model matches the reference
        cfg["_reference_total_params"] = ref["total_params"]
        path = out / f"qwen2.5-{size.lower()}.json"
        path.write_text(json.dumps(cfg, indent=2) + "\n")
        print(path)


if __name__ == "__main__":
    main()
