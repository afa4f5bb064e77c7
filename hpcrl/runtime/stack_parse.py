"""The stack check's dry parse: the installed framework parses the driver's command line, nothing runs.

    python stack_parse.py PARSER_JSON -- DRIVER ARGS...   (hpcrl.runtime.stack_parse, run as a file)

Run by hpcrl/runtime/stack.py in the training Python, as a file (no hpcrl import). PARSER_JSON is
the expectation's `parser`:
- kind hydra: Hydra composes `config_name` from `config_dir` under the installed package `module`
  with the arguments as overrides (as the framework's @hydra.main would), and stops there;
- kind main-block: the entry file's `if __name__ == "__main__":` statements run up to and including
  its first parse_args call, with sys.argv set to the arguments; namespace `stdlib` runs them with
  only the file's standard-library imports (nothing of the framework is imported), `module` in the
  file's own namespace (the file is imported first, with its dependencies).
Exit 0: parsed; 10: the framework rejected the arguments (its message is the last line of stderr);
11: the parse could not be run here (no such package, no such file, an error of its own).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import sys

# Not 2: Python itself exits 2 when it cannot open this file.
REJECTED, NOT_RUN = 10, 11


def package_dir(module: str) -> str:
    """Where a top-level package is installed, found without importing it."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise LookupError(f"package {module} not found")
    return list(spec.submodule_search_locations)[0]


def entry_file(entry: str) -> str:
    """The entry point's file: a path as given (relative to the working directory), or a dotted module."""
    if entry.endswith(".py") or os.sep in entry:
        if os.path.isfile(entry):
            return entry
        top, _, rest = entry.partition(os.sep)  # a path inside an installed package
        try:
            path = os.path.join(package_dir(top), rest)
        except LookupError:
            path = ""
        if not os.path.isfile(path):
            raise LookupError(f"entry file {entry} not found in {os.getcwd()} nor in an installed {top}")
        return path
    top, _, rest = entry.partition(".")
    path = os.path.join(package_dir(top), *rest.split("."))
    for candidate in (path + ".py", os.path.join(path, "__main__.py")):
        if os.path.isfile(candidate):
            return candidate
    raise LookupError(f"module {entry} not found under {package_dir(top)}")


def main_block(source: str, stdlib_only: bool) -> str:
    """The statements of the `__main__` block up to and including the first parse_args call; with
    stdlib_only, preceded by the file's standard-library imports."""
    tree = ast.parse(source)
    body: list[ast.stmt] = []
    if stdlib_only:
        body = [
            n
            for n in tree.body
            if isinstance(n, (ast.Import, ast.ImportFrom))
            and not getattr(n, "level", 0)
            and all(
                (a.name if isinstance(n, ast.Import) else n.module or "").split(".")[0] in sys.stdlib_module_names
                for a in n.names
            )
        ]
    for node in tree.body:
        if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
            for stmt in node.body:
                body.append(stmt)
                if "parse_args" in ast.unparse(stmt):
                    return ast.unparse(ast.Module(body=body, type_ignores=[]))
    raise LookupError("no parse_args call in the file's __main__ block")


def parse_main_block(parser: dict, argv: list[str]) -> str:
    path = entry_file(parser["entry"])
    with open(path) as fh:
        source = fh.read()
    stdlib_only = parser.get("namespace", "stdlib") == "stdlib"
    block = main_block(source, stdlib_only)
    scope: dict = {"__name__": "hpcrl_dry_parse", "__file__": path}
    if not stdlib_only:
        import runpy

        # As `python FILE` in the workdir finds things: the file's folder first, then the checkout.
        sys.path[:0] = [os.path.dirname(os.path.abspath(path)), os.getcwd()]
        scope = runpy.run_path(path, run_name="hpcrl_dry_parse")
    sys.argv = [path, *argv]
    exec(compile(block, path, "exec"), scope)  # noqa: S102 - the framework's own parser, as its file builds it
    return f"{path} parsed {len(argv)} arguments"


def parse_hydra(parser: dict, argv: list[str]) -> str:
    conf = os.path.join(package_dir(parser["module"]), *parser["config_dir"].split("/"))
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=conf, version_base=None):
        compose(config_name=parser["config_name"], overrides=list(argv))
    return f"Hydra composed {parser['config_name']} from {conf} with {len(argv)} overrides"


def main(args: list[str]) -> int:
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if args else NOT_RUN
    parser = json.loads(args[0])
    argv = args[args.index("--") + 1 :] if "--" in args else []
    run = {"hydra": parse_hydra, "main-block": parse_main_block}[parser["kind"]]
    try:
        print(run(parser, argv))
    except SystemExit as exc:  # argparse's error(): its message is already on stderr
        return REJECTED if exc.code not in (0, None) else 0
    except LookupError as exc:
        print(f"dry parse not run: {exc}", file=sys.stderr)
        return NOT_RUN
    except ImportError as exc:
        print(f"dry parse not run: {type(exc).__name__}: {exc}", file=sys.stderr)
        return NOT_RUN
    except Exception as exc:  # Hydra's composition errors, and anything the framework raises
        name = type(exc).__name__
        text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        if parser["kind"] == "hydra" and ("Override" in name or "Composition" in name or "ConfigKey" in name):
            print(f"{name}: {text}", file=sys.stderr)
            return REJECTED
        print(f"dry parse not run: {name}: {text}", file=sys.stderr)
        return NOT_RUN
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
