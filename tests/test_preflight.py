"""Preflight: the verdicts on a probe report, and the probe run through submitit on the local Slurm."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import NODE
from hpcrl.jobs.preflight import Target, evaluate
from hpcrl.profiles import load_profile_file

PROFILE = """\
name: pf-test
description: The local dev Slurm (scripts/dev-slurm) for the preflight tests.
gpu: {{model: H100, count_per_node: 4, memory_gib: 79.1, hbm_bandwidth_tbs: 3.35, bf16_tflops: 989}}
node: {{cpu_cores: 4, ram_gib: 16, arch: x86_64}}
slurm:
  gpu_request: gpus-per-node
  exclusive: false
  default_partition: debug
  partitions:
    debug: {{max_nodes: 4, max_time: "01:00:00"}}
storage:
  node_local: {{path: {tmp}/node-local}}
  run_root: {{path: {tmp}/runs}}
  hf_home: {tmp}/hf
"""


@pytest.fixture
def home(tmp_path):
    (tmp_path / "clusters").mkdir()
    (tmp_path / "clusters" / "pf-test.yaml").write_text(PROFILE.format(tmp=tmp_path))
    (tmp_path / "node-local").mkdir()
    return tmp_path


def hpcrl(home: Path, *args: str, path: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HPCRL_")}
    env.update(
        HPCRL_CLUSTERS_DIR=str(home / "clusters"), HPCRL_DATA_DIR=str(home / "data"), NO_COLOR="1", COLUMNS="250"
    )
    if path is not None:
        env["PATH"] = path
    return subprocess.run(
        [sys.executable, "-m", "hpcrl", *args], env=env, cwd=home, capture_output=True, text=True, timeout=600
    )


def _report(gpus: dict, tmp: Path) -> dict:
    space = {
        "path": str(tmp),
        "exists": True,
        "checked": str(tmp),
        "writable": True,
        "free_gib": 100.0,
        "total_gib": 200.0,
        "error": None,
    }
    return {
        "node": "n1",
        "job_id": "1",
        "python": "3.11",
        "gpus": gpus,
        "node_local": space,
        "run_root": space,
        "model": {"model": None, "found": False, "detail": ""},
        "stack": {"error": None, "modules": {"torch": ["2.11.0", None], "vllm": [None, "ModuleNotFoundError: x"]}},
    }


def _target(home: Path, disk: float | None = None) -> Target:
    profile = load_profile_file(home / "clusters" / "pf-test.yaml")
    return Target(profile, "debug", None, None, {}, disk, ())


def _h100(n: int, mem: float = 79.2) -> dict:
    return {
        "count": n,
        "error": None,
        "devices": [{"name": "NVIDIA H100 80GB HBM3", "memory_gib": mem, "used_gib": 0}] * n,
    }


def test_verdicts_gpus_disk_imports(home):
    by = {r.check: r for r in evaluate(_report(_h100(4), home), _target(home))}
    assert by["gpus"].status == "ok" and "4 x NVIDIA H100 80GB HBM3" in by["gpus"].detail
    assert by["import torch"] == ("import torch", "ok", "2.11.0")
    assert by["import vllm"].status == "warn" and "ModuleNotFoundError" in by["import vllm"].detail
    assert "disk need not known" in by["run root"].detail

    by = {r.check: r for r in evaluate(_report(_h100(2, 39.4), home), _target(home, disk=150.0))}
    assert by["gpus"].status == "fail"
    assert "2 GPUs, profile expects 4" in by["gpus"].detail and "39.4 GiB per GPU" in by["gpus"].detail
    assert by["run root"].status == "fail" and "plan needs 150.0 GiB" in by["run root"].detail


def test_torch_cuda_build_against_the_driver(home):
    """Isambard-AI's driver runs CUDA 12.7 at most: a cu130 torch cannot run there."""

    def check(torch_cuda, driver_cuda):
        report = _report(dict(_h100(4), driver_cuda=driver_cuda), home)
        report["stack"]["modules"]["torch.cuda"] = [torch_cuda, None]
        rows = {r.check: r for r in evaluate(report, _target(home))}
        assert "import torch.cuda" not in rows
        return rows.get("cuda")

    assert check("13.0", "12.7") == (
        "cuda",
        "fail",
        "torch built for CUDA 13.0, driver runs CUDA 12.7: install a torch built for CUDA 12.x (or older)",
    )
    warn = check("12.8", "12.7")
    assert warn.status == "warn" and "minor-version compatibility" in warn.detail
    assert check("12.6", "12.7") == ("cuda", "ok", "torch built for CUDA 12.6, driver runs CUDA 12.7")
    assert check("12.10", "12.9").status == "warn"  # 10 > 9 as numbers, not as text
    assert check("None", "12.7") is None and check("12.6", None) is None  # a CPU torch, or no driver


def test_no_gpu_is_said_plainly_not_failed(home):
    rows = evaluate(_report({"count": 0, "error": "NVML unavailable: x", "devices": []}, home), _target(home))
    (gpu,) = [r for r in rows if r.check == "gpus"]
    assert gpu.status == "warn" and gpu.detail.startswith("no GPU on n1")
    assert not any(r.status == "fail" for r in rows)


def test_no_sbatch_is_one_line(home):
    proc = hpcrl(home, "preflight", "--cluster", "pf-test", path=str(home / "empty-bin"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == (
        "hpcrl: error: hpcrl needs a Slurm login node (sbatch not found on PATH) "
        "— or the local dev cluster: scripts/dev-slurm up"
    )


def test_preflight_through_submitit_reports_no_gpu(slurm, home):
    """The probe runs on a compute node of the local cluster (local-dev: declared GPUs, no hardware)."""
    model = home / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (home / "run.yaml").write_text(
        f"hpcrl:\n  cluster: local-dev\n  nodes: 1\n  run_root: {home}/runs\n  workdir: {home}\n"
        f"  python: {sys.executable}\nmodel_name_or_path: {model}\n"
    )
    proc = hpcrl(home, "preflight", "--config", str(home / "run.yaml"), "--folder", str(home / "submitit"), "--json")
    assert proc.returncode == 1, proc.stderr  # the stack check fails (below): open-instruct is not installed here
    out = json.loads(proc.stdout)
    by = {c["check"]: c for c in out["checks"]}
    assert by["gpus"]["status"] == "warn" and re.match(rf"no GPU on {NODE}", by["gpus"]["detail"])
    assert "local-dev expects 4 x H200 (declared, none present)" in by["gpus"]["detail"]
    report = out["report"]
    assert report["node"] in slurm.nodes and report["job_id"].isdigit()
    assert report["cuda_visible_devices"] == "0,1,2,3"  # Slurm gave it the 4 declared GPUs
    # local-dev's node-local dir is /tmp/hpcrl-local/$SLURMD_NODENAME, expanded on the node
    assert report["node_local"]["path"] == f"/tmp/hpcrl-local/{report['node']}"
    assert by["node-local tmp"]["status"] == "ok"
    assert by["run root"]["status"] == "ok" and report["run_root"]["free_gib"] > 0
    assert report["run_root"]["path"] == f"{home}/runs"
    assert by["model"]["status"] == "ok" and str(model) in by["model"]["detail"]
    assert set(report["stack"]["modules"]) == {"torch", "vllm", "deepspeed", "ray", "open_instruct", "transformers"}
    # the job's own stack check for the run's backend: open-instruct e6c3044a asks Python 3.12 (pyproject.toml:6)
    # (this test's Python is not 3.12: a warning, as the job's tolerant check says it; the framework's own
    # import decides, docs/preflight.md)
    assert sys.version_info[:2] != (3, 12)
    detail = by["stack check"]["detail"]
    assert (
        by["stack check"]["status"],
        detail.startswith("python 3."),
        "; open-instruct e6c3044a asks for python==3.12.* (pyproject.toml:6 at e6c3044a)" in detail,
    ) == ("warn", True, True)
    assert out["cluster"] == "local-dev" and out["partition"] == "debug" and out["ok"] is False
    assert (home / "submitit").is_dir()  # --folder is kept
    # the table form, profile only, says the same thing in words
    table = hpcrl(home, "preflight", "--cluster", "local-dev")
    assert table.returncode == 0, table.stderr
    assert re.search(rf"no GPU on {NODE}", table.stdout) and "import torch" in table.stdout
