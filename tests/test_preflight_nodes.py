"""Multi-node preflight: GPU health verdicts, bus bandwidth, the exclude list, and 3 nodes of the
local Slurm with one node made to fail through the fake-NVML test hook (a file the probe reads
in place of NVML: local-dev has no GPU, so NVML itself cannot be made to fail)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path


from helpers import ROOT, collective_result, free_port, start_collective, submit, wait_for_state
from hpcrl.jobs.preflight_checks import Check, gemm_check, gpu_health
from hpcrl.jobs.preflight_fabric import bus_bandwidth, collective_summary
from hpcrl.profiles import load_profile


def hpcrl(data: Path, *args: str, extra: dict | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HPCRL_")}
    env.update(HPCRL_DATA_DIR=str(data), NO_COLOR="1", COLUMNS="250", **(extra or {}))
    return subprocess.run(
        [sys.executable, "-m", "hpcrl", *args], env=env, capture_output=True, text=True, timeout=900, cwd=data.parent
    )


def _gpu(**kw) -> dict:
    d = {
        "name": "NVIDIA H100 80GB HBM3",
        "memory_gib": 79.2,
        "used_gib": 0.5,
        "free_gib": 78.7,
        "ecc_uncorrected_volatile": 0,
        "ecc_uncorrected_aggregate": 0,
        "remapped_rows": {"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False},
        "sm_mhz": 1980,
        "sm_max_mhz": 1980,
        "throttle": [],
    }
    d.update(kw)
    return d


def test_bus_bandwidth_uses_nccl_tests_factors():
    # 8 GB in 2 s is 4 GB/s algbw; 4 ranks: all-reduce x 2*3/4 = 6, all-gather x 3/4 = 3
    out = bus_bandwidth(
        [{"op": "all_reduce", "bytes": 8e9, "time_s": 2.0}, {"op": "all_gather", "bytes": 8e9, "time_s": 2.0}], 4
    )
    assert [(r["algbw_gbs"], r["busbw_gbs"]) for r in out] == [(4.0, 6.0), (4.0, 3.0)]


def test_gpu_health_verdicts():
    healthy = {r.check: r for r in gpu_health([_gpu(), _gpu()])}
    assert [r.status for r in healthy.values()] == ["ok", "ok", "ok"]
    rows = {r.check: r for r in gpu_health([_gpu(), _gpu(ecc_uncorrected_volatile=3)])}
    assert rows["gpu memory errors"] == Check(
        "gpu memory errors", "fail", "GPU 1: 3 uncorrected ECC errors since the last reset"
    )
    pending = _gpu(remapped_rows={"correctable": 0, "uncorrectable": 1, "pending": True, "failure": False})
    assert "GPU 0: a row remap is pending" in gpu_health([pending])[0].detail
    assert gpu_health([_gpu(ecc_uncorrected_aggregate=2)])[0].status == "warn"  # in the past, not since reset
    assert gpu_health([_gpu(retired_pages={"double_bit": 0, "single_bit": 0, "pending": True})])[0].status == "fail"
    clocks = {r.check: r for r in gpu_health([_gpu(throttle=["sw power cap"]), _gpu(throttle=["hw slowdown"])])}
    assert clocks["gpu clocks"].status == "fail" and "GPU 1: hw slowdown" in clocks["gpu clocks"].detail
    assert {r.check: r for r in gpu_health([_gpu(throttle=["sw power cap"])])}["gpu clocks"].status == "warn"
    held = {r.check: r for r in gpu_health([_gpu(used_gib=20.0)])}["gpu free memory"]
    assert held.status == "warn" and "GPU 0: 20.0 of 79.2 GiB in use" in held.detail


def test_gemm_against_the_profile_peak():
    p = load_profile("local-dev")  # 989 TFLOP/s declared
    assert gemm_check([{"gpu": 0, "tflops": 700.0}], p).status == "ok"
    slow = gemm_check([{"gpu": 0, "tflops": 700.0}, {"gpu": 1, "tflops": 400.0}], p)
    assert slow.status == "warn" and slow.detail.startswith("slowest GPU 1: 400 TFLOP/s bf16 = 40% of")
    assert gemm_check([{"gpu": 0, "tflops": 200.0}], p).status == "fail"
    assert gemm_check([], p) is None


def test_collective_summary_names_the_slowest_and_missing():
    first = {
        "method": "tcp-ring",
        "world": 3,
        "nodes": ["a", "b", "c"],
        "verified": True,
        "error": None,
        "results": [{"op": "all_reduce", "bytes": 3 << 20, "time_s": 0.01}],
        "p2p": [
            {"node": "a", "from_node": "c", "gbs": 10.0},
            {"node": "b", "from_node": "a", "gbs": 2.0},
            {"node": "c", "from_node": "b", "gbs": 9.0},
        ],
    }
    s = collective_summary(first, ["a", "b", "c"])
    assert s["slowest_node"] == "b"
    slow = [c for c in s["checks"] if c["check"] == "slowest node"][0]
    assert slow["status"] == "warn" and slow["detail"].startswith("b receives from a at 2.00 GB/s")
    missing = collective_summary(
        {"method": None, "role": "first", "missing": ["c"], "error": "node(s) c did not join"}, ["a", "b", "c"]
    )
    assert missing["missing"] == ["c"] and missing["checks"][0]["status"] == "fail"


def _run_collective(ranks: list[int], n: int, port: int, timeout: float) -> list[dict]:
    procs = [start_collective(r, n, port, timeout) for r in ranks]
    return [collective_result(p) for p in procs]


def test_tcp_ring_verifies_and_a_missing_node_is_named():
    first = _run_collective([0, 1, 2], 3, free_port(), 60)[0]
    assert first["method"] == "tcp-ring" and first["verified"] is True and first["error"] is None
    assert {(r["op"], r["bytes"]) for r in first["results"]} == {
        (op, b - b % 3) for op in ("all_reduce", "all_gather") for b in (1 << 16, 1 << 20)
    }
    assert sorted(p["node"] for p in first["p2p"]) == ["n1", "n2", "n3"]
    # node n3 never starts: the first node names it after the rendezvous timeout
    first, second = _run_collective([0, 1], 3, free_port(), 3)
    assert first["missing"] == ["n3"] and "n3 did not join" in first["error"]
    assert second["error"] == first["error"]


def test_exclude_list_commands(tmp_path):
    data = tmp_path / "data"
    out = hpcrl(data, "clusters", "exclude", "-c", "local-dev", "--add", "n4", "--reason", "bad HCA", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [
        {
            "cluster": "local-dev",
            "file": str(data / "exclude" / "local-dev.txt"),
            "nodes": [{"node": "n4", "reason": "bad HCA"}],
        }
    ]
    bad = hpcrl(data, "clusters", "exclude", "-c", "local-dev", "--add", "n1;rm")
    assert bad.returncode == 2 and bad.stderr.startswith("hpcrl: error: node 'n1;rm': not a Slurm node name")
    gone = hpcrl(data, "clusters", "exclude", "-c", "local-dev", "--remove", "n9")
    assert gone.returncode == 2 and "'n9' is not on local-dev's exclude list" in gone.stderr
    script = hpcrl(data, "render", "--cluster", "local-dev", "--nodes", "3", "--config", "grpo-olmo3-7b").stdout
    assert "#SBATCH --exclude=n4\n" in script
    assert f"# Excluded by {data}/exclude/local-dev.txt: n4 (hpcrl clusters exclude" in script
    merged = hpcrl(
        data,
        "render",
        "--cluster",
        "local-dev",
        "--nodes",
        "3",
        "--config",
        "grpo-olmo3-7b",
        "--set",
        "hpcrl.exclude_nodes=[n1, n4]",
    ).stdout  # the config's own first, each node once
    assert "#SBATCH --exclude=n1,n4\n" in merged and "RENDERED_EXCLUDE=n1,n4\n" in merged
    assert hpcrl(data, "clusters", "exclude", "-c", "local-dev", "--clear").returncode == 0
    script = hpcrl(data, "render", "--cluster", "local-dev", "--nodes", "3", "--config", "grpo-olmo3-7b").stdout
    assert "--exclude" not in script.split("set -euo pipefail")[0] and "# Excluded by" not in script


def test_three_nodes_one_made_to_fail(slurm, tmp_path):
    """3 nodes of the real local Slurm: the collective runs (TCP ring: no torch here) and reports a
    bandwidth; n2, given uncorrected ECC errors by the fake-NVML hook, is named, written to the
    exclude list and excluded by the next render. n4 is excluded first so the job lands on n1-n3
    (the cluster's four nodes in order: cKn1.. on a private instance)."""
    n1, n2, n3, n4 = slurm.usable[:4]
    data = tmp_path / "data"
    assert hpcrl(data, "clusters", "exclude", "-c", "local-dev", "--add", n4).returncode == 0
    fake = tmp_path / "nvml.json"
    broken = [
        {
            "name": "NVIDIA H200",
            "memory_gib": 139.8,
            "used_gib": 0.4,
            "free_gib": 139.4,
            "ecc_uncorrected_volatile": 2 if i == 1 else 0,
            "throttle": [],
        }
        for i in range(4)
    ]
    fake.write_text(json.dumps({"nodes": {n2: {"count": 4, "error": None, "devices": broken}}}))
    proc = hpcrl(
        data,
        "preflight",
        "--cluster",
        "local-dev",
        "--nodes",
        "3",
        "--json",
        "--write-exclude",
        extra={"HPCRL_PREFLIGHT_FAKE_NVML": str(fake)},
    )
    assert proc.returncode == 1, proc.stderr
    out = json.loads(proc.stdout)
    assert sorted(n["node"] for n in out["nodes"]) == [n1, n2, n3] and out["excluded_from_job"] == [n4]
    assert out["failing_nodes"] == [n2] and out["ok"] is False
    bad = next(n for n in out["nodes"] if n["node"] == n2)
    assert bad["why"] == "gpu memory errors: GPU 1: 2 uncorrected ECC errors since the last reset"
    assert all(n["status"] == "warn" for n in out["nodes"] if n["node"] != n2)  # no GPU: said, not failed
    coll = out["collective"]
    assert coll["method"] == "tcp-ring" and coll["world"] == 3 and coll["verified"] is True
    assert {r["op"] for r in coll["results"]} == {"all_reduce", "all_gather"}
    assert all(r["busbw_gbs"] > 0 for r in coll["results"]) and coll["slowest_node"] in {n1, n2, n3}
    assert out["exclude"]["added"] == [n2] and out["exclude"]["nodes"] == [n4, n2]
    listed = json.loads(hpcrl(data, "clusters", "exclude", "-c", "local-dev", "--json").stdout)[0]["nodes"]
    assert listed[1]["node"] == n2 and listed[1]["reason"].startswith(f"preflight job {out['job_id']}: gpu memory")
    script = hpcrl(data, "render", "--cluster", "local-dev", "--nodes", "2", "--config", "grpo-olmo3-7b").stdout
    assert f"#SBATCH --exclude={n4},{n2}\n" in script
    assert_documented(out)


def assert_documented(out: dict) -> None:
    """Every key of preflight --json (top level, per node, collective, its results) is named in docs/preflight.md."""
    doc = (ROOT / "docs" / "preflight.md").read_text().split("## JSON", 1)[1]
    keys = set(out) | {k for n in out["nodes"] for k in n} | set(out["collective"])
    keys |= {k for r in out["collective"]["results"] + out["collective"]["p2p"] for k in r}
    missing = sorted(k for k in keys if f"`{k}`" not in doc)
    assert not missing, f"undocumented --json keys: {missing}"


def test_json_keys_are_documented():
    from hpcrl.jobs.preflight_checks import Target
    from hpcrl.jobs.preflight_fabric import summarize

    out = summarize(
        [],
        Target(load_profile("local-dev"), "debug", None, None, {}, None, ()),
        [{"task": 0, "node": None, "why": "x"}],
        "1",
    )
    first = {
        "method": "tcp-ring",
        "world": 2,
        "nodes": ["a", "b"],
        "verified": True,
        "error": None,
        "results": [{"op": "all_reduce", "bytes": 2, "time_s": 1.0}],
        "p2p": [{"node": "a", "rank": 0, "from_node": "b", "bytes": 2, "gbs": 1.0}],
    }
    out["collective"] = collective_summary(first, ["a", "b"])
    assert_documented(out)


def test_a_task_without_a_report_names_its_node_when_another_reported():
    """The probe of task 1 died (its node named by Slurm's node list): that node fails and goes on
    the exclude list's candidates; when no task reported at all, the job failed, not a node."""
    from hpcrl.jobs.preflight_checks import Target
    from hpcrl.jobs.preflight_fabric import summarize
    from hpcrl.runtime.preflight_probe import probe

    t = Target(load_profile("local-dev"), "debug", None, None, {}, None, ())
    report = dict(probe({}), node="n1")  # a real report, taken on this machine
    out = summarize([report], t, [{"task": 1, "node": "n2", "why": "killed by signal 9"}], "5")
    assert "n2" in out["failing_nodes"] and not out["ok"]
    assert {"node": "n2", "status": "fail", "why": "the probe did not report: killed by signal 9"} in out["nodes"]
    none = summarize([], t, [{"task": 0, "node": "n1", "why": "x"}, {"task": 1, "node": None, "why": "y"}], "5")
    assert none["failing_nodes"] == [] and not none["ok"]
    assert [n["node"] for n in none["nodes"]] == ["n1", "task 1"]


def test_job_nodes_is_the_task_order(slurm, tmp_path):
    """slurm.job_nodes lists a job's nodes in the order its tasks (one per node) land on them,
    which is how preflight names the node of a task that gave no report."""
    from hpcrl.jobs import slurm as hslurm

    n1, n2, n3, n4 = slurm.usable[:4]
    script = tmp_path / "order.sh"
    script.write_text(
        "#!/bin/bash\n#SBATCH --nodes=3\n#SBATCH --ntasks-per-node=1\n#SBATCH --time=00:02:00\n"
        f"#SBATCH --output={tmp_path}/order-%j.out\n"
        "srun bash -c 'echo task=$SLURM_PROCID node=$SLURMD_NODENAME'\nsleep 5\n"
    )
    job = submit(script, f"--nodelist={n4},{n2},{n3}")
    wait_for_state(job, {"RUNNING", "COMPLETED"}, 120)
    names = hslurm.job_nodes(job)
    wait_for_state(job, {"COMPLETED"}, 120)
    out = (tmp_path / f"order-{job}.out").read_text()
    tasks = dict(re.findall(r"^task=(\d+) node=(\S+)$", out, re.M))
    assert names == [tasks[str(i)] for i in range(3)] and sorted(names) == [n2, n3, n4], (names, out)
    assert hslurm.job_nodes("999999999") == []
