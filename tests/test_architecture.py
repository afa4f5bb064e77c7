"""Layering: the tree is the architecture. Pure planning/rendering never imports side effects,
layers import only the layers below them, nothing imports in a circle, the CLI starts light,
and the in-job runtime needs only the standard library."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "hpcrl"

# hpcrl/'s own top-level modules: what every layer may use (plus __main__, which runs the CLI).
FOUNDATION = {"__init__", "errors", "resources", "yamlfile", "shell", "profiles", "contract"}
MAX_TOP_LEVEL_MODULES = 8
# Each subpackage and what it may import besides the foundation: the layers of README's layout.
MAY_IMPORT = {
    "models": set(),
    "memory": {"models"},
    "planning": {"models", "memory"},  # the run config, the backends, layouts, disk, cadence
    "rendering": {"models", "memory", "planning"},  # plan in, script text out
    "logs": {"models", "memory", "planning"},  # driver logs, checkpoints, diagnose, report
    "runtime": {"logs"},  # in the job: the standard library and the driver-log parser
    "jobs": {"models", "memory", "planning", "rendering", "logs", "runtime"},  # Slurm, registry, submit, preflight
    "cli": {"models", "memory", "planning", "rendering", "logs", "runtime", "jobs"},
    "api": {"models", "memory", "planning", "rendering", "logs", "runtime", "jobs"},  # the CLI's results as objects
    "__main__": {"cli"},
}

# Pure layers: numbers in, numbers/text out (plots.py imports matplotlib, an optional extra, when asked).
PURE = [
    "models",
    "memory",
    "planning",
    "rendering",
    *sorted(f"logs/{p.name}" for p in (PKG / "logs").glob("*.py") if p.name != "plots.py"),
    *sorted(f"{name}.py" for name in FOUNDATION),
]
# What a pure module may not import: processes, Slurm, the registry (the jobs layer), the CLI.
FORBIDDEN = {"subprocess", "hpcrl.jobs", "hpcrl.cli", "hpcrl.runtime", "sqlite3", "submitit", "pynvml"}
HEAVY = {"torch", "ray", "vllm", "deepspeed", "transformers", "matplotlib"}
# In-job tools the scripts run as `python3 -m hpcrl.runtime.X` where only the standard library may
# be installed (gpumon needs nvidia-ml-py and says so).
STDLIB_RUNTIME = [
    "classify",
    "free_ports",
    "preflight_collective",
    "preflight_gpu",
    "preflight_link",
    "preflight_probe",
    "ray_ready",
    "smoke",
    "stack",
    "stack_parse",
    "step_cadence",
    "wait_http",
    "watchdog",
]


def _modules(entry: str) -> list[Path]:
    path = PKG / entry
    if path.is_dir():
        return sorted(path.rglob("*.py"))
    assert path.exists(), f"{entry} is named in this test but not in hpcrl/"
    return [path]


def _imports(path: Path) -> set[str]:
    """Every absolute import in a file: at the top, inside functions, under TYPE_CHECKING.
    `from a.b import c` gives a.b and a.b.c (c may be a module)."""
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def _module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in PKG.rglob("*.py")}


def _graph() -> dict[str, set[str]]:
    """hpcrl module -> the hpcrl modules it imports (a name resolves to its longest module prefix)."""
    graph = {}
    for name, path in MODULES.items():
        deps = set()
        for imported in _imports(path):
            while imported and imported not in MODULES:
                imported = imported.rpartition(".")[0]
            if imported and imported != name:
                deps.add(imported)
        graph[name] = deps
    return graph


def _unit(module: str) -> str:
    """The top-level unit of hpcrl a module belongs to: a subpackage, or a top-level module."""
    parts = module.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _unit_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    units: dict[str, set[str]] = {}
    for module, deps in graph.items():
        units.setdefault(_unit(module), set()).update(_unit(d) for d in deps if _unit(d) != _unit(module))
    return units


@pytest.mark.parametrize("path", [p for e in PURE for p in _modules(e)], ids=lambda p: str(p.relative_to(PKG)))
def test_pure_module_has_no_side_effect_imports(path):
    bad = {n for n in _imports(path) for f in FORBIDDEN | HEAVY if n == f or n.startswith(f + ".")}
    assert not bad, f"{path.relative_to(PKG)} imports {sorted(bad)}"


def test_forbidden_detection_works(tmp_path):
    """The walker really sees imports (guards against a test that cannot fail)."""
    f = tmp_path / "m.py"
    f.write_text(
        "import subprocess\nfrom hpcrl.jobs.slurm import submit\ndef f():\n    from hpcrl.jobs import registry\n"
    )
    assert {"subprocess", "hpcrl.jobs.slurm", "hpcrl.jobs.registry"} <= _imports(f)


def test_few_top_level_modules():
    top = sorted(p.name for p in PKG.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, f"{len(top)} modules at the top of hpcrl/: {top}"
    assert {p.stem for p in PKG.glob("*.py")} == FOUNDATION | {"__main__"}, "a new top-level module: put it in a layer"


def test_every_subpackage_is_a_known_layer():
    packages = {p.parent.name for p in PKG.glob("*/__init__.py")}
    assert packages == set(MAY_IMPORT) - {"__main__"}


def test_layers_import_only_layers_below():
    graph = _graph()
    bad = []
    for module, deps in sorted(graph.items()):
        unit = _unit(module)
        allowed = FOUNDATION | {unit} | (set() if unit in FOUNDATION else MAY_IMPORT[unit])
        bad += [f"{module} imports {d}" for d in sorted(deps) if _unit(d) not in allowed]
    assert not bad, "\n".join(bad)


def test_no_import_cycle_between_subpackages():
    """Units are hpcrl's subpackages and its top-level modules; every import counts (lazy ones,
    TYPE_CHECKING ones)."""
    cycles = _cycles(_unit_graph(_graph()))
    assert not cycles, f"import cycles between parts of hpcrl: {cycles}"


def test_no_import_cycle_between_modules():
    """The same, module by module: the run config's types sit below the backends that read them,
    and the backends are found by name (hpcrl/planning/backends/__init__.py)."""
    cycles = _cycles(_graph())
    assert not cycles, f"import cycles between modules: {cycles}"


def test_cycle_detection_works():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    graph = {
        "hpcrl.planning.x": {"hpcrl.rendering.y"},
        "hpcrl.rendering.y": {"hpcrl.planning.z"},
        "hpcrl.planning.z": set(),
    }
    assert _cycles(graph) == []
    assert _cycles(_unit_graph(graph)) == [["planning", "rendering"]]


@pytest.mark.parametrize("tool", STDLIB_RUNTIME)
def test_runtime_tool_imports_only_the_standard_library(tool):
    code = (
        f"import sys; import hpcrl.runtime.{tool}; "
        "extra = sorted({m.split('.')[0] for m in sys.modules} - set(sys.stdlib_module_names) - {'hpcrl', '__main__'}); "
        "print(extra); sys.exit(1 if extra else 0)"
    )
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=60, cwd=PKG.parent)
    assert out.returncode == 0, out.stdout + out.stderr


def test_cli_start_imports_no_heavy_framework():
    code = (
        "import sys, hpcrl.cli; "
        f"bad = [m for m in {sorted(HEAVY)!r} if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


# No line cap on modules: a module is split where its ideas part, not at a line count (issue 34).


# --------------------------------------------------------------------------- the learner's sharding

# Layers that ask the learner's sharding strategy (hpcrl/memory/sharding.py) rather than compare its name;
# the backends name it and the strategy module reads a stored name, nothing else may (issue 34).
SHARDING_NAMES = {"zero", "fsdp"}
SHARDING_SCANNED = ["memory", "planning", "cli", "logs"]
SHARDING_MAY_NAME = [PKG / "planning" / "backends", PKG / "memory" / "sharding.py"]


def _sharding_name_comparisons(path: Path) -> list[str]:
    """Each comparison in a file with a sharding name as a literal (==, !=, in, a tuple or set of names, a
    match case), as "line: source"."""
    tree = ast.parse(path.read_text())

    def names(node: ast.AST) -> bool:
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return any(names(e) for e in node.elts)
        return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.lower() in SHARDING_NAMES

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(names(n) for n in [node.left, *node.comparators]):
            found.append(node)
        elif isinstance(node, ast.MatchValue) and names(node.value):
            found.append(node)
    return [f"{n.lineno}: {ast.get_source_segment(path.read_text(), n)}" for n in found]


def test_no_module_outside_the_backends_compares_sharding_names():
    bad = {}
    for path in (p for e in SHARDING_SCANNED for p in _modules(e)):
        if any(path == m or m in path.parents for m in SHARDING_MAY_NAME):
            continue
        if found := _sharding_name_comparisons(path):
            bad[str(path.relative_to(PKG))] = found
    assert not bad, f"ask the learner's Sharding (hpcrl/memory/sharding.py), not its name: {bad}"


def test_the_sharding_name_scan_sees_a_planted_comparison(tmp_path):
    planted = tmp_path / "m.py"
    planted.write_text(
        'if s.sharding == "fsdp":\n    pass\nok = lr.get("sharding") != "FSDP"\n'
        'x = k in ("zero", "fsdp2")\nmatch k:\n    case "zero":\n        pass\n'
        'runs = {"zero": []}\nname = "zero_stage" == k\n'
    )
    assert [line.split(":")[0] for line in _sharding_name_comparisons(planted)] == ["1", "3", "4", "6"]


# --------------------------------------------------------------------------- the tests' own imports

TESTS = PKG.parent / "tests"


def _test_imports(path: Path) -> list[str]:
    """The test modules (test_*) and conftest a file under tests/ imports, anywhere in it, absolute or
    relative. Shared helpers live in helper modules (helpers.py, stub_run.py, lifecycle_harness.py);
    pytest imports conftest itself, and a test module imported by another runs its tests' module code
    twice and ties the two files' edits together."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.module:
                found.add(node.module.split(".")[0])
            if node.level or not node.module:  # from . import test_x
                found.update(a.name for a in node.names)
    return sorted(n for n in found if n == "conftest" or n.startswith("test_"))


def test_no_test_module_imports_another_test_module_or_conftest():
    bad = {
        str(p.relative_to(TESTS)): names
        for p in sorted(TESTS.rglob("*.py"))
        if "data" not in p.relative_to(TESTS).parts and (names := _test_imports(p))
    }
    assert not bad, f"move what they share into tests/helpers.py (or another helper module): {bad}"


def test_the_test_import_check_sees_a_planted_import(tmp_path):
    planted = tmp_path / "test_planted.py"
    planted.write_text(
        "import pytest\nimport test_x\nfrom helpers import ok_json\nfrom conftest import slurm_nodes\n"
        "def f():\n    from test_render_e2e import render\n    from . import test_y\n"
    )
    assert _test_imports(planted) == ["conftest", "test_render_e2e", "test_x", "test_y"]
