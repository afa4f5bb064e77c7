"""scripts/add-release on a wheel made here, against a data folder made here: a framework whose entry file builds
an argparse parser in its __main__ block, at a known release and at a new one. The new release adds a flag,
drops one, changes a default, raises a pin, moves a cited line and changes another; expected values are what
the two releases were made to contain."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENTRY_OLD = """import argparse

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--old_flag", action="store_true", default=False)
    args = parser.parse_args()
"""
ENTRY_NEW = """import argparse

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.2)
    parser.add_argument("--level", type=str, default="off", choices=["off", "token"])
    args = parser.parse_args()
"""
ACTOR_OLD = "def load():\n    return bf16_model()\n\n\ndef sleep():\n    return engine.sleep(level=2)\n"
ACTOR_NEW = "import os\n\n\ndef load():\n    return fp32_model()\n\n\ndef sleep():\n    return engine.sleep(level=2)\n"
METADATA = (
    "Metadata-Version: 2.1\nName: toyfw\nVersion: {v}\nRequires-Python: >=3.10\nRequires-Dist: ray>=2.41\n"
    'Requires-Dist: vllm=={vllm}; extra == "vllm"\n'
)


def make_release(folder: Path, version: str, entry: str, actor: str, vllm: str) -> None:
    (folder / "toyfw" / "cli").mkdir(parents=True)
    (folder / "toyfw" / "__init__.py").write_text("")
    (folder / "toyfw" / "cli" / "train.py").write_text(entry)
    (folder / "toyfw" / "actor.py").write_text(actor)
    info = folder / f"toyfw-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(METADATA.format(v=version, vllm=vllm))


def wheel(src: Path, out: Path) -> Path:
    with zipfile.ZipFile(out, "w") as z:
        for f in sorted(src.rglob("*")):
            if f.is_file():
                z.write(f, f.relative_to(src))
    return out


@pytest.fixture()
def data(tmp_path):
    """hpcrl's data folder for toyfw: release 1.0.0 (its table, its facts citing actor.py, its install facts)."""
    old = tmp_path / "old"
    make_release(old, "1.0.0", ENTRY_OLD, ACTOR_OLD, "0.27.1")
    d = tmp_path / "data"
    (d / "toyfw" / "1.0.0").mkdir(parents=True)
    table = {
        "_meta": {"repo": "toy/fw"},
        "lr": {"default": "0.1", "type": "float", "action": "store"},
        "old_flag": {"default": "False", "type": "bool", "action": "store_true"},
    }
    (d / "toyfw" / "1.0.0" / "args.json").write_text(json.dumps(table))
    caps = {
        "toyfw": {
            "features": {
                "precision": {"supported": True, "default": "bf16", "source": "toyfw/actor.py:2", "note": ""},
                "sleep_level": {"supported": True, "default": 2, "source": "toyfw/actor.py:6", "note": ""},
            }
        }
    }
    (d / "toyfw" / "1.0.0" / "capabilities.json").write_text(json.dumps(caps))
    stack = {
        "declares": "1.0.0",
        "python": {"spec": ">=3.10", "source": "METADATA:4"},
        "packages": [
            {"name": "toyfw", "dists": ["toyfw"], "module": "toyfw", "spec": "", "source": "METADATA:3"},
            {"name": "ray", "dists": ["ray"], "module": "ray", "spec": ">=2.41", "source": "METADATA:5"},
            {"name": "vllm", "dists": ["vllm"], "module": "vllm", "spec": "==0.27.1", "source": "METADATA:6"},
        ],
        "torch_cuda": None,
        "parser": {"kind": "main-block", "namespace": "stdlib", "entry": "toyfw.cli.train"},
    }
    (d / "toyfw" / "1.0.0" / "stack.json").write_text(json.dumps(stack))
    (d / "stack.json").write_text("{}")
    entry = {
        "name": "1.0.0",
        "commit": "",
        "date": "2026-01-01",
        "release": "1.0.0",
        "default": True,
        "files": {
            "args": "toyfw/1.0.0/args.json",
            "capabilities": "toyfw/1.0.0/capabilities.json",
            "stack": "toyfw/1.0.0/stack.json",
        },
    }
    (d / "versions.json").write_text(json.dumps({"_meta": {}, "toyfw": [entry]}))
    new = tmp_path / "new"
    make_release(new, "1.1.0", ENTRY_NEW, ACTOR_NEW, "0.29.0")
    return {"data": d, "old": old, "wheel": wheel(new, tmp_path / "toyfw-1.1.0-py3-none-any.whl")}


def add_release(data: dict, *more: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "add-release"),
            "toyfw",
            str(data["wheel"]),
            "--data",
            str(data["data"]),
            "--old",
            str(data["old"]),
            "--date",
            "2026-02-01",
            *more,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_diff_names_flags_defaults_pins_and_cited_lines(data):
    out = add_release(data, "--json")
    r = json.loads(out.stdout)
    facts = {f["fact"]: (f["status"], f.get("now_at")) for f in r["facts"]}
    assert (
        out.returncode,
        r["nearest"],
        r["keys"]["added"],
        r["keys"]["removed"],
        r["keys"]["changed"],
        [(p["package"], p["old"], p["new"]) for p in r["pins"]],
        facts,
    ) == (
        0,
        "1.0.0",
        ["level"],
        ["old_flag"],
        {"lr": {"default": ["0.1", "0.2"]}},
        [("vllm", "==0.27.1", "==0.29.0")],
        {"features.precision": ("changed", None), "features.sleep_level": ("moved", "toyfw/actor.py:9")},
    )


def test_write_adds_the_release_beside_the_old_one_with_the_unread_facts_flagged(data):
    out = add_release(data, "--write")
    d = data["data"]
    index = json.loads((d / "versions.json").read_text())["toyfw"]
    caps = json.loads((d / "toyfw" / "1.1.0" / "capabilities.json").read_text())["toyfw"]["features"]
    stack = json.loads((d / "toyfw" / "1.1.0" / "stack.json").read_text())
    table = json.loads((d / "toyfw" / "1.1.0" / "args.json").read_text())
    assert (
        out.returncode,
        [(v["name"], bool(v.get("default"))) for v in index],
        "needs_reading" in caps["precision"],
        caps["sleep_level"]["source"],
        stack["declares"],
        stack["packages"][2]["spec"],
        sorted(k for k in table if not k.startswith("_")),
    ) == (0, [("1.0.0", True), ("1.1.0", False)], True, "toyfw/actor.py:9", "1.1.0", "==0.29.0", ["level", "lr"])


def test_a_release_already_known_is_refused_in_one_line(data):
    add_release(data, "--write")
    out = add_release(data, "--write")
    assert (out.returncode, out.stderr.strip()) == (
        2,
        "add-release: error: --name '1.1.0': toyfw already has a table of that name",
    )
