"""GPU monitor: a faked NVML handle in-process, and a real run on this GPU-less machine."""

from __future__ import annotations

import csv
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pynvml
import pytest

from hpcrl.runtime import gpumon

HEADER = [
    "timestamp",
    "node",
    "role",
    "gpu",
    "memory_used_mib",
    "memory_total_mib",
    "utilization_pct",
    "power_w",
    "mean_power_w",
    "flag",
]
MIB = 2**20


class FakeNVML:
    """Three GPUs: 0 idles at 50/70/90 W, 1 cannot report power, 2 works at 250 W."""

    def __init__(self, monkeypatch):
        self.round = 0
        self.shut = False
        for name in (
            "nvmlInit",
            "nvmlDeviceGetCount",
            "nvmlDeviceGetHandleByIndex",
            "nvmlDeviceGetMemoryInfo",
            "nvmlDeviceGetUtilizationRates",
            "nvmlDeviceGetPowerUsage",
            "nvmlShutdown",
        ):
            monkeypatch.setattr(pynvml, name, getattr(self, name))

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        self.shut = True

    def nvmlDeviceGetCount(self):
        return 3

    def nvmlDeviceGetHandleByIndex(self, i):
        return ("handle", i)

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(used=(40960 + 1024 * h[1]) * MIB, total=81920 * MIB, free=0)

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=[3, 0, 97][h[1]], memory=0)

    def nvmlDeviceGetPowerUsage(self, h):
        if h[1] == 1:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if h[1] == 0:
            self.round += 1
            return [50_000, 70_000, 90_000][self.round - 1]  # milliwatts
        return 250_000


def clock_every(seconds: float):
    t = {"now": 0.0}

    def clock():
        t["now"] += seconds
        return t["now"]

    return clock


def read(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    return rows[0], [dict(zip(rows[0], r)) for r in rows[1:]]


def test_rows_per_gpu_and_idle_warning_after_grace(tmp_path, monkeypatch, capsys):
    nvml = FakeNVML(monkeypatch)
    out = tmp_path / "gpu-{node}.csv"
    # Clock: start at 60 s, rounds at 120, 180, 240 s; grace 2 min -> rounds 2 and 3 are past it.
    rc = gpumon.monitor(
        out,
        "learner",
        5.0,
        node="n1",
        min_mean_power_w=100,
        grace_minutes=2,
        count=3,
        clock=clock_every(60.0),
        sleep=lambda s: None,
    )
    assert rc == 0 and nvml.shut
    header, rows = read(tmp_path / "gpu-n1.csv")
    assert header == HEADER
    assert len(rows) == 9  # 3 rounds x 3 GPUs
    g0 = [r for r in rows if r["gpu"] == "0"]
    assert [r["power_w"] for r in g0] == ["50.0", "70.0", "90.0"]
    assert [r["mean_power_w"] for r in g0] == ["50.0", "60.0", "70.0"]
    # 60 s after start: inside the grace period; 120 s and 180 s: past it, mean under 100 W.
    assert [r["flag"] for r in g0] == ["", "idle_risk", "idle_risk"]
    assert {r["node"] for r in rows} == {"n1"} and {r["role"] for r in rows} == {"learner"}
    assert g0[0]["memory_used_mib"] == "40960.0" and g0[0]["memory_total_mib"] == "81920.0"
    assert g0[0]["utilization_pct"] == "3.0"
    g1 = [r for r in rows if r["gpu"] == "1"]
    assert {r["power_w"] for r in g1} == {""} and {r["flag"] for r in g1} == {""}  # no power reading: no verdict
    g2 = [r for r in rows if r["gpu"] == "2"]
    assert {r["flag"] for r in g2} == {""} and g2[0]["memory_used_mib"] == "43008.0"
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "n1 GPU 0" in err[0] and "100 W" in err[0]  # warned once, not every sample


def test_no_threshold_means_no_flags(tmp_path, monkeypatch):
    FakeNVML(monkeypatch)
    gpumon.monitor(
        tmp_path / "g.csv", "engine", 1.0, node="n2", count=2, clock=clock_every(3600.0), sleep=lambda s: None
    )
    _, rows = read(tmp_path / "g.csv")
    assert len(rows) == 6 and {r["flag"] for r in rows} == {""}


def test_appends_without_a_second_header(tmp_path, monkeypatch):
    FakeNVML(monkeypatch)
    for _ in range(2):
        gpumon.monitor(tmp_path / "g.csv", "mixed", 1.0, node="n3", count=1, sleep=lambda s: None)
    lines = (tmp_path / "g.csv").read_text().splitlines()
    assert lines.count(",".join(HEADER)) == 1 and len(lines) == 1 + 6


def test_nvml_init_failure_is_a_gpu_less_node(tmp_path, monkeypatch, capsys):
    def fail():
        raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)

    monkeypatch.setattr(pynvml, "nvmlInit", fail)
    assert gpumon.monitor(tmp_path / "g.csv", "learner", 1.0, node="cpu1") == 0
    header, rows = read(tmp_path / "g.csv")
    assert header == HEADER and len(rows) == 1 and rows[0]["flag"] == "no_gpu_found"
    assert capsys.readouterr().err.strip() == "gpumon: no NVIDIA GPU found on cpu1"


def _nvml_available() -> bool:
    try:
        pynvml.nvmlInit()
        n = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
        return n > 0
    except pynvml.NVMLError:
        return False


@pytest.mark.skipif(_nvml_available(), reason="this machine has a GPU; the test is for GPU-less nodes")
def test_real_run_without_gpus(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "hpcrl.runtime.gpumon",
            "--out",
            str(tmp_path / "gpu-{node}.csv"),
            "--role",
            "engine",
            "--node",
            "nodeA",
            "--cluster",
            "berzelius",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip() == "gpumon: no NVIDIA GPU found on nodeA"
    header, rows = read(tmp_path / "gpu-nodeA.csv")
    assert header == HEADER
    assert [(r["node"], r["role"], r["flag"]) for r in rows] == [("nodeA", "engine", "no_gpu_found")]


@pytest.mark.skipif(_nvml_available(), reason="this machine has a GPU; the test is for GPU-less nodes")
def test_keep_running_until_signalled(tmp_path):
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hpcrl.runtime.gpumon",
            "--out",
            str(tmp_path / "g.csv"),
            "--keep-running",
            "--interval",
            "0.1",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    # Handshake: its one line comes after the CSV row and the signal handlers, just before it would return.
    assert proc.stderr.readline().startswith("gpumon: no NVIDIA GPU found")
    with pytest.raises(subprocess.TimeoutExpired):  # still up: without --keep-running it exits at once
        proc.wait(timeout=2)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0


def test_unknown_cluster_is_one_line(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "hpcrl.runtime.gpumon", "--out", str(tmp_path / "g.csv"), "--cluster", "nowhere"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1


class ProcNVML:
    """NVML faked (no GPU here), processes real: GPU i runs the real processes in procs[i]."""

    def __init__(self, monkeypatch, procs: list):
        self.procs = procs
        monkeypatch.setattr(pynvml, "nvmlInit", lambda: None)
        monkeypatch.setattr(pynvml, "nvmlShutdown", lambda: None)
        monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: len(procs))
        monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", lambda i: ("handle", i))
        monkeypatch.setattr(
            pynvml, "nvmlDeviceGetMemoryInfo", lambda h: SimpleNamespace(used=1024 * MIB, total=81920 * MIB, free=0)
        )
        monkeypatch.setattr(pynvml, "nvmlDeviceGetUtilizationRates", lambda h: SimpleNamespace(gpu=0, memory=0))
        monkeypatch.setattr(pynvml, "nvmlDeviceGetPowerUsage", lambda h: 100_000)
        monkeypatch.setattr(pynvml, "nvmlDeviceGetComputeRunningProcesses", self.running)

    def running(self, h):
        entry = self.procs[h[1]]
        if entry == "error":
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [SimpleNamespace(pid=pid, usedGpuMemory=512 * MIB) for pid in entry]


@pytest.fixture()
def named_processes():
    """Start real processes whose /proc cmdline is the given title (as Ray and vLLM set them)."""
    started = []

    def start(title: str) -> int:
        p = subprocess.Popen(["bash", "-c", f'exec -a "{title}" sleep 60'])
        started.append(p)
        for _ in range(100):  # until the exec has happened
            try:
                if open(f"/proc/{p.pid}/cmdline", "rb").read().startswith(title.encode()):
                    return p.pid
            except OSError:
                pass
            time.sleep(0.02)
        raise AssertionError(f"{title} did not start")

    yield start
    for p in started:
        p.kill()
        p.wait()


def test_roles_from_the_processes_on_each_gpu(tmp_path, monkeypatch, named_processes):
    learner = named_processes("ray::PolicyTrainerRayProcess.train")
    engine = named_processes("ray::LLMRayActor.generate")
    core = named_processes("VLLM::EngineCore")
    verl = named_processes("ray::WorkerDict.actor_rollout_generate_sequences")
    orlhf = named_processes("ray::ActorModelRayActor.fit")
    other = named_processes("python3 my_own_trainer.py")
    gone = 2**22 + 7  # above the default pid_max: no such process
    ProcNVML(monkeypatch, [[learner], [engine], [], [other], [learner, core], [verl], [gone], "error", [core], [orlhf]])
    rc = gpumon.monitor(
        tmp_path / "gpu-n1.csv",
        "mixed",
        5.0,
        node="n1",
        count=1,
        detect_roles=True,
        clock=clock_every(1.0),
        sleep=lambda s: None,
    )
    assert rc == 0
    _, rows = read(tmp_path / "gpu-n1.csv")
    assert [r["role"] for r in rows] == [
        "learner",
        "engine",
        "idle",
        "mixed",
        "mixed",
        "mixed",
        "mixed",
        "mixed",
        "engine",
        "learner",
    ]
    # without --detect-roles every GPU keeps the label, whatever runs on it
    rc = gpumon.monitor(
        tmp_path / "gpu-n2.csv", "head", 5.0, node="n2", count=1, clock=clock_every(1.0), sleep=lambda s: None
    )
    _, rows = read(tmp_path / "gpu-n2.csv")
    assert rc == 0 and {r["role"] for r in rows} == {"head"}


def test_an_unrecognised_gpu_keeps_the_node_label(tmp_path, monkeypatch, named_processes):
    other = named_processes("python3 my_own_trainer.py")
    ProcNVML(monkeypatch, [[other], [], "error"])
    gpumon.monitor(
        tmp_path / "gpu-n3.csv",
        "head",
        5.0,
        node="n3",
        count=1,
        detect_roles=True,
        clock=clock_every(1.0),
        sleep=lambda s: None,
    )
    _, rows = read(tmp_path / "gpu-n3.csv")
    assert [r["role"] for r in rows] == ["head", "idle", "head"]
