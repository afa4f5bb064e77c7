"""Preflight's verdicts: one node's probe report against the profile and plan, as rows of
(check, status, detail). Status is ok, warn, fail or info; only `fail` makes preflight exit 1.
Pure: numbers in, rows out (hpcrl/jobs/preflight.py runs the probe).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from hpcrl.profiles import ClusterProfile

MEMORY_TOLERANCE = 0.05  # NVML's total vs the profile's figure: drivers reserve a little
# Memory another process already holds on a GPU of a fresh allocation (a leftover job, a leak).
USED_MEMORY_WARN = 0.05
# A bf16 GEMM's share of the profile's dense peak: large square products reach ~60-80% on a
# healthy H100/A100 (assumed from vendor figures, not measured here); half is slow, a quarter broken.
GEMM_WARN, GEMM_FAIL = 0.5, 0.25
# Clock event reasons that are hardware faults (the rest, power cap and software thermal, warn).
THROTTLE_FAIL = ("hw slowdown", "hw thermal slowdown", "hw power brake")


class Check(NamedTuple):
    check: str
    status: str
    detail: str


class Target(NamedTuple):
    """Where the probe runs and what it looks for."""

    profile: ClusterProfile
    partition: str | None
    account: str | None
    qos: str | None
    spec: dict[str, Any]
    disk_need_gib: float | None
    notes: tuple[str, ...]
    exclude: tuple[str, ...] = ()  # nodes the job must avoid (profile, config, the user's list)


def _major_minor(text: str) -> tuple[int, int] | None:
    parts = text.split(".")
    try:
        return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    except ValueError:
        return None


def cuda_check(torch_cuda: str | None, driver_cuda: str | None) -> Check | None:
    """torch's CUDA build against the newest CUDA the node's driver runs: a newer major version
    cannot run (a cu130 wheel on a CUDA 12 driver); a newer minor version runs under CUDA's
    minor-version compatibility, except kernels compiled just in time from PTX."""
    if not torch_cuda or torch_cuda == "None" or not driver_cuda:
        return None
    built, driver = _major_minor(torch_cuda), _major_minor(driver_cuda)
    if built is None or driver is None:
        return None
    detail = f"torch built for CUDA {torch_cuda}, driver runs CUDA {driver_cuda}"
    if built[0] > driver[0]:
        return Check("cuda", "fail", f"{detail}: install a torch built for CUDA {driver[0]}.x (or older)")
    if built > driver:
        return Check(
            "cuda",
            "warn",
            f"{detail}: runs by minor-version compatibility; kernels JIT-compiled "
            "from PTX (Triton, FlashInfer) may fail",
        )
    return Check("cuda", "ok", detail)


def ray_check(version: str) -> Check:
    """Ray's version: below 2.52 it ignores RAY_AUTH_MODE=token, and the job script refuses to start it."""
    from hpcrl.contract import RAY_TOKEN_MIN

    got = _major_minor(version)
    need = ".".join(map(str, RAY_TOKEN_MIN))
    if got is not None and got < RAY_TOKEN_MIN:
        return Check(
            "import ray",
            "fail",
            f"{version}: Ray below {need} ignores token authentication (anyone on the "
            f"node could attach); the job script refuses it: install ray>={need}",
        )
    return Check("import ray", "ok", f"{version} (token authentication needs >= {need})")


def gpu_health(devs: list[dict]) -> list[Check]:
    """ECC errors, remapped rows / retired pages, throttling and memory held by others, per GPU."""
    bad, warn = [], []
    for i, d in enumerate(devs):
        g = f"GPU {i}"
        if d.get("ecc_uncorrected_volatile"):
            bad.append(f"{g}: {d['ecc_uncorrected_volatile']} uncorrected ECC errors since the last reset")
        elif d.get("ecc_uncorrected_aggregate"):
            warn.append(f"{g}: {d['ecc_uncorrected_aggregate']} uncorrected ECC errors in its lifetime")
        rr = d.get("remapped_rows") or {}
        if rr.get("failure"):
            bad.append(f"{g}: row remapping failed (the GPU needs service)")
        elif rr.get("pending"):
            bad.append(f"{g}: a row remap is pending (the GPU needs a reset)")
        elif rr.get("uncorrectable"):
            warn.append(f"{g}: {rr['uncorrectable']} rows remapped for uncorrectable errors")
        rp = d.get("retired_pages") or {}
        if rp.get("pending"):
            bad.append(f"{g}: a page retirement is pending (the GPU needs a reset)")
        elif rp.get("double_bit"):
            warn.append(f"{g}: {rp['double_bit']} pages retired for double-bit errors")
    rows = [
        Check(
            "gpu memory errors",
            "fail" if bad else "warn" if warn else "ok",
            "; ".join(bad + warn) or f"no uncorrected ECC errors, remap or retirement pending on {len(devs)} GPUs",
        )
    ]
    slow = [(i, why) for i, d in enumerate(devs) for why in (d.get("throttle") or [])]
    clocks = [
        f"{d['sm_mhz']}/{d['sm_max_mhz']} MHz" for d in devs if d.get("sm_mhz") is not None and d.get("sm_max_mhz")
    ]
    if slow:
        status = "fail" if any(why in THROTTLE_FAIL for _, why in slow) else "warn"
        rows.append(Check("gpu clocks", status, "; ".join(f"GPU {i}: {why}" for i, why in slow)))
    else:
        rows.append(
            Check(
                "gpu clocks", "ok", "no throttle reason" + (f"; SM {', '.join(sorted(set(clocks)))}" if clocks else "")
            )
        )
    held = [
        f"GPU {i}: {d['used_gib']:.1f} of {d['memory_gib']:.1f} GiB in use"
        for i, d in enumerate(devs)
        if d.get("memory_gib") and d.get("used_gib", 0) > USED_MEMORY_WARN * d["memory_gib"]
    ]
    rows.append(
        Check(
            "gpu free memory",
            "warn" if held else "ok",
            "; ".join(held) + " (another process?)" if held else "no GPU memory held by other processes",
        )
    )
    return rows


def gemm_check(gemm: list[dict], p: ClusterProfile) -> Check | None:
    """The bf16 GEMM's TFLOP/s per GPU (torch, in the job) against the profile's dense peak."""
    if not gemm:
        return None
    worst = min(gemm, key=lambda g: g["tflops"])
    share = worst["tflops"] / p.gpu.bf16_tflops if p.gpu.bf16_tflops else 1.0
    detail = (
        f"slowest GPU {worst['gpu']}: {worst['tflops']:.0f} TFLOP/s bf16 = {share:.0%} of the profile's "
        f"{p.gpu.bf16_tflops:g}; all: " + ", ".join(f"{g['tflops']:.0f}" for g in gemm)
    )
    return Check("gemm", "fail" if share < GEMM_FAIL else "warn" if share < GEMM_WARN else "ok", detail)


def stack_rows(result: dict | None) -> list[Check]:
    """The job's own stack check (hpcrl/runtime/stack.py) as the job would run it: its first line
    is the verdict (fail on a mismatch), the rest notes."""
    if not result:
        return []
    from hpcrl.runtime.stack import STACK_MISMATCH_EXIT

    first, *rest = [line.removeprefix("stack: ") for line in result["lines"]]
    status = "ok" if result["rc"] == 0 else "fail" if result["rc"] == STACK_MISMATCH_EXIT else "warn"
    return [
        Check("stack check", status, first),
        *(
            Check("stack check", "warn", n.removeprefix("warning: "))
            if n.startswith("warning: ")
            else Check("note", "info", f"stack check: {n.removeprefix('note: ')}")
            for n in rest
        ),
    ]


def evaluate(report: dict, t: Target) -> list[Check]:
    """The probe's report against the profile and plan."""
    p, rows = t.profile, []
    node = report.get("node", "?")
    rows.append(Check("node", "info", f"{node} (job {report.get('job_id')}, Python {report.get('python')})"))
    g = report["gpus"]
    want = f"{p.gpu.count_per_node} x {p.gpu.model} {p.gpu.memory_gib:.0f} GiB"
    if g["count"] == 0:
        why = f" ({g['error']})" if g.get("error") else ""
        rows.append(Check("gpus", "warn", f"no GPU on {node}{why}; profile {p.name} expects {want}"))
    else:
        devs = g["devices"]
        names = sorted({d["name"] for d in devs})
        mem = min(d["memory_gib"] for d in devs)
        problems = []
        if g["count"] < p.gpu.count_per_node:
            problems.append(f"{g['count']} GPUs, profile expects {p.gpu.count_per_node}")
        if mem < p.gpu.memory_gib * (1 - MEMORY_TOLERANCE):
            problems.append(f"{mem:.1f} GiB per GPU, profile assumes {p.gpu.memory_gib:.1f}")
        model_ok = any(p.gpu.model.lower().replace("-", " ") in n.lower().replace("-", " ") for n in names)
        detail = f"{g['count']} x {', '.join(names)} {mem:.1f} GiB; profile {want}"
        status = "fail" if problems else ("ok" if model_ok else "warn")
        rows.append(Check("gpus", status, "; ".join(problems) + f" ({detail})" if problems else detail))
        rows += gpu_health(devs)
    if g.get("fake"):
        rows.append(
            Check("note", "info", f"GPU facts from the test hook HPCRL_PREFLIGHT_FAKE_NVML ({g['fake']}), not NVML")
        )
    coll = report.get("collective") or {}
    gemm = gemm_check([x for x in coll.get("gemm", []) if x.get("node", node) == node], p)
    if gemm:
        rows.append(gemm)
    nl = report["node_local"]
    if nl.get("error"):
        rows.append(Check("node-local tmp", "fail", f"{nl.get('path')}: {nl['error']}"))
    else:
        ok = nl.get("writable")
        where = "" if nl.get("exists") else f" (not there yet; the job creates it in {nl['checked']})"
        rows.append(
            Check(
                "node-local tmp",
                "ok" if ok else "fail",
                f"{nl['path']}: {nl['free_gib']:.1f} GiB free" + where + ("" if ok else ", not writable"),
            )
        )
    rr = report["run_root"]
    if rr.get("error"):
        rows.append(Check("run root", "fail", f"{rr.get('path')}: {rr['error']}"))
    else:
        need = t.disk_need_gib
        status = "ok" if rr.get("writable") else "fail"
        detail = f"{rr['path']}: {rr['free_gib']:.1f} GiB free of {rr['total_gib']:.1f}"
        if not rr.get("exists"):
            detail += f" (not created yet; checked {rr['checked']})"
        if need is not None:
            detail += f"; plan needs {need:.1f} GiB"
            if rr["free_gib"] < need:
                status = "fail"
        else:
            detail += "; plan's disk need not known"
        rows.append(Check("run root", status, detail + ("" if rr.get("writable") else ", not writable")))
    m = report["model"]
    if not m.get("model"):
        rows.append(Check("model", "info", "not checked (pass --config RUN.yaml)"))
    else:
        rows.append(
            Check(
                "model",
                "ok" if m["found"] else ("fail" if m.get("kind") == "path" else "warn"),
                f"{m['model']}: {m['detail']}",
            )
        )
    st = report["stack"]
    if st.get("error"):
        rows.append(Check("imports", "fail", st["error"]))
    modules = dict(st.get("modules", {}))
    torch_cuda = (modules.pop("torch.cuda", None) or [None])[0]
    for name, (version, err) in modules.items():
        rows.append(
            ray_check(version)
            if name == "ray" and version
            else Check(f"import {name}", "ok" if version else "warn", version or err)
        )
    cuda = cuda_check(torch_cuda, g.get("driver_cuda"))
    if cuda:
        rows.append(cuda)
    rows += stack_rows(report.get("stack_check"))
    rows += [Check("note", "info", n) for n in t.notes]
    return rows
