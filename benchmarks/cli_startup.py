"""How long `hpcrl render --nodes 16` takes against importing the libraries it cannot do without.

Prints the median time of each, measured alternately in fresh interpreters, and their ratio
(issue 17's target: <= 1.5). The baseline imports from pydantic, jinja2 and yaml exactly what
hpcrl's own modules import from them (read from hpcrl/**/*.py, so it follows the code): plain
`import pydantic` is lazy and loads almost nothing until a name is taken from it, so that figure,
printed too, would measure pydantic's laziness rather than its cost. The ratio is of CPU time (user + system of the child process): on a
machine shared with other work, wall time measures the neighbours as much as hpcrl; with the CPU to
itself a single-threaded start-up's wall time is its CPU time. Wall medians are printed beside it. The baseline imports what hpcrl itself uses from the three libraries:
pydantic's BaseModel (plain `import pydantic` is lazy and loads almost nothing), jinja2 and yaml;
the plain-`import pydantic` figure is printed too. Both run as an installed package runs: with
bytecode caches (PYTHONDONTWRITEBYTECODE is dropped and one warm-up run of each writes them).

    python benchmarks/cli_startup.py [--repeat N] [--json]
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIBRARIES = ("pydantic", "jinja2", "yaml")


def library_imports() -> str:
    """The import statements of the three libraries as hpcrl's modules write them, deduplicated."""
    lines = set()
    for path in (ROOT / "hpcrl").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                lines.update(f"import {a.name}" for a in node.names if a.name.split(".")[0] in LIBRARIES)
            elif (
                isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] in LIBRARIES
            ):
                # hpcrl.cli's reach into pydantic's private plugin cache is not a use of the library
                lines.update(f"from {node.module} import {a.name}" for a in node.names if not a.name.startswith("_"))
    return "\n".join(sorted(lines))


CASES = {
    "libraries": [sys.executable, "-c", library_imports()],
    "import pydantic, jinja2, yaml": [sys.executable, "-c", "import pydantic, jinja2, yaml"],
    "hpcrl render --nodes 16": [sys.executable, "-m", "hpcrl", "render", "--nodes", "16"],
    "hpcrl --help": [sys.executable, "-m", "hpcrl", "--help"],
}


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return env


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _once(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one run of cmd."""
    cpu, start = _cpu(), time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    took, cpu = time.perf_counter() - start, _cpu() - cpu
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[2:])} failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
    return cpu, took


def measure(repeat: int) -> dict:
    env = _env()
    cpu: dict[str, list[float]] = {name: [] for name in CASES}
    wall: dict[str, list[float]] = {name: [] for name in CASES}
    for cmd in CASES.values():  # warm-up: bytecode caches, the OS page cache, Jinja's template cache
        _once(cmd, env)
    for _ in range(repeat):
        for name, cmd in CASES.items():  # alternating, so a busy moment hits every case alike
            c, w = _once(cmd, env)
            cpu[name].append(c)
            wall[name].append(w)
    ms = {name: round(statistics.median(t) * 1000, 1) for name, t in cpu.items()}
    wall_ms = {name: round(statistics.median(t) * 1000, 1) for name, t in wall.items()}
    render = "hpcrl render --nodes 16"
    return {
        "repeat": repeat,
        "median_cpu_ms": ms,
        "median_wall_ms": wall_ms,
        "ratio": round(ms[render] / ms["libraries"], 2),
        "ratio_wall": round(wall_ms[render] / wall_ms["libraries"], 2),
        "ratio_to_plain_import": round(ms[render] / ms["import pydantic, jinja2, yaml"], 2),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=15, help="alternating repetitions (median of each)")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args()
    r = measure(max(1, args.repeat))
    if args.json:
        print(json.dumps(r, indent=2, sort_keys=True))
        return 0
    print("libraries = " + "; ".join(library_imports().splitlines()))
    print(f"{'CPU ms':>8}  {'wall ms':>8}  (medians of {r['repeat']})")
    for name, ms in r["median_cpu_ms"].items():
        print(f"{ms:8.1f}  {r['median_wall_ms'][name]:8.1f}  {name}")
    print(
        f"ratio render / libraries: {r['ratio']:.2f} CPU (target <= 1.5), {r['ratio_wall']:.2f} wall; "
        f"{r['ratio_to_plain_import']:.2f} CPU against plain `import pydantic, jinja2, yaml`"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
