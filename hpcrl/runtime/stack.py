"""The job's stack check: can the training environment run the plan's framework?

    python3 -m hpcrl.runtime.stack --expect EXPECT [--python WORD ...] [--entry ENTRY] [--no-parse]
                                   [--probe-timeout S] [-- DRIVER ARGS...]

EXPECT is the JSON (inline, or a file) hpcrl.planning.backends.stack_expect writes for the run: the
release the plan targets and the install facts of every release hpcrl has read of that framework.
In seconds and before Ray starts: the versions of the framework and its stack, read from the
training Python's installed metadata (importlib.metadata and find_spec, in a subprocess of that
Python: nothing is imported, so a broken torch cannot hang the check); the CUDA the installed torch
was built for (torch/version.py read as text) against the newest CUDA the node's driver runs
(libcuda's cuDriverGetVersion through ctypes, else nvidia-smi; a node without a driver is skipped
with a note); then, unless --no-parse, the driver's command line parsed by the installed framework
itself (hpcrl/runtime/stack_parse.py, in the training Python, with the expectation's timeout).

The installed release picks its table: its own, else the nearest of its minor, else the nearest older one,
with a warning naming it. It stops (exit STACK_MISMATCH_EXIT, one line `stack: ...`) only for what would stop
the job: a package the framework imports is missing, the framework rejects the driver's arguments, the CUDA
driver cannot run the installed torch, or hpcrl's own floor (Ray's token authentication) is not met. A
framework's pin the environment misses is a warning (the framework's own import decides). A Python that
cannot be probed (no answer within --probe-timeout, a crash, no probe answer in its output) is "the check
could not run" (exit STACK_UNCHECKED_EXIT), never a mismatch. Standard library only, no hpcrl import:
`hpcrl preflight` and `hpcrl check-stack` run this file's text where hpcrl may be missing.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile

# The job's end reason `stack-mismatch`: never continued (the environment will not fix itself).
# 90-97 are the watchdog's breakers and the script's Ray ends, 127 a missing command.
STACK_MISMATCH_EXIT = 98
# The check could not run (the training Python did not answer the probe): the job goes on without it.
STACK_UNCHECKED_EXIT = 99
# How long the training Python may take to answer the probe (a cold shared file system can take tens of
# seconds to start a Python): 60 s, or HPCRL_STACK_PROBE_TIMEOUT in the job's environment; --probe-timeout wins.
PROBE_TIMEOUT_S = float(os.environ.get("HPCRL_STACK_PROBE_TIMEOUT") or 60.0)
PARSE_REJECTED = 10  # stack_parse.py's exit code when the framework rejects the arguments
# The probe's answer is the line after this marker: a Python that prints around it (a sitecustomize,
# a module's banner) does not hide it.
PROBE_MARKER = "HPCRL-STACK-PROBE "

_VERSION = re.compile(
    r"^\s*v?(\d+(?:\.\d+)*)(?:[-_.]?(a|b|c|rc|alpha|beta|pre|preview)[-_.]?(\d*))?"
    r"(?:[-_.]?(post|rev|r)[-_.]?(\d*))?(?:[-_.]?(dev)[-_.]?(\d*))?(?:\+(\S*))?\s*$",
    re.I,
)
_PHASE = {"dev": 0, "a": 1, "alpha": 1, "b": 2, "beta": 2, "c": 3, "rc": 3, "pre": 3, "preview": 3}


def parse_version(text: str) -> tuple | None:
    """A PEP 440 version as a comparable key (release, phase, number, post); the +local label is
    ignored, as `==` does; None for text that is no version."""
    m = _VERSION.match(str(text))
    if not m:
        return None
    release = tuple(int(x) for x in m.group(1).split("."))
    release = release + (0,) * (6 - len(release))
    if m.group(2):
        phase = (_PHASE[m.group(2).lower()], int(m.group(3) or 0))
    elif m.group(6):
        phase = (0, int(m.group(7) or 0))  # X.Y.devN sorts before X.YaN
    else:
        phase = (4, 0)
    post = int(m.group(5) or 0) if m.group(4) else -1
    dev_after = int(m.group(7) or 0) if (m.group(6) and (m.group(2) or m.group(4))) else 1 << 30
    return release, phase, post, dev_after


def satisfies(version: str, spec: str) -> bool | None:
    """Whether `version` meets a comma-separated PEP 440 subset (==, !=, >=, <=, >, <, ==X.Y.*);
    None when the version cannot be read."""
    have = parse_version(version)
    if have is None:
        return None
    for clause in filter(None, (c.strip() for c in spec.split(","))):
        m = re.match(r"^(==|!=|>=|<=|>|<|~=)\s*(\S+)$", clause)
        if not m:
            raise ValueError(f"specifier {clause!r}: use ==, !=, >=, <=, >, < or ==X.Y.*")
        op, text = m.groups()
        if text.endswith(".*"):  # a prefix: the release's first numbers, whatever the phase
            prefix = tuple(int(x) for x in text[:-2].split("."))
            same = have[0][: len(prefix)] == prefix
            if (op == "==" and not same) or (op == "!=" and same):
                return False
            continue
        want = parse_version(text)
        if want is None:
            raise ValueError(f"specifier {clause!r}: {text!r} is no version")
        if op == "~=":
            n = len(text.split("+")[0].split("."))
            op_ok = have >= want and have[0][: n - 1] == want[0][: n - 1]
        else:
            op_ok = {
                "==": have[:3] == want[:3],
                "!=": have[:3] != want[:3],
                ">=": have >= want,
                "<=": have <= want,
                ">": have > want,
                "<": have < want,
            }[op]
        if not op_ok:
            return False
    return True


# ---- which of hpcrl's tables the installed release is checked against --------------------------------


def pick_table(tables: list[dict], installed: str | None) -> tuple[dict | None, str]:
    """(the table of `tables` (each with `version`, the release its framework declares) that an installed
    `installed` is read with, how): 'exact', 'same-minor' (the nearest patch), 'older' (the nearest older
    release), 'oldest' (older than all hpcrl read), or 'unknown' (no readable version: None)."""
    have = parse_version(installed) if installed else None
    keyed: list[tuple[tuple, dict]] = [
        (key, t) for t in tables if t.get("version") and (key := parse_version(t["version"])) is not None
    ]
    if have is None or not keyed:
        return None, "unknown"
    for key, t in keyed:
        if key[0][:3] == have[0][:3] and (key[1] == (4, 0)) == (have[1] == (4, 0)):
            return t, "exact"
    same = [(key, t) for key, t in keyed if key[0][:2] == have[0][:2]]
    if same:  # the nearest patch; on a tie the older table

        def distance(kt: tuple) -> tuple:
            return abs(kt[0][0][2] - have[0][2]), kt[0] > have

        return min(same, key=distance)[1], "same-minor"
    older = [(key, t) for key, t in keyed if key <= have]
    if older:
        return max(older, key=lambda kt: kt[0])[1], "older"
    return min(keyed, key=lambda kt: kt[0])[1], "oldest"


def release_line(framework: str, installed: str, table: dict, how: str, target: str) -> str | None:
    """The warning a release other than the plan's target earns (None: it is the target's)."""
    label = table["label"]
    render = (
        (
            f"; the plan targets {framework} {target}: render with hpcrl.framework_version={table['name']} "
            f"to plan for {label}"
        )
        if label != target
        else ""
    )
    if how == "exact":
        return f"{framework} {installed} installed, a release hpcrl has read ({label}){render}" if render else None
    if how == "same-minor":
        return (
            f"{framework} {installed} installed, a patch release hpcrl has not read: checked against {label}, "
            f"the nearest of the same minor release{render}"
        )
    if how == "older":
        return (
            f"{framework} {installed} installed, a release hpcrl has not read: checked against {label}, "
            f"the nearest older one it has{render}"
        )
    return (
        f"{framework} {installed} installed, older than every release hpcrl has read: checked against "
        f"{label}, the oldest{render}"
    )


# ---- what the training Python has (run there: `python stack.py --probe JSON`) -----------------------


def probe(packages: list[dict]) -> dict:
    """Python version, each package's distribution version, module location and VCS commit, and
    torch's CUDA build: from metadata and files, importing none of them."""
    import importlib.metadata as md
    import importlib.util

    if os.getcwd() not in sys.path:  # as `python -m` would: the framework's checkout is the workdir
        sys.path.insert(0, os.getcwd())
    out: dict = {"python": ".".join(map(str, sys.version_info[:3])), "executable": sys.executable, "packages": {}}
    for pkg in packages:
        entry: dict = {"version": None, "dist": None, "location": None, "commit": None}
        for dist_name in pkg.get("dists") or [pkg["name"]]:
            try:
                dist = md.distribution(dist_name)
            except md.PackageNotFoundError:
                continue
            entry["version"], entry["dist"] = dist.version, dist_name
            try:
                url = json.loads(dist.read_text("direct_url.json") or "{}")
                entry["commit"] = (url.get("vcs_info") or {}).get("commit_id")
            except ValueError:
                pass
            break
        try:
            spec = importlib.util.find_spec(pkg.get("module") or pkg["name"])  # top level: nothing is imported
        except (ImportError, ValueError):
            spec = None
        if spec is not None:
            entry["location"] = next(iter(spec.submodule_search_locations or []), spec.origin)
        out["packages"][pkg["name"]] = entry
    torch = out["packages"].get("torch") or {}
    out["torch_cuda"] = torch_cuda(torch.get("location"), torch.get("version"))
    return out


def torch_cuda(location: str | None, version: str | None) -> str | None:
    """The CUDA the installed torch was built for: torch/version.py read as text, else the wheel's
    +cuXYZ label; None for a CPU build or no torch."""
    if location:
        try:
            with open(os.path.join(location, "version.py")) as fh:
                m = re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"]([\d.]+)['\"]", fh.read(), re.M)
            if m:
                return m.group(1)
        except OSError:
            pass
    m = re.search(r"\+cu(\d+)(\d)$", version or "")
    return f"{m.group(1)}.{m.group(2)}" if m else None


def driver_cuda() -> tuple[str | None, str]:
    """The newest CUDA this node's driver runs (e.g. '12.7'), and how it was read or why not."""
    import ctypes

    try:
        lib = ctypes.CDLL("libcuda.so.1")
        v = ctypes.c_int(0)
        if lib.cuDriverGetVersion(ctypes.byref(v)) == 0 and v.value:
            return f"{v.value // 1000}.{v.value % 1000 // 10}", "libcuda cuDriverGetVersion"
    except (OSError, AttributeError):
        pass
    try:
        text = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=20).stdout
        m = re.search(r"CUDA Version:\s*([\d.]+)", text)
        if m:
            return m.group(1), "nvidia-smi"
    except (OSError, subprocess.TimeoutExpired):
        pass
    return None, "no NVIDIA driver on this node (no libcuda.so.1, no nvidia-smi)"


def _major_minor(text: str) -> tuple[int, int]:
    parts = (text.split(".") + ["0"])[:2]
    return int(parts[0]), int(parts[1])


# ---- the verdict (pure: the expectation and what was found in, lines out) -----------------------------


def _needed(pkg: dict, argv: list[str]) -> bool:
    """A package with `when` is needed unless the driver's command line sets the key otherwise."""
    when = pkg.get("when")
    if not when:
        return True
    value = when.get("default")
    for word in argv:
        key, sep, text = word.lstrip("+").partition("=")
        if sep and key == when["key"]:
            value = {"true": True, "false": False}.get(text.strip().lower(), text)
    return value == when["is"]


def _found(name: str, got: dict) -> str:
    ver = got.get("version")
    if ver is None:
        return f"{name} (no distribution metadata, at {got['location']})"
    return f"{name} {ver}" + (f" ({got['commit'][:8]})" if got.get("commit") else "")


def all_packages(expect: dict) -> list[dict]:
    """Every package any table of the expectation names (what the probe reads), hpcrl's own last."""
    seen: dict[str, dict] = {}
    for table in [expect, *expect.get("tables", [])]:
        for pkg in table.get("packages", []):
            seen.setdefault(pkg["name"], pkg)
    for pkg in expect.get("hpcrl_packages", []):
        seen.setdefault(pkg["name"], pkg)
    return list(seen.values())


def chosen_table(expect: dict, found: dict) -> tuple[dict, str | None]:
    """The table the installed framework is checked against (the plan's target where its release cannot be
    read or no table declares one) and the warning that choice earns."""
    framework = expect.get("framework") or ""
    installed = ((found.get("packages") or {}).get(framework) or {}).get("version")
    target = expect.get("version") or ""
    table, how = pick_table(expect.get("tables", []), installed)
    if table is None:
        return expect, None
    return table, release_line(framework, installed or "", table, how, target)


def verdict(
    expect: dict, found: dict, driver: str | None, argv: list[str] | tuple[str, ...] = ()
) -> tuple[list[str], list[str], list[str]]:
    """(stops, warnings, notes): each a line naming the package, what was found and what was asked, with
    the source. Stops are what would stop the job; warnings what may not (the framework's own import and
    parse decide)."""
    bad: list[str] = []
    warn: list[str] = []
    notes: list[str] = []
    table, release = chosen_table(expect, found)
    if release:
        warn.append(release)
    who = f"{expect.get('backend')} {table.get('label') or expect.get('version')}"
    py = table.get("python")
    if py and satisfies(found["python"], py["spec"]) is False:
        warn.append(
            f"python {found['python']} ({found.get('executable')}); {who} asks for python{py['spec']} ({py['source']})"
        )
    for pkg in [*table.get("packages", []), *expect.get("hpcrl_packages", [])]:
        if not _needed(pkg, list(argv)):
            notes.append(f"{pkg['name']} not needed: {pkg['when']['key']} is not {pkg['when']['is']!r}")
            continue
        got = found["packages"].get(pkg["name"]) or {}
        if got.get("version") is None and got.get("location") is None:
            why = (
                pkg.get("why") or f"{pkg.get('by') or who} needs {pkg['name']}{pkg.get('spec') or ''} ({pkg['source']})"
            )
            bad.append(f"{pkg['name']} not installed; {why}")
            continue
        if not pkg.get("spec"):
            continue
        if got.get("version") is None:
            notes.append(f"{_found(pkg['name'], got)}: version not checked against {pkg['spec']}")
            continue
        ok = satisfies(got["version"], pkg["spec"])
        if ok is None:
            notes.append(f"{_found(pkg['name'], got)}: version not readable, not checked against {pkg['spec']}")
        elif not ok and pkg.get("by") == "hpcrl":  # hpcrl's own floor: the job script refuses it too
            bad.append(
                f"{_found(pkg['name'], got)} installed; hpcrl needs {pkg['name']}{pkg['spec']} ({pkg['source']})"
            )
        elif not ok:
            warn.append(
                f"{_found(pkg['name'], got)} installed; {who} pins {pkg['name']}{pkg['spec']} ({pkg['source']})"
            )
    built = found.get("torch_cuda")
    if driver is None:
        notes.append("CUDA driver not checked: no NVIDIA driver on this node")
    elif built:
        plan = table.get("torch_cuda") or {}
        planned = f"; {who} installs a CUDA {plan['version']} torch ({plan['source']})" if plan.get("version") else ""
        if _major_minor(built)[0] > _major_minor(driver)[0]:
            torch_ver = (found["packages"].get("torch") or {}).get("version")
            bad.append(
                f"torch {torch_ver} is built for CUDA {built}; this node's driver runs CUDA {driver} at most: "
                f"install a torch built for CUDA {_major_minor(driver)[0]}.x{planned}"
            )
        elif _major_minor(built) > _major_minor(driver):
            notes.append(
                f"torch built for CUDA {built} on a CUDA {driver} driver: minor-version compatibility; "
                "kernels JIT-compiled from PTX may fail"
            )
    return bad, warn, notes


# ---- running the training Python ----------------------------------------------------------------------


def run_python(cmd: list[str], timeout: float) -> tuple[int | None, str, str]:
    """(exit code, stdout, stderr) of `cmd`; None for no exit within `timeout` s (its process group is
    killed). Output goes to files, not pipes: a helper the command leaves running with its stdout open
    cannot hold the check past the command's own exit."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        try:
            proc = subprocess.Popen(
                cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, text=True, start_new_session=True
            )
        except OSError as exc:
            return 127, "", str(exc)
        try:
            rc: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = None
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            proc.wait()
        out.seek(0)
        err.seek(0)
        return rc, out.read(), err.read()


def probe_answer(stdout: str) -> dict | None:
    """The probe's JSON: the last line that starts with PROBE_MARKER (None when there is none or it does not read)."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(PROBE_MARKER):
            try:
                answer = json.loads(line[len(PROBE_MARKER) :])
            except ValueError:
                return None
            return answer if isinstance(answer, dict) else None
    return None


def _tail(text: str) -> str:
    return " ".join((text.strip().splitlines() or ["no output"])[-1].split())[:300]


def check(
    expect: dict,
    python: list[str],
    argv: list[str],
    *,
    entry: str | None = None,
    parse: bool = True,
    probe_timeout: float = PROBE_TIMEOUT_S,
    out=print,
) -> int:
    """Run the whole check; print its lines; the exit code."""
    here = os.path.dirname(os.path.abspath(__file__))
    rc, stdout, stderr = run_python(
        [*python, os.path.join(here, "stack.py"), "--probe", json.dumps(all_packages(expect))], probe_timeout
    )
    found = probe_answer(stdout) if rc == 0 else None
    if found is None:
        why = (
            f"no answer within {probe_timeout:g} s"
            if rc is None
            else f"exit {rc}: {_tail(stderr)}"
            if rc
            else f"no {PROBE_MARKER.strip()} line in its output: {_tail(stdout)}"
        )
        out(
            f"stack: unchecked: the training Python {' '.join(python)} could not be probed ({why}); "
            "the check could not run, the job goes on without it"
        )
        return STACK_UNCHECKED_EXIT
    driver, how = driver_cuda()
    bad, warn, notes = verdict(expect, found, driver, argv)
    table, _ = chosen_table(expect, found)
    parser = table.get("parser") or expect.get("parser")
    if not bad and parse and parser:
        timeout = float(parser.get("timeout_s", 120))
        rc, stdout, stderr = run_python(
            [
                *python,
                os.path.join(here, "stack_parse.py"),
                json.dumps(dict(parser, entry=entry or parser.get("entry"))),
                "--",
                *argv,
            ],
            timeout,
        )
        fw = expect.get("framework") or ""
        who = f"{expect.get('backend')} {(found['packages'].get(fw) or {}).get('version') or ''}"
        if rc is None:
            notes.append(f"dry parse skipped: it did not finish within {timeout:.0f} s")
        elif rc == PARSE_REJECTED:
            bad.append(
                f"{who.strip()} rejects the driver's command line: {_tail(stderr)} "
                f"(the plan targets {expect.get('backend')} {expect.get('version')})"
            )
        elif rc != 0:
            notes.append(f"dry parse not run (exit {rc}): {_tail(stderr)}")
        else:
            notes.append(f"dry parse: {_tail(stdout)}")
    if bad:
        more = f" (and {len(bad) - 1} more: {'; '.join(b.split(';')[0] for b in bad[1:])})" if len(bad) > 1 else ""
        out(f"stack: {bad[0]}{more}")
        for line in warn:
            out(f"stack: warning: {line}")
        return STACK_MISMATCH_EXIT
    seen = ", ".join(_found(n, g) for n, g in found["packages"].items() if g.get("version") or g.get("location"))
    cuda = f"; torch CUDA {found.get('torch_cuda')}, driver CUDA {driver} ({how})" if driver else ""
    out(f"stack: ok: python {found['python']}, {seen}{cuda}")
    for line in warn:
        out(f"stack: warning: {line}")
    for note in notes:
        out(f"stack: note: {note}")
    return 0


def _load(text: str) -> dict:
    if text.lstrip().startswith("{"):
        return json.loads(text)
    with open(text) as fh:
        return json.load(fh)


def main(argv: list[str] | None = None) -> int:
    import argparse

    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--probe"]:  # inside the training Python
        print("\n" + PROBE_MARKER + json.dumps(probe(json.loads(args[1]))), flush=True)
        return 0
    driver_args: list[str] = []
    if "--" in args:
        driver_args, args = args[args.index("--") + 1 :], args[: args.index("--")]
    p = argparse.ArgumentParser(prog="python3 -m hpcrl.runtime.stack", description=__doc__.split("\n\n")[0])
    p.add_argument("--expect", required=True, help="the expectation: inline JSON, or a JSON file")
    p.add_argument(
        "--python",
        action="append",
        default=None,
        metavar="WORD",
        help="the training Python: one word per --python, taken as is (a container's words first, "
        "then the interpreter; a path with spaces or quotes is one word); default this Python",
    )
    p.add_argument("--entry", help="the driver's entry point (a file, or a dotted module); default: the expectation's")
    p.add_argument("--no-parse", action="store_true", help="versions and CUDA only, no dry parse")
    p.add_argument(
        "--probe-timeout",
        type=float,
        default=PROBE_TIMEOUT_S,
        help=f"seconds the training Python may take to answer (default {PROBE_TIMEOUT_S:g}); past it the "
        f"check could not run (exit {STACK_UNCHECKED_EXIT}), never a mismatch",
    )
    a = p.parse_args(args)
    try:
        expect = _load(a.expect)
    except (OSError, ValueError) as exc:
        p.error(f"--expect: {exc}")
    return check(
        expect,
        a.python or [sys.executable],
        driver_args,
        entry=a.entry,
        parse=not a.no_parse,
        probe_timeout=a.probe_timeout,
    )


if __name__ == "__main__":
    sys.exit(main())
