"""Model architectures: the built-in catalog, aliases, and HF config.json loading."""

from hpcrl.models.catalog import ALIASES, catalog, resolve_model
from hpcrl.models.spec import ModelSpec

__all__ = ["ALIASES", "ModelSpec", "catalog", "resolve_model"]
