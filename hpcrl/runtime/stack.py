"""The job's stack check: does the training environment hold what the plan's framework version needs?

    python3 -m hpcrl.runtime.stack --expect EXPECT [--python CMD] [--entry ENTRY] [--no-parse] [-- DRIVER ARGS...]

EXPECT is the JSON (inline, or a file) hpcrl.planning.backends.stack_expect writes for the run.
In seconds and before Ray starts: the versions of the framework and its stack, read from the
training Python's installed metadata (importlib.metadata and find_spec, in a subprocess of that
Python: nothing is imported, so a broken torch cannot hang the check); the CUDA the installed torch
was built for (torch/version.py read as text) against the newest CUDA the node's driver runs
(libcuda's cuDriverGetVersion through ctypes, else nvidia-smi; a node without a driver is skipped
with a note); then, unless --no-parse, the driver's command line parsed by the installed framework
itself (hpcrl/runtime/stack_parse.py, in the training Python, with the expectation's timeout).

A mismatch prints ONE line, `stack: <package> <found>; <what the plan expected> (<source>)`, and
exits STACK_MISMATCH_EXIT; all good prints `stack: ok: ...` and exits 0. Standard library only
and no hpcrl import: `hpcrl preflight` ships this file's text to nodes that lack hpcrl.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

# The job's end reason `stack-mismatch`: never continued (the environment will not fix itself).
# 90-97 are the watchdog's breakers and the script's Ray ends, 127 a missing command.
STACK_MISMATCH_EXIT = 98
PROBE_TIMEOUT_S = 60
PARSE_REJECTED = 10  # stack_parse.py's exit code when the framework rejects the arguments

_VERSION = re.compile(r"^\s*v?(\d+(?:\.\d+)*)(?:[-_.]?(a|b|c|rc|alpha|beta|pre|preview)[-_.]?(\d*))?"
                      r"(?:[-_.]?(post|rev|r)[-_.]?(\d*))?(?:[-_.]?(dev)[-_.]?(\d*))?(?:\+(\S*))?\s*$", re.I)
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
            same = have[0][:len(prefix)] == prefix
            if (op == "==" and not same) or (op == "!=" and same):
                return False
            continue
        want = parse_version(text)
        if want is None:
            raise ValueError(f"specifier {clause!r}: {text!r} is no version")
        if op == "~=":
            n = len(text.split("+")[0].split("."))
            op_ok = have >= want and have[0][:n - 1] == want[0][:n - 1]
        else:
            op_ok = {"==": have[:3] == want[:3],
                     "!=": have[:3] != want[:3], ">=": have >= want, "<=": have <= want,
                     ">": have > want, "<": have < want}[op]
        if not op_ok:
            return False
    return True


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


def verdict(expect: dict, found: dict, driver: str | None, argv: list[str] | tuple[str, ...] = ()
            ) -> tuple[list[str], list[str]]:
    """(mismatches, notes): each mismatch one line naming the package, what was found and what the
    plan expected, with the expectation's source."""
    bad, notes = [], []
    who = f"{expect.get('backend')} {expect.get('version')}"
    py = expect.get("python")
    if py and satisfies(found["python"], py["spec"]) is False:
        bad.append(f"python {found['python']} ({found.get('executable')}); {who} needs python{py['spec']} ({py['source']})")
    for pkg in expect.get("packages", []):
        if not _needed(pkg, list(argv)):
            notes.append(f"{pkg['name']} not needed: {pkg['when']['key']} is not {pkg['when']['is']!r}")
            continue
        got = found["packages"].get(pkg["name"]) or {}
        if got.get("version") is None and got.get("location") is None:
            why = pkg.get("why") or f"{pkg.get('by') or who} needs {pkg['name']}{pkg.get('spec') or ''} ({pkg['source']})"
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
        elif not ok:
            bad.append(f"{_found(pkg['name'], got)} installed; {pkg.get('by') or who} needs "
                       f"{pkg['name']}{pkg['spec']} ({pkg['source']})")
    built = found.get("torch_cuda")
    if driver is None:
        notes.append("CUDA driver not checked: no NVIDIA driver on this node")
    elif built:
        plan = expect.get("torch_cuda") or {}
        planned = f"; {who} installs a CUDA {plan['version']} torch ({plan['source']})" if plan.get("version") else ""
        if _major_minor(built)[0] > _major_minor(driver)[0]:
            torch_ver = (found["packages"].get("torch") or {}).get("version")
            bad.append(f"torch {torch_ver} is built for CUDA {built}; this node's driver runs CUDA {driver} at most: "
                       f"install a torch built for CUDA {_major_minor(driver)[0]}.x{planned}")
        elif _major_minor(built) > _major_minor(driver):
            notes.append(f"torch built for CUDA {built} on a CUDA {driver} driver: minor-version compatibility; "
                         "kernels JIT-compiled from PTX may fail")
    return bad, notes


# ---- the check -------------------------------------------------------------------------------------

def _run_python(cmd: list[str], timeout: float) -> tuple[int | None, str, str]:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return None, "", ""
    except OSError as exc:
        return 127, "", str(exc)
    return proc.returncode, proc.stdout, proc.stderr


def _tail(text: str) -> str:
    return " ".join((text.strip().splitlines() or ["no output"])[-1].split())[:300]


def check(expect: dict, python: list[str], argv: list[str], *, entry: str | None = None, parse: bool = True,
          out=print) -> int:
    """Run the whole check; print its lines; the exit code."""
    here = os.path.dirname(os.path.abspath(__file__))
    rc, stdout, stderr = _run_python([*python, os.path.join(here, "stack.py"), "--probe",
                                      json.dumps(expect.get("packages", []))], PROBE_TIMEOUT_S)
    if rc != 0:
        why = f"did not answer within {PROBE_TIMEOUT_S} s" if rc is None else f"exit {rc}: {_tail(stderr)}"
        out(f"stack: the training Python {' '.join(python)} could not be probed ({why})")
        return STACK_MISMATCH_EXIT
    found = json.loads(stdout.strip().splitlines()[-1])
    driver, how = driver_cuda()
    bad, notes = verdict(expect, found, driver, argv)
    parser = expect.get("parser")
    if not bad and parse and parser:
        timeout = float(parser.get("timeout_s", 120))
        cmd = [*python, os.path.join(here, "stack_parse.py"), json.dumps(dict(parser, entry=entry or parser.get("entry"))),
               "--", *argv]
        rc, stdout, stderr = _run_python(cmd, timeout)
        who = f"{expect.get('backend')} {found['packages'].get(expect.get('framework') or '', {}).get('version') or ''}"
        if rc is None:
            notes.append(f"dry parse skipped: it did not finish within {timeout:.0f} s")
        elif rc == PARSE_REJECTED:
            bad.append(f"{who.strip()} rejects the driver's command line: {_tail(stderr)} "
                       f"(the plan targets {expect.get('backend')} {expect.get('version')})")
        elif rc != 0:
            notes.append(f"dry parse not run (exit {rc}): {_tail(stderr)}")
        else:
            notes.append(f"dry parse: {_tail(stdout)}")
    if bad:
        more = f" (and {len(bad) - 1} more: {'; '.join(b.split(';')[0] for b in bad[1:])})" if len(bad) > 1 else ""
        out(f"stack: {bad[0]}{more}")
        return STACK_MISMATCH_EXIT
    seen = ", ".join(_found(n, g) for n, g in found["packages"].items() if g.get("version") or g.get("location"))
    cuda = f"; torch CUDA {found.get('torch_cuda')}, driver CUDA {driver} ({how})" if driver else ""
    out(f"stack: ok: python {found['python']}, {seen}{cuda}")
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
        print(json.dumps(probe(json.loads(args[1]))))
        return 0
    driver_args: list[str] = []
    if "--" in args:
        driver_args, args = args[args.index("--") + 1:], args[:args.index("--")]
    p = argparse.ArgumentParser(prog="python3 -m hpcrl.runtime.stack", description=__doc__.split("\n\n")[0])
    p.add_argument("--expect", required=True, help="the expectation: inline JSON, or a JSON file")
    p.add_argument("--python", default=sys.executable,
                   help="the training Python as a command (shell words: a container prefix may come first)")
    p.add_argument("--entry", help="the driver's entry point (a file, or a dotted module); default: the expectation's")
    p.add_argument("--no-parse", action="store_true", help="versions and CUDA only, no dry parse")
    a = p.parse_args(args)
    try:
        expect = _load(a.expect)
    except (OSError, ValueError) as exc:
        p.error(f"--expect: {exc}")
    return check(expect, shlex.split(a.python), driver_args, entry=a.entry, parse=not a.no_parse)


if __name__ == "__main__":
    sys.exit(main())
