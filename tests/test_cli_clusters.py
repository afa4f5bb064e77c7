"""`hpcrl clusters list | show | validate`, run as a user runs them (`python -m hpcrl`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

LIST_KEYS = {"name", "gpu", "gpus_per_node", "gpu_memory_gib", "nodes_max", "max_time", "file"}


@pytest.fixture
def home(tmp_path):
    """A working directory with an empty ./clusters and a private user config dir."""
    (tmp_path / "clusters").mkdir()
    return tmp_path


def hpcrl(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "HPCRL_CLUSTERS_DIR"}
    env.update(XDG_CONFIG_HOME=str(home / "config"), COLUMNS="250", NO_COLOR="1")
    return subprocess.run(
        [sys.executable, "-m", "hpcrl", *args], cwd=home, env=env, capture_output=True, text=True, timeout=60
    )


def assert_user_error(proc: subprocess.CompletedProcess, message: str) -> None:
    """Exit 2, one line on stderr saying `message`, no traceback."""
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [f"hpcrl: error: {message}"]


def test_list_json(home):
    proc = hpcrl(home, "clusters", "list", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert all(set(r) == LIST_KEYS for r in rows)
    by_name = {r["name"]: r for r in rows}
    # local-dev belongs to another part of the project and may not exist yet
    assert {"isambard-ai", "berzelius", "berzelius:fat", "berzelius-hopper"} <= set(by_name)
    isambard = dict(by_name["isambard-ai"], file=Path(by_name["isambard-ai"]["file"]).name)
    assert isambard == {
        "name": "isambard-ai",
        "gpu": "GH200",
        "gpus_per_node": 4,
        "gpu_memory_gib": 95.58,
        "nodes_max": 8,
        "max_time": "24:00:00",
        "file": "isambard-ai.yaml",
    }
    assert (by_name["berzelius"]["gpu_memory_gib"], by_name["berzelius:fat"]["gpu_memory_gib"]) == (39.39, 79.15)
    assert (by_name["berzelius"]["nodes_max"], by_name["berzelius:fat"]["nodes_max"]) == (60, 34)
    assert by_name["berzelius-hopper"]["nodes_max"] is None


def test_list_table(home):
    proc = hpcrl(home, "clusters", "list")
    assert proc.returncode == 0, proc.stderr
    assert "isambard-ai" in proc.stdout and "berzelius:fat" in proc.stdout and "A100-SXM4-80GB" in proc.stdout


def test_list_skips_a_broken_user_profile_with_a_warning(home):
    (home / "clusters" / "broken.yaml").write_text("extends: isambard-ai\ngpu:\n  count_per_nod: 4\n")
    (home / "clusters" / "fine.yaml").write_text("extends: isambard-ai\n")
    proc = hpcrl(home, "clusters", "list", "--json")
    assert proc.returncode == 0
    names = {r["name"] for r in json.loads(proc.stdout)}
    assert "fine" in names and "broken" not in names
    assert "broken.yaml: gpu.count_per_nod: unknown key" in proc.stderr


def test_show_json_is_the_full_profile(home):
    proc = hpcrl(home, "clusters", "show", "berzelius:fat", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["name"] == "berzelius" and data["variant"] == "fat"
    assert data["gpu"]["memory_gib"] == 79.15
    assert data["slurm"]["constraint"] == "fat"
    assert data["idle_gpu_policy"]["min_mean_power_w"] == 100
    assert "gpu.memory_gib" in data["unconfirmed"]
    assert (
        data["sources"]["gpu.model"] == "https://lists.nsc.liu.se/mailman/public/berzelius-users/2023-June/000037.html"
    )
    assert {"gpu", "node", "slurm", "storage", "env", "modules", "container", "ray", "variants"} <= set(data)


def test_show_table_marks_unconfirmed_facts_and_sources(home):
    proc = hpcrl(home, "clusters", "show", "isambard-ai")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    memory = next(line for line in lines if "gpu.memory_gib" in line)
    assert "95.58" in memory and "(unconfirmed)" in memory
    count = next(line for line in lines if "gpu.count_per_node" in line)
    assert "https://docs.isambard.ac.uk/user-documentation/guides/accounting/" in count
    assert "(unconfirmed)" not in count
    tx = next(line for line in lines if "env.FI_CXI_DEFAULT_TX_SIZE" in line)
    assert "2048" in tx


def test_show_without_a_name_shows_the_default_cluster(home):
    proc = hpcrl(home, "clusters", "show", "--json")
    assert json.loads(proc.stdout)["name"] == "isambard-ai"


def test_show_unknown_cluster_suggests_the_closest(home):
    assert_user_error(
        hpcrl(home, "clusters", "show", "berzelius-hoper"),
        "unknown cluster 'berzelius-hoper'; closest: berzelius-hopper",
    )
    assert_user_error(
        hpcrl(home, "clusters", "show", "berzelius:fatt"), "unknown variant of cluster berzelius 'fatt'; closest: fat"
    )


def test_show_user_profile_extending_isambard(home):
    (home / "clusters" / "ours.yaml").write_text(
        "extends: isambard-ai\nslurm:\n  exclude_nodes: [nid010798]\nray:\n  num_cpus_per_node: 32\n"
    )
    data = json.loads(hpcrl(home, "clusters", "show", "ours", "--json").stdout)
    assert (data["name"], data["extends"]) == ("ours", "isambard-ai")
    assert data["slurm"]["exclude_nodes"] == ["nid010798"]
    assert data["ray"]["num_cpus_per_node"] == 32
    assert data["ray"]["join_timeout_s"] == 900
    assert data["gpu"]["memory_gib"] == 95.58


def test_show_cluster_file(home):
    path = home / "elsewhere.yaml"
    path.write_text("extends: berzelius\ndefault_variant: fat\n")
    data = json.loads(hpcrl(home, "clusters", "show", "--cluster-file", str(path), "--json").stdout)
    assert (data["name"], data["variant"], data["gpu"]["memory_gib"]) == ("elsewhere", "fat", 79.15)
    table = hpcrl(home, "clusters", "show", "--cluster-file", str(path))
    assert table.returncode == 0 and f"file: {path}" in table.stdout
    assert_user_error(
        hpcrl(home, "clusters", "show", "berzelius", "--cluster-file", str(path)),
        f"give a cluster name ('berzelius') or --cluster-file ({path}), not both",
    )


def test_validate_ok(home):
    path = home / "ours.yaml"
    path.write_text("extends: isambard-ai\nslurm:\n  exclude_nodes: [nid010869]\n")
    proc = hpcrl(home, "clusters", "validate", str(path), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"file": str(path), "ok": True, "name": "ours"}
    proc = hpcrl(home, "clusters", "validate", str(path))
    assert proc.returncode == 0 and f"{path}: ok" in proc.stdout


@pytest.mark.parametrize("stem", ["isambard-ai", "berzelius", "berzelius-hopper"])
def test_validate_shipped(home, stem):
    shipped = Path(__file__).resolve().parent.parent / "clusters" / f"{stem}.yaml"
    proc = hpcrl(home, "clusters", "validate", str(shipped), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["name"] == stem


def test_validate_typo_key(home):
    path = home / "typo.yaml"
    path.write_text("extends: isambard-ai\ngpu:\n  count_per_nod: 4\n")
    assert_user_error(hpcrl(home, "clusters", "validate", str(path)), f"{path}: gpu.count_per_nod: unknown key")
    assert_user_error(
        hpcrl(home, "clusters", "validate", str(path), "--json"), f"{path}: gpu.count_per_nod: unknown key"
    )


def test_validate_wrong_type(home):
    path = home / "wrong.yaml"
    path.write_text("extends: berzelius\nslurm:\n  exclusive: sometimes\n")
    assert_user_error(
        hpcrl(home, "clusters", "validate", str(path)),
        f"{path}: slurm.exclusive: Input should be a valid boolean, unable to interpret input",
    )


@pytest.mark.parametrize("key", ["FOO\u00c4", "9LIVES", "A-B"])
def test_validate_env_name_bash_cannot_export(home, key):
    """A name `export` would reject (non-ASCII, leading digit, dash) is refused at validation,
    not found when the job dies on `export`."""
    path = home / "env.yaml"
    path.write_text(f"extends: local-dev\nenv:\n  {key}: x\n", encoding="utf-8")
    assert_user_error(
        hpcrl(home, "clusters", "validate", str(path)),
        f"{path}: env: {key!r} is not a valid environment variable name (ASCII letters, digits "
        "and _, not starting with a digit)",
    )


def test_validate_dollar_paren_in_a_storage_path(home):
    path = home / "p.yaml"
    path.write_text("extends: local-dev\nstorage:\n  hf_home: /x/$(id)/hf\n")
    assert_user_error(
        hpcrl(home, "clusters", "validate", str(path)),
        f"{path}: storage.hf_home: '/x/$(id)/hf': '$' may only start a variable ($NAME or ${{NAME}}); found '$(i'",
    )


def test_validate_checks_every_variant(home):
    path = home / "v.yaml"
    path.write_text("extends: berzelius\nvariants:\n  fat:\n    overrides:\n      node:\n        ram_gb: 2000\n")
    assert_user_error(hpcrl(home, "clusters", "validate", str(path)), f"{path} (variant fat): node.ram_gb: unknown key")


def test_validate_cycle_and_missing_file(home):
    (home / "clusters" / "a.yaml").write_text("extends: b\n")
    (home / "clusters" / "b.yaml").write_text("extends: a\n")
    proc = hpcrl(home, "clusters", "validate", "clusters/a.yaml")
    assert_user_error(proc, f"{home / 'clusters' / 'a.yaml'}: extends: cycle through 'b'")
    assert_user_error(hpcrl(home, "clusters", "validate", "nope.yaml"), "nope.yaml: no such file")
