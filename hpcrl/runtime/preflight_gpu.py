"""What NVML says about this node's GPUs, for preflight: count, model, memory, ECC errors,
retired pages or remapped rows, clocks and throttle reasons.

Standard library at import time (pickled by value with the probe). Test hook: when
$HPCRL_PREFLIGHT_FAKE_NVML names a JSON file `{"nodes": {"<node>": {<what gpus() returns>}}}`
and this node is in it, that entry is returned in place of NVML's answer (with `"fake"` set
to the file), so a test can make one node of a real Slurm job look broken. Nodes not in the
file ask NVML as usual.
"""

from __future__ import annotations

import json
import os
import socket

GIB = 1024**3
# NVML's clock event ("throttle") reasons: a GPU that is slowed for one of these now is
# slowed for the run too. Idle, application clocks and sync boost are not faults.
THROTTLE_FAULTS = {
    0x4: "sw power cap",
    0x8: "hw slowdown",
    0x20: "sw thermal slowdown",
    0x40: "hw thermal slowdown",
    0x80: "hw power brake",
}


def node_name() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def _fake(path: str) -> dict | None:
    try:
        with open(path) as fh:
            data = json.load(fh)
    except (OSError, ValueError) as exc:
        return {"count": 0, "error": f"HPCRL_PREFLIGHT_FAKE_NVML {path}: {exc}", "devices": [], "fake": path}
    entry = (data.get("nodes") or {}).get(node_name())
    return None if entry is None else dict(entry, fake=path)


def _try(fn, *args):
    """NVML's answer, or None where the GPU does not support the query (or ECC is off)."""
    try:
        return fn(*args)
    except Exception:
        return None


def _device(pynvml, h) -> dict:
    name = pynvml.nvmlDeviceGetName(h)
    mem = pynvml.nvmlDeviceGetMemoryInfo(h)
    d = {
        "name": name.decode() if isinstance(name, bytes) else str(name),
        "memory_gib": round(mem.total / GIB, 1),
        "used_gib": round(mem.used / GIB, 1),
        "free_gib": round(mem.free / GIB, 1),
    }
    unc = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    d["ecc_uncorrected_volatile"] = _try(pynvml.nvmlDeviceGetTotalEccErrors, h, unc, pynvml.NVML_VOLATILE_ECC)
    d["ecc_uncorrected_aggregate"] = _try(pynvml.nvmlDeviceGetTotalEccErrors, h, unc, pynvml.NVML_AGGREGATE_ECC)
    rows = _try(pynvml.nvmlDeviceGetRemappedRows, h)  # Ampere and newer
    if rows is not None:
        d["remapped_rows"] = {
            "correctable": rows[0],
            "uncorrectable": rows[1],
            "pending": bool(rows[2]),
            "failure": bool(rows[3]),
        }
    else:  # older GPUs retire pages instead
        dbe = _try(pynvml.nvmlDeviceGetRetiredPages, h, pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
        sbe = _try(
            pynvml.nvmlDeviceGetRetiredPages, h, pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
        )
        pending = _try(pynvml.nvmlDeviceGetRetiredPagesPendingStatus, h)
        if dbe is not None or sbe is not None:
            d["retired_pages"] = {"double_bit": len(dbe or []), "single_bit": len(sbe or []), "pending": bool(pending)}
    d["sm_mhz"] = _try(pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_SM)
    d["sm_max_mhz"] = _try(pynvml.nvmlDeviceGetMaxClockInfo, h, pynvml.NVML_CLOCK_SM)
    get = (
        getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        or pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
    )
    mask = _try(get, h)
    d["throttle"] = None if mask is None else [why for bit, why in THROTTLE_FAULTS.items() if mask & bit]
    d["temperature_c"] = _try(pynvml.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU)
    return d


def gpus() -> dict:
    """GPUs NVML sees on this node (or the test hook's stand-in), or why there are none."""
    fake = os.environ.get("HPCRL_PREFLIGHT_FAKE_NVML")
    if fake and (entry := _fake(fake)) is not None:
        return entry
    try:
        import pynvml
    except ImportError as exc:
        return {"count": 0, "error": f"nvidia-ml-py not importable ({exc})", "devices": []}
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...
        return {"count": 0, "error": f"NVML unavailable: {exc}", "devices": []}
    try:
        devices = [_device(pynvml, pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(pynvml.nvmlDeviceGetCount())]
        try:  # the newest CUDA the driver runs, e.g. 12070 -> "12.7"
            v = int(pynvml.nvmlSystemGetCudaDriverVersion())
            driver_cuda = f"{v // 1000}.{v % 1000 // 10}"
        except Exception:
            driver_cuda = None
        return {"count": len(devices), "error": None, "devices": devices, "driver_cuda": driver_cuda}
    finally:
        pynvml.nvmlShutdown()


def main(argv: list[str] | None = None) -> int:
    """By hand on a node: print what NVML says of this node's GPUs, as JSON."""
    import argparse

    argparse.ArgumentParser(
        prog="python -m hpcrl.runtime.preflight_gpu",
        description="Preflight's GPU health check on this node: count, model, memory, ECC errors, remapped "
        "rows or retired pages, clocks and throttle reasons from NVML, printed as JSON (hpcrl preflight "
        "runs it on every node of its job). Test hook: $HPCRL_PREFLIGHT_FAKE_NVML.",
    ).parse_args(argv)
    print(json.dumps(gpus(), indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
