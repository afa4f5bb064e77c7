"""TRL's keys: the tables read from the release, the config's checks and the command-line words (pure).

`trl grpo` parses its arguments with TrlParser (HfArgumentParser) over GRPOScriptArguments, GRPOConfig, ModelConfig
and DatasetMixtureConfig (trl/scripts/grpo.py:169-182 at 1.16.0); `trl vllm-serve` over its ScriptArguments
(trl/scripts/vllm_serve.py:27-192). The tables (data/trl/<release>/) are written by scripts/trl-table.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from hpcrl.errors import ConfigError, UnknownNameError
from hpcrl.planning.backends import versions
from hpcrl.planning.backends.flagdata import DATA

SERVE_SECTION = "vllm_serve"
MODES = ("server", "colocate")
MODEL_KEY = "model_name_or_path"
# Keys hpcrl sets from the plan or the job (refused in a config, with why).
OWNED = {
    "output_dir": "the run directory's checkpoints/, so that a continuation finds them",
    "resume_from_checkpoint": "the newest complete checkpoint-N when a continuation starts",
    "vllm_server_host": "the server node of the job",
    "vllm_server_port": "the job's server port",
    "vllm_group_port": "a port drawn for the job on the server node (the weight-sync NCCL group)",
    "vllm_server_base_url": "the server node of the job",
    "deepspeed": "the ZeRO-3 JSON hpcrl writes",
    "use_vllm": "true: hpcrl plans vLLM generation (TRL's default, false, generates with transformers)",
}
SERVE_OWNED = {"model": "model_name_or_path", "host": "0.0.0.0 on the server node", "port": "the job's server port"}


@lru_cache(maxsize=None)
def tables(release: str) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    v = versions.resolve("trl", release)
    grpo = json.loads((DATA / v.args_file).read_text())
    serve = json.loads((DATA / v.args_file.replace("grpo_args.json", "vllm_serve_args.json")).read_text())
    return (
        {k: x for k, x in grpo.items() if not k.startswith("_")},
        {k: x for k, x in serve.items() if not k.startswith("_")},
    )


def default_of(meta: dict[str, Any]) -> Any:
    """A key's default as the table writes it (JSON text for plain values, repr text otherwise)."""
    try:
        return json.loads(meta["default"])
    except ValueError:
        return meta["default"]


def _accepts(kind: str, value: Any) -> bool:
    """Whether a YAML value has a type the parser's field declares (unions accept any member)."""
    if value is None:
        return "None" in kind or "Optional" in kind
    parts = {p.strip() for p in kind.replace("Optional[", "").rstrip("]").split("|")}
    ok = []
    for p in parts:
        base = p.split("[", 1)[0]
        if base == "bool":
            ok.append(isinstance(value, bool))
        elif base == "int":
            ok.append(isinstance(value, int) and not isinstance(value, bool))
        elif base == "float":
            ok.append(isinstance(value, (int, float)) and not isinstance(value, bool))
        elif base == "str":
            ok.append(isinstance(value, (str, int, float)) and not isinstance(value, bool))
        elif base == "list":
            ok.append(isinstance(value, list))
        elif base in ("dict", "Any"):
            ok.append(isinstance(value, dict) or base == "Any")
        elif base != "None":  # an enum or a class of transformers': its value is text on the command line
            ok.append(isinstance(value, str))
    return any(ok)


def flag_words(key: str, value: Any) -> tuple[str, ...]:
    """`--key value` as HfArgumentParser reads it: booleans true/false, lists as several words, dicts as JSON."""
    if isinstance(value, bool):
        return (f"--{key}", "true" if value else "false")
    if isinstance(value, list):
        return (f"--{key}", *(str(v) for v in value))
    if isinstance(value, dict):
        return (f"--{key}", json.dumps(value, separators=(",", ":")))
    return (f"--{key}", repr(value) if isinstance(value, float) else str(value))


def normalize(args: dict[str, Any]) -> dict[str, Any]:
    """`vllm_serve.KEY` (a --set) into the `vllm_serve` mapping; the other keys as they are."""
    out: dict[str, Any] = {}
    for key, value in args.items():
        head, dot, rest = str(key).partition(".")
        if head == SERVE_SECTION and dot:
            serve = out.setdefault(SERVE_SECTION, dict(args.get(SERVE_SECTION) or {}))
            serve[rest] = value
        elif key == SERVE_SECTION and isinstance(value, dict):
            out[SERVE_SECTION] = {**value, **out.get(SERVE_SECTION, {})}
        else:
            out[key] = value
    return out


def check_args(
    args: dict[str, Any], table: dict[str, dict[str, Any]], serve: dict[str, dict[str, Any]], release: str
) -> None:
    """Refuse a key `trl grpo` (or `trl vllm-serve`, under vllm_serve) does not have, a value its parser would
    refuse, a key hpcrl sets, and what the run needs but lacks."""
    for key, value in args.items():
        if key == SERVE_SECTION:
            _check_serve(value, serve, release)
            continue
        if key not in table:
            raise UnknownNameError(f"trl grpo key (TRL {release})", key, table)
        if key in OWNED:
            raise ConfigError(f"{key} is set by hpcrl: {OWNED[key]}; remove it")
        if not _accepts(table[key]["type"], value):
            raise ConfigError(
                f"{key}: expected {table[key]['type']} ({table[key]['source']} in TRL {release}), got {value!r}"
            )
    if not args.get(MODEL_KEY):
        raise ConfigError("trl grpo needs model_name_or_path")
    if not (args.get("dataset_name") or args.get("datasets")):
        raise ConfigError("trl grpo needs dataset_name (or datasets): trl/scripts/grpo.py:121-135 refuses neither")
    if args.get("reward_model_name_or_path"):
        raise ConfigError(
            "reward_model_name_or_path: a reward model runs on every learner GPU, which hpcrl does "
            "not plan; use reward_funcs (a function, or a dotted import path)"
        )
    if not args.get("reward_funcs"):
        raise ConfigError("trl grpo needs reward_funcs (accuracy_reward, ... or a dotted import path)")
    mode = args.get("vllm_mode", default_of(table["vllm_mode"]))
    if mode not in MODES:
        raise ConfigError(f"vllm_mode {mode!r}: valid: {', '.join(MODES)} (trl/trainer/grpo_config.py:594)")
    if args.get("generation_batch_size") is not None:
        raise ConfigError(
            "generation_batch_size: hpcrl plans the step's batch through steps_per_generation "
            "(GRPOConfig allows one of the two, grpo_config.py:1110-1128); give steps_per_generation"
        )
    if args.get("load_in_4bit") and not args.get("use_peft"):
        raise ConfigError("load_in_4bit trains adapters only: set use_peft: true as well (QLoRA)")


def _check_serve(value: Any, serve: dict[str, dict[str, Any]], release: str) -> None:
    if not isinstance(value, dict):
        raise ConfigError(f"{SERVE_SECTION}: a mapping of trl vllm-serve keys, got {value!r}")
    for key, v in value.items():
        if key not in serve:
            raise UnknownNameError(
                f"trl vllm-serve key (TRL {release})", f"{SERVE_SECTION}.{key}", [f"{SERVE_SECTION}.{k}" for k in serve]
            )
        if key in SERVE_OWNED:
            raise ConfigError(f"{SERVE_SECTION}.{key} is set by hpcrl: {SERVE_OWNED[key]}; remove it")
        if not _accepts(serve[key]["type"], v):
            raise ConfigError(
                f"{SERVE_SECTION}.{key}: expected {serve[key]['type']} ({serve[key]['source']}), got {v!r}"
            )


__all__ = [
    "MODEL_KEY",
    "MODES",
    "OWNED",
    "SERVE_OWNED",
    "SERVE_SECTION",
    "check_args",
    "default_of",
    "flag_words",
    "normalize",
    "tables",
]
