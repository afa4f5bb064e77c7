"""Lines the job's own processes write into the job's log arrive whole (hpcrl/runtime/job_log/__init__.py): with Python's
streams unbuffered (PYTHONUNBUFFERED=1, as container images often set) `print` wrote the text and the newline in
two calls, and another writer's line landed between them ("gpumon: no NVIDIA GPU found on c5n1hpcrl: phase
vllm_server", a fresh-clone CI run). Each test runs the real module with its stream unbuffered over a raw stream
that records every write call, as the pipe would receive them."""

from __future__ import annotations

import io
import sys

from hpcrl.runtime import gpumon, wait_http


class Calls(io.RawIOBase):
    """A raw stream that keeps each write call."""

    def __init__(self) -> None:
        self.calls: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:  # noqa: ANN001 - a bytes-like object
        self.calls.append(bytes(b))
        return len(b)


def unbuffered(monkeypatch, name: str) -> Calls:
    raw = Calls()
    # What PYTHONUNBUFFERED gives: no buffer, every write passed straight on.
    monkeypatch.setattr(sys, name, io.TextIOWrapper(raw, write_through=True))  # type: ignore[arg-type]
    return raw


def whole_lines(raw: Calls, needle: str) -> list[bytes]:
    found = [c for c in raw.calls if needle.encode() in c]
    assert found, raw.calls
    return found


def test_gpumons_no_gpu_line_is_one_write(monkeypatch, tmp_path):
    raw = unbuffered(monkeypatch, "stderr")
    monkeypatch.setattr(gpumon, "open_nvml", lambda: 0)  # no GPU here, as on the CI machine (stand-in: no NVML)
    assert gpumon.monitor(tmp_path / "gpu.csv", "head", 0.1, node="c5n1") == 0
    assert whole_lines(raw, "no NVIDIA GPU found") == [b"gpumon: no NVIDIA GPU found on c5n1\n"]


def test_wait_https_lines_are_one_write(monkeypatch):
    raw = unbuffered(monkeypatch, "stderr")
    dead = 2**22 + 12345  # above the kernel's pid_max default: no such process
    assert wait_http.wait("http://127.0.0.1:9/health", 5, dead, "vllm-server") == 1
    (line,) = whole_lines(raw, "vllm-server exited before it answered")
    assert line.endswith(b")\n")
