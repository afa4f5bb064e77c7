"""The built-in model catalog, its aliases, and resolution of any name, path or HF repo id."""

from __future__ import annotations

import json
import stat
from functools import lru_cache
from pathlib import Path

from hpcrl.errors import ModelSpecError, UnknownNameError
from hpcrl.models.spec import ModelSpec

_CATALOG = Path(__file__).with_name("catalog.json")
CONFIG_JSON_MAX = 4 * 2**20  # the largest config.json read: real ones are a few KiB

# Size aliases -> catalog short name. The users train OLMo, so bare sizes that OLMo
# ships map to OLMo 3; the other sizes map to the Qwen2.5 / Llama 3.1 model of that size.
ALIASES: dict[str, str] = {
    "0.5b": "qwen2.5-0.5b",
    "1.5b": "qwen2.5-1.5b",
    "3b": "qwen2.5-3b",
    "7b": "olmo3-7b",
    "8b": "llama3.1-8b",
    "13b": "olmo2-13b",
    "14b": "qwen2.5-14b",
    "30b-a3b": "qwen3-30b-a3b",
    "32b": "olmo3-32b",
    "70b": "llama3.1-70b",
    "72b": "qwen2.5-72b",
}


@lru_cache(maxsize=1)
def catalog() -> dict[str, ModelSpec]:
    """Short name -> ModelSpec of every built-in model."""
    data = json.loads(_CATALOG.read_text())
    return {
        entry["short"]: ModelSpec.from_hf_config(entry["config"], entry["name"], tuple(entry["sources"]))
        for entry in data["models"]
    }


def catalog_entries() -> list[dict]:
    """The raw catalog rows (name, short, config, expected counts, sources)."""
    return json.loads(_CATALOG.read_text())["models"]


def _by_lower_name() -> dict[str, str]:
    names = {}
    for short, spec in catalog().items():
        names[short] = short
        names[spec.name.lower()] = short
        names[spec.name.split("/")[-1].lower()] = short
    for alias, short in ALIASES.items():
        names[alias] = short
    return names


def load_config_json(path: Path, name: str | None = None) -> ModelSpec:
    """ModelSpec from a config.json file or a directory holding one."""
    file = path / "config.json" if path.is_dir() else path
    try:
        st = file.stat()
    except FileNotFoundError:
        raise ModelSpecError(f"{file}: no config.json there") from None
    except OSError as exc:
        raise ModelSpecError(f"{file}: cannot read it: {exc.strerror or exc}") from None
    # A FIFO or a device (/dev/zero) would be read until memory runs out; a config.json is a small file.
    if not stat.S_ISREG(st.st_mode):
        raise ModelSpecError(f"{file}: not a regular file; a model is a config.json file or the directory holding one")
    if st.st_size > CONFIG_JSON_MAX:
        raise ModelSpecError(f"{file}: {st.st_size:,} bytes; a model's config.json is under {CONFIG_JSON_MAX:,}")
    try:
        cfg = json.loads(file.read_bytes().decode("utf-8"))
    except OSError as exc:
        raise ModelSpecError(f"{file}: cannot read it: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ModelSpecError(f"{file}: not UTF-8 text; a model's config.json is JSON") from None
    except json.JSONDecodeError as exc:
        raise ModelSpecError(f"{file}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    except RecursionError:
        raise ModelSpecError(f"{file}: nested too deeply to be a model's config.json") from None
    if not isinstance(cfg, dict):
        raise ModelSpecError(f"{file}: expected a JSON object of model settings")
    return ModelSpec.from_hf_config(cfg, name or str(path), (str(file),))


def _from_hf_cache(repo_id: str) -> ModelSpec | None:
    """config.json of repo_id from the local Hugging Face cache; never touches the network."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - a runtime dependency
        return None
    try:
        found = try_to_load_from_cache(repo_id, "config.json")
    except Exception:  # invalid repo id syntax and the like: not a cache hit
        return None
    if isinstance(found, str):
        return load_config_json(Path(found), repo_id)
    return None


def resolve_model(name: str) -> ModelSpec:
    """A catalog name or alias, a path to a config.json (or its directory), or a cached HF repo id."""
    if not name or not name.strip():
        raise ModelSpecError("model name is empty; give a catalog name, alias, path or HF repo id")
    key = name.strip().lower()
    names = _by_lower_name()
    if key in names:
        return catalog()[names[key]]
    path = Path(name).expanduser()
    if path.exists():
        return load_config_json(path)
    tried = "not a catalog name or alias, and no such path"
    if name.startswith(("/", ".", "~")) or name.endswith(".json"):
        tried = "no such file or directory"
    elif "/" in name:
        cached = _from_hf_cache(name)
        if cached is not None:
            return cached
        tried = (
            "not a catalog name or alias, no such path, and not in the local Hugging Face cache, which is read offline"
        )
    known = [*catalog(), *ALIASES, *(spec.name for spec in catalog().values())]
    raise UnknownNameError("model", name, known, detail=tried)
