"""The refresh commands on a framework git history made here: capabilities-drift follows a moved
file, reports a changed line, a changed default and a deleted file, flags a file a default run
no longer imports, and writes the new version's facts with the unread ones flagged;
framework-table writes a Hydra config's keys with their defaults and declared types. Expected
values are what the history below was made to contain."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@t",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@t",
    "PATH": "/usr/bin:/bin",
}


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True, env=ENV
    ).stdout.strip()


def _write(repo: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    """Pinned: five files, each cited by one fact. Then: old.py renamed to new.py (its cited line
    kept, lines added above it), the cited line of train.py edited, lr's default changed, gone.py
    deleted, two lines added above train.py's untouched cited line, and the entry point stops
    importing legacy.py."""
    tmp = tmp_path_factory.mktemp("fw")
    repo = tmp / "fw"
    _git(tmp, "init", "-q", str(repo))
    _write(
        repo,
        {
            "main.py": "import pkg.train\nimport pkg.old\nimport pkg.legacy\n",
            "pkg/__init__.py": "",
            "pkg/train.py": "a = 1\nmodel = load_bf16()\nc = 3\nsave = None\n",
            "pkg/old.py": "def sleep():\n    return engine.sleep(level=2)\n",
            "pkg/gone.py": "def worker():\n    return fsdp_wrap()\n",
            "pkg/legacy.py": "def fit():\n    return save_on_signal()\n",
            "conf/trainer.yaml": "lr: 0.1\nepochs: 3\n",
        },
    )
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "pinned")
    pinned = _git(repo, "rev-parse", "HEAD")
    _git(repo, "mv", "pkg/old.py", "pkg/new.py")
    _write(
        repo,
        {
            "pkg/new.py": "import os\n\n\ndef sleep():\n    return engine.sleep(level=2)\n",
            "main.py": "import pkg.train\nimport pkg.new\n",
        },
    )
    _git(repo, "commit", "-qam", "move old.py to new.py")
    _write(repo, {"pkg/train.py": "a = 1\nmodel = get_peft_model(load_bf16())\nc = 3\nsave = None\n"})
    _git(repo, "commit", "-qam", "apply LoRA")
    _write(repo, {"pkg/train.py": "# header\n\na = 1\nmodel = get_peft_model(load_bf16())\nc = 3\nsave = None\n"})
    _git(repo, "commit", "-qam", "add a header")
    _write(repo, {"conf/trainer.yaml": "lr: 0.2\nepochs: 3\n"})
    _git(repo, "commit", "-qam", "raise the default lr")
    _git(repo, "rm", "-q", "pkg/gone.py")
    _git(repo, "commit", "-qm", "delete the old worker")
    table = {
        "_meta": {},
        "fw": {
            "repo": "x/fw",
            "commit": pinned,
            "features": {
                "lora": {"supported": False, "source": "pkg/train.py:2", "note": ""},
                "save": {"supported": False, "source": "pkg/train.py:4", "note": ""},
                "sleep": {"supported": True, "source": "pkg/old.py:2", "note": ""},
                "fsdp": {"supported": True, "source": "pkg/gone.py:2", "note": ""},
                "signal": {"supported": True, "source": "pkg/legacy.py:2", "note": ""},
            },
            "vllm": {"lr": {"default": 0.1, "source": "conf/trainer.yaml:1", "note": ""}},
        },
    }
    (tmp / "table.json").write_text(json.dumps(table))
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "capabilities-drift"),
            "--repo",
            f"fw={repo}",
            "--table",
            str(tmp / "table.json"),
            "--to",
            "HEAD",
            "--entry",
            "main.py",
            "--write-version",
            str(tmp / "new"),
            "--json",
        ],
        capture_output=True,
        text=True,
    )
    rows = {r["fact"]: r for r in json.loads(out.stdout)["citations"]}
    written = json.loads((tmp / "new" / "capabilities.json").read_text())["fw"]
    return out.returncode, rows, written


def test_drift_exits_1(history):
    assert history[0] == 1


def test_a_moved_file_is_followed_to_its_new_line(history):
    assert (history[1]["features.sleep"]["status"], history[1]["features.sleep"]["now_at"]) == ("moved", "pkg/new.py:5")


def test_a_changed_line_names_the_commit_that_changed_it_not_a_later_one(history):
    assert history[1]["features.lora"]["changed_by"][0].endswith("apply LoRA")


def test_a_changed_default_names_the_commit_that_changed_it(history):
    assert history[1]["vllm.lr"]["changed_by"][0].endswith("raise the default lr")


def test_a_deleted_file_is_reported_deleted(history):
    assert (history[1]["features.fsdp"]["status"], history[1]["features.fsdp"]["changed_by"][0][8:]) == (
        "deleted",
        "delete the old worker",
    )


def test_an_untouched_line_that_shifted_is_the_same_at_its_new_number(history):
    row = history[1]["features.save"]
    assert (row["status"], row["now_at"], row["off_default_path"]) == ("same", "pkg/train.py:6", False)


def test_a_file_the_entry_point_no_longer_imports_is_off_the_default_path(history):
    assert (history[1]["features.signal"]["status"], history[1]["features.signal"]["off_default_path"]) == (
        "same",
        True,
    )


def test_the_new_version_moves_a_followed_citation_and_flags_the_changed_ones(history):
    facts = history[2]["features"]
    assert (
        (facts["sleep"]["source"], "needs_reading" in facts["sleep"]),
        sorted(n for n, f in {**facts, **history[2]["vllm"]}.items() if "needs_reading" in f),
    ) == (("pkg/new.py:5", True), ["fsdp", "lora", "lr", "signal", "sleep"])


def test_framework_table_composes_a_hydra_config_with_its_dataclass_types(tmp_path):
    pytest.importorskip("hydra")  # hydra-core is a tool of this refresh, not an hpcrl dependency
    repo = tmp_path / "fw"
    _git(tmp_path, "init", "-q", str(repo))
    _write(
        repo,
        {
            "fw/config/trainer.yaml": "defaults:\n  - optim@actor.optim: adam\n  - _self_\n"
            "actor:\n  lr: 1e-6\n  rank: ${.optim.size}\n  name: ???\n",
            "fw/config/optim/adam.yaml": "_target_: fw.cfg.OptimConfig\nsize: 8\nbetas: [0.9, 0.99]\n",
            "fw/cfg.py": "class Base:\n    size: int = 0\n\n\nclass OptimConfig(Base):\n"
            "    betas: tuple[float, float] = (0.9, 0.99)\n",
        },
    )
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "config")
    out = tmp_path / "args.json"
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "framework-table"),
            "verl",
            "--git-dir",
            str(repo / ".git"),
            "--commit",
            "HEAD",
            "--config-path",
            "fw/config",
            "--config-name",
            "trainer",
            "--package",
            "fw",
            "--out",
            str(out),
        ],
        check=True,
        capture_output=True,
    )
    keys = {k: v for k, v in json.loads(out.read_text()).items() if k != "_meta"}
    assert keys == {
        "actor.optim._target_": {"default": "fw.cfg.OptimConfig", "type": "str"},
        "actor.optim.size": {"default": "8", "type": "int", "annotation": "int", "dataclass": "fw.cfg.OptimConfig"},
        "actor.optim.betas": {
            "default": "[0.9, 0.99]",
            "type": "list",
            "annotation": "tuple[float, float]",
            "dataclass": "fw.cfg.OptimConfig",
        },
        "actor.lr": {"default": "1e-06", "type": "float"},
        "actor.rank": {"default": "${.optim.size}", "resolved": 8, "type": "int", "interpolation": True},
        "actor.name": {"default": "???", "type": "str", "required": True},
    }


def test_framework_table_reads_the_parser_the_entry_point_builds(tmp_path):
    """Flags made in a loop, a store_false alias and a pair of values, as argparse defines them."""
    repo = tmp_path / "fw"
    _git(tmp_path, "init", "-q", str(repo))
    _write(
        repo,
        {
            "cli/train.py": "import argparse\nimport not_installed_here\n\nif __name__ == '__main__':\n"
            "    parser = argparse.ArgumentParser()\n"
            "    for prefix in ('actor', 'critic'):\n"
            "        parser.add_argument(f'--{prefix}.lr', type=float, default=1e-6)\n"
            "    parser.add_argument('--sleep', action='store_true', default=True)\n"
            "    parser.add_argument('--no_sleep', dest='sleep', action='store_false')\n"
            "    parser.add_argument('--betas', type=float, nargs=2, default=(0.9, 0.95))\n"
            "    args = parser.parse_args()\n    not_installed_here.run(args)\n"
        },
    )
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "cli")
    out = tmp_path / "args.json"
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "framework-table"),
            "argparse",
            "--git-dir",
            str(repo / ".git"),
            "--commit",
            "HEAD",
            "--file",
            "cli/train.py",
            "--out",
            str(out),
        ],
        check=True,
        capture_output=True,
    )
    keys = {k: v for k, v in json.loads(out.read_text()).items() if k != "_meta"}
    assert keys == {
        "actor.lr": {"default": "1e-06", "type": "float", "action": "store"},
        "critic.lr": {"default": "1e-06", "type": "float", "action": "store"},
        "sleep": {"default": "True", "type": "bool", "action": "store_true"},
        "no_sleep": {"default": "True", "type": "bool", "action": "store_false", "dest": "sleep"},
        "betas": {"default": "[0.9, 0.95]", "type": "list", "element_type": "float", "nargs": 2, "action": "store"},
    }
