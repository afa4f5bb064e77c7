"""Architecture of a decoder-only transformer and the exact parameter counts it implies."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

from hpcrl.errors import ModelSpecError

# Projection names as Hugging Face implementations call them (LoRA target names).
ATTN_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
ALL_LINEAR = ATTN_MODULES + MLP_MODULES

QKNorm = Literal["none", "per_head", "full"]

# Families whose attention carries a bias on q/k/v, or normalises q and k.
_QKV_BIAS = {"qwen2", "qwen2_moe"}
_QK_NORM: dict[str, QKNorm] = {
    "qwen3": "per_head",
    "qwen3_moe": "per_head",
    "olmo2": "full",
    "olmo3": "full",
    "olmoe": "full",
}

# The largest count a config.json may give (hidden size, layers, heads, vocabulary, ...): far above any
# model's, and small enough that no product of them overflows what the planner sizes.
COUNT_MAX = 2**24

_REQUIRED = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "vocab_size",
)


@dataclass(frozen=True)
class ModelSpec:
    """What the planner needs to know of a model; counts are derived, never stored (the costly ones
    are cached on the instance: a layout search reads them tens of thousands of times)."""

    name: str
    model_type: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int = 0
    qkv_bias: bool = False
    qk_norm: QKNorm = "none"
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    sources: tuple[str, ...] = field(default=(), compare=False)

    # ------------------------------------------------------------------ building
    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any], name: str, sources: tuple[str, ...] = ()) -> ModelSpec:
        """Build from a Hugging Face config.json dict; a missing field is a ModelSpecError."""
        if "text_config" in cfg and "hidden_size" not in cfg:
            cfg = {**cfg["text_config"], "model_type": cfg.get("model_type", "")}
        for key in _REQUIRED:
            if cfg.get(key) in (None, ""):
                raise ModelSpecError(f"{name}: config.json has no {key!r}, which the planner needs")

        def count(key: str, default: int = 0, least: int = 1) -> int:
            """A whole number in [least, COUNT_MAX] (or the default where unset): nothing is sized from a
            number no model has, and no 0 reaches a division."""
            value = cfg.get(key)
            if value is None or value == "":
                return default
            whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
            if isinstance(value, bool) or not whole or not least <= value <= COUNT_MAX:
                raise ModelSpecError(
                    f"{name}: config.json {key} {value!r}: valid: a whole number from {least} to {COUNT_MAX:,}"
                )
            return int(value)

        model_type = str(cfg.get("model_type", "unknown"))
        heads = count("num_attention_heads")
        kv = count("num_key_value_heads", heads)
        hidden = count("hidden_size")
        head_dim = count("head_dim", hidden // heads)
        if head_dim < 1:
            raise ModelSpecError(
                f"{name}: config.json hidden_size {hidden} over num_attention_heads {heads} "
                "leaves no head dimension; give head_dim"
            )
        experts = count("num_experts", 0, 0) or count("num_local_experts", 0, 0)
        spec = cls(
            name=name,
            model_type=model_type,
            hidden_size=hidden,
            intermediate_size=count("intermediate_size"),
            num_layers=count("num_hidden_layers"),
            num_heads=heads,
            num_kv_heads=kv,
            head_dim=head_dim,
            vocab_size=count("vocab_size"),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            max_position_embeddings=count("max_position_embeddings", 0, 0),
            qkv_bias=bool(cfg.get("attention_bias", model_type in _QKV_BIAS)),
            qk_norm=_QK_NORM.get(model_type, "none"),
            num_experts=experts,
            num_experts_per_tok=count("num_experts_per_tok", 0, 0),
            # Mixtral and OLMoE give each expert's size as intermediate_size (no moe_intermediate_size).
            moe_intermediate_size=count("moe_intermediate_size", count("intermediate_size") if experts else 0, 0),
            sources=tuple(sources),
        )
        spec.validate()
        return spec

    def validate(self) -> None:
        for key in ("hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads", "vocab_size"):
            if getattr(self, key) <= 0:
                raise ModelSpecError(f"{self.name}: {key} must be positive, got {getattr(self, key)}")
        if self.num_heads % self.num_kv_heads:
            raise ModelSpecError(
                f"{self.name}: num_attention_heads {self.num_heads} is not a multiple of "
                f"num_key_value_heads {self.num_kv_heads}"
            )
        if self.num_experts and not (self.moe_intermediate_size and self.num_experts_per_tok):
            raise ModelSpecError(f"{self.name}: MoE config needs moe_intermediate_size and num_experts_per_tok")
        if self.num_experts_per_tok > max(self.num_experts, 0) and self.num_experts:
            raise ModelSpecError(
                f"{self.name}: num_experts_per_tok {self.num_experts_per_tok} is more than the "
                f"{self.num_experts} experts"
            )

    # ------------------------------------------------------------------ counts
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each dense projection in one layer (per expert for MoE MLPs)."""
        h = self.hidden_size
        f = self.moe_intermediate_size if self.is_moe else self.intermediate_size
        return {
            "q_proj": (h, self.q_dim),
            "k_proj": (h, self.kv_dim),
            "v_proj": (h, self.kv_dim),
            "o_proj": (self.q_dim, h),
            "gate_proj": (h, f),
            "up_proj": (h, f),
            "down_proj": (f, h),
        }

    @cached_property
    def attn_params_per_layer(self) -> int:
        s = self.linear_shapes()
        n = sum(s[m][0] * s[m][1] for m in ATTN_MODULES)
        if self.qkv_bias:
            n += self.q_dim + 2 * self.kv_dim
        if self.qk_norm == "per_head":
            n += 2 * self.head_dim
        elif self.qk_norm == "full":
            n += self.q_dim + self.kv_dim
        return n

    def _mlp_params(self, experts: int) -> int:
        s = self.linear_shapes()
        per = sum(s[m][0] * s[m][1] for m in MLP_MODULES)
        if not self.is_moe:
            return per
        return experts * per + self.hidden_size * self.num_experts  # router

    @cached_property
    def mlp_params_per_layer(self) -> int:
        return self._mlp_params(self.num_experts)

    @cached_property
    def per_layer_params(self) -> int:
        return self.attn_params_per_layer + self.mlp_params_per_layer + 2 * self.hidden_size

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    @cached_property
    def total_params(self) -> int:
        return (
            self.num_layers * self.per_layer_params
            + self.embedding_params
            + self.lm_head_params
            + self.hidden_size  # final norm
        )

    @cached_property
    def active_params(self) -> int:
        """Parameters touched per token (MoE: only the routed experts)."""
        if not self.is_moe:
            return self.total_params
        inactive = self.mlp_params_per_layer - self._mlp_params(self.num_experts_per_tok)
        return self.total_params - self.num_layers * inactive

    @property
    def largest_param_tensor(self) -> int:
        """Elements of the largest single weight (DeepSpeed's `largest_layer` proxy)."""
        shapes = self.linear_shapes().values()
        return max([self.embedding_params] + [a * b for a, b in shapes])

    def lora_params(self, rank: int, targets: tuple[str, ...] = ALL_LINEAR) -> int:
        """Trainable parameters of LoRA adapters of `rank` on the named projections."""
        unknown = sorted(set(targets) - set(ALL_LINEAR))
        if unknown:
            raise ModelSpecError(f"unknown LoRA target module(s) {unknown}; valid: {list(ALL_LINEAR)}")
        shapes = self.linear_shapes()
        per_layer = 0
        for m in targets:
            fan_in, fan_out = shapes[m]
            copies = self.num_experts if (self.is_moe and m in MLP_MODULES) else 1
            per_layer += copies * rank * (fan_in + fan_out)
        return self.num_layers * per_layer

    def tp_problem(self, tp: int) -> str | None:
        """Why vLLM cannot shard this model `tp` ways (None: it can). vLLM splits the attention
        heads, the KV heads (or replicates them when tp is a multiple of their count) and the
        MLP's intermediate dimension (per expert for MoE) evenly across ranks."""
        if self.num_heads % tp:
            return f"it does not divide the {self.num_heads} attention heads"
        if self.num_kv_heads % tp and tp % self.num_kv_heads:
            return f"it neither divides the {self.num_kv_heads} KV heads nor is a multiple of them"
        inter = self.moe_intermediate_size if self.is_moe else self.intermediate_size
        if inter % tp:
            return f"it does not divide the MLP's intermediate size {inter}"
        return None

    def tp_sizes(self, limit: int) -> list[int]:
        """Tensor-parallel sizes up to `limit` (a node's GPUs) that vLLM accepts for this model."""
        return [t for t in range(1, limit + 1) if self.tp_problem(t) is None]

    def kv_bytes_per_token(self, tp: int = 1, dtype_bytes: int = 2) -> int:
        """KV-cache bytes one token takes on one GPU at tensor-parallel size tp.

        vLLM splits KV heads across TP ranks; when tp exceeds the KV heads each
        rank keeps a replica of one head, so the per-GPU share stops shrinking.
        """
        heads_per_gpu = max(1, self.num_kv_heads // tp)
        return 2 * self.num_layers * heads_per_gpu * self.head_dim * dtype_bytes
