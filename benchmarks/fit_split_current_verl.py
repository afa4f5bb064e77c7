"""The fixed split of results/fsdp_current_verl.jsonl, decided before those rows were measured.

    python benchmarks/fit_split_current_verl.py      # key, fit or held_out, per row

Every row is held out unless a 1dda039b constant has to be fitted; then only rows whose key hashes to
0 mod 3 may be read by that fit.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

ROWS = Path(__file__).resolve().parent / "results" / "fsdp_current_verl.jsonl"
KEY_FIELDS = ("model", "world", "seq", "micro_batches", "fsdp", "ref", "offload", "lora_rank", "verl")


def row_key(row: dict) -> str:
    return "|".join(str(row.get(k)) for k in KEY_FIELDS)


def may_fit(row: dict) -> bool:
    return int(hashlib.sha256(row_key(row).encode()).hexdigest(), 16) % 3 == 0


if __name__ == "__main__":
    for r in map(json.loads, ROWS.read_text().splitlines()):
        print(row_key(r), "fit" if may_fit(r) else "held_out")
