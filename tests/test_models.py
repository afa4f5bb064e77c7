"""Model catalog: exact parameter counts, aliases, KV bytes, LoRA, config.json loading."""

from __future__ import annotations

import json

import pytest

from hpcrl.errors import HpcrlError, ModelSpecError, UnknownNameError
from hpcrl.models import ALIASES, catalog, resolve_model
from hpcrl.models.catalog import catalog_entries


_WITH_COUNTS = [e for e in catalog_entries() if "expected_total_params" in e]


@pytest.mark.parametrize("entry", _WITH_COUNTS, ids=lambda e: e["short"])
def test_counts_match_reference(entry):
    """Counts computed from the config equal the reference notes' counts (15 models)."""
    spec = catalog()[entry["short"]]
    assert spec.total_params == entry["expected_total_params"]
    assert spec.active_params == entry["expected_active_params"]


def test_known_counts_by_hand():
    # Qwen2.5-7B: the model card's 7.61B; the reference's exact count.
    assert resolve_model("qwen2.5-7b").total_params == 7_615_616_512
    # OLMo 3 7B by hand: 32 layers x (4*4096^2 + 8192 qk-norm + 3*4096*11008 + 8192 norms)
    # + 2 * 100278 * 4096 (untied) + 4096 final norm.
    per_layer = 4 * 4096 * 4096 + 8192 + 3 * 4096 * 11008 + 8192
    assert resolve_model("7b").total_params == 32 * per_layer + 2 * 100278 * 4096 + 4096
    # Qwen3-30B-A3B: MoE, 3.35B active of 30.5B.
    moe = resolve_model("qwen3-30b-a3b")
    assert moe.total_params == 30_532_122_624
    assert moe.active_params == 3_353_032_704


def test_tied_embeddings_counted_once():
    tied = resolve_model("qwen2.5-1.5b")
    assert tied.tie_word_embeddings and tied.lm_head_params == 0
    assert tied.total_params == 1_543_714_304


def test_aliases_resolve_to_documented_models():
    assert resolve_model("32b").name == "allenai/Olmo-3-1125-32B"
    assert resolve_model("7b").name == "allenai/Olmo-3-1025-7B"
    assert resolve_model("72b").name == "Qwen/Qwen2.5-72B"
    assert resolve_model("Qwen/Qwen2.5-7B").name == "Qwen/Qwen2.5-7B"
    assert resolve_model("QWEN2.5-7B").name == "Qwen/Qwen2.5-7B"
    for alias, short in ALIASES.items():
        assert short in catalog(), alias


def test_kv_bytes_per_token_with_gqa_and_replication():
    q7 = resolve_model("qwen2.5-7b")  # 28 layers, 4 KV heads of 128
    assert q7.kv_bytes_per_token(1) == 2 * 28 * 4 * 128 * 2 == 57_344
    assert q7.kv_bytes_per_token(2) == 2 * 28 * 2 * 128 * 2
    # TP 8 > 4 KV heads: each rank keeps a replica of one head.
    assert q7.kv_bytes_per_token(8) == 2 * 28 * 1 * 128 * 2


def test_lora_params_by_hand():
    m = resolve_model("qwen2.5-0.5b")  # h 896, F 4864, q 896, kv 128, 24 layers
    r = 16
    per_layer = r * ((896 + 896) * 2 + (896 + 128) * 2 + (896 + 4864) * 3)
    assert m.lora_params(r) == 24 * per_layer == 8_798_208
    assert m.lora_params(r, ("q_proj", "v_proj")) == 24 * r * ((896 + 896) + (896 + 128))
    with pytest.raises(ModelSpecError, match="unknown LoRA target"):
        m.lora_params(r, ("qkv",))


def test_config_json_from_path(tmp_path):
    cfg = {
        "model_type": "llama",
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 1000,
        "tie_word_embeddings": True,
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    spec = resolve_model(str(tmp_path))
    # 2 layers x (256*256*2 + 256*128*2 + 3*256*512 + 2*256) + 1000*256 + 256
    assert spec.total_params == 2 * (256 * 256 * 2 + 256 * 128 * 2 + 3 * 256 * 512 + 512) + 256_000 + 256


def test_config_json_missing_field_is_named(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8, "num_hidden_layers": 1}))
    with pytest.raises(ModelSpecError, match="'intermediate_size'"):
        resolve_model(str(tmp_path / "config.json"))


def test_unknown_model_suggests_close_names():
    with pytest.raises(UnknownNameError) as err:
        resolve_model("qwen2.5-7bb")
    assert "qwen2.5-7b" in str(err.value)
    assert isinstance(err.value, HpcrlError)


def test_hf_cache_lookup_is_offline(tmp_path, monkeypatch):
    """A repo id found in the local HF cache loads; nothing touches the network."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    snap = tmp_path / "models--acme--tiny" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (tmp_path / "models--acme--tiny" / "refs").mkdir()
    (tmp_path / "models--acme--tiny" / "refs" / "main").write_text("abc123")
    (snap / "config.json").write_text(
        json.dumps(
            {
                "model_type": "qwen2",
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_hidden_layers": 1,
                "num_attention_heads": 2,
                "num_key_value_heads": 1,
                "vocab_size": 100,
            }
        )
    )
    import huggingface_hub.constants as hc

    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(tmp_path))
    spec = resolve_model("acme/tiny")
    assert spec.hidden_size == 64
    with pytest.raises(UnknownNameError) as err:
        resolve_model("acme/not-cached")
    assert str(err.value).startswith(
        "unknown model 'acme/not-cached' (not a catalog name or alias, no such path, "
        "and not in the local Hugging Face cache, which is read offline); "
    )


def test_unknown_model_says_what_was_tried(tmp_path):
    with pytest.raises(UnknownNameError) as err:
        resolve_model(str(tmp_path / "missing" / "config.json"))
    assert str(err.value).startswith(f"unknown model '{tmp_path}/missing/config.json' (no such file or directory); ")
    with pytest.raises(UnknownNameError) as err:
        resolve_model("7bb")
    assert (
        str(err.value) == "unknown model '7bb' (not a catalog name or alias, and no such path); closest: 7b, 70b, 72b"
    )


def test_tensor_parallel_sizes_vllm_accepts(tmp_path):
    """vLLM splits attention heads, KV heads (or replicates them: tp a multiple of their count)
    and the MLP's intermediate size evenly. OLMo 3 32B: 40 heads, 8 KV heads, 27648."""
    olmo = resolve_model("32b")
    assert (olmo.num_heads, olmo.num_kv_heads, olmo.intermediate_size) == (40, 8, 27648)
    assert olmo.tp_sizes(8) == [1, 2, 4, 8]
    assert olmo.tp_problem(5) == "it neither divides the 8 KV heads nor is a multiple of them"
    cfg = {
        "model_type": "llama",
        "hidden_size": 384,
        "intermediate_size": 1000,
        "num_hidden_layers": 1,
        "num_attention_heads": 24,
        "num_key_value_heads": 4,
        "vocab_size": 100,
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    m = resolve_model(str(tmp_path))
    # heads 24: 1 2 3 4 6 8 12; KV 4: 1 2 4 divide, 8 12 are multiples, 3 and 6 are neither;
    # intermediate 1000: 8 divides it, 12 does not.
    assert m.tp_sizes(12) == [1, 2, 4, 8]
    assert m.tp_problem(12) == "it does not divide the MLP's intermediate size 1000"
    assert m.tp_problem(3) == "it neither divides the 8 KV heads nor is a multiple of them".replace("8", "4")
    assert m.tp_problem(5) == "it does not divide the 24 attention heads"
