"""Which module holds each command, so a command imports its own module and no other."""

from __future__ import annotations

import importlib

# Top-level command (or group) -> hpcrl.cli.cmd_<module>; tests/test_cli_help.py checks it
# against what the modules register. Root help lists them in this order.
COMMANDS = {
    "init": "init",
    "clusters": "clusters",
    "plan": "plan",
    "plan-memory": "memory",
    "plan-disk": "disk",
    "render": "render",
    "submit": "runs",
    "runs": "runs",
    "status": "runs",
    "logs": "runs",
    "cancel": "runs",
    "preflight": "runs",
    "check-stack": "stack",
    "versions": "stack",
    "diagnose": "safety",
    "checkpoints": "safety",
    "report": "report",
    "watch": "watch",
}


def load(argv: list[str]) -> None:
    """Register the command argv names on the app; every command for root help or an unknown name."""
    # The root takes no option with a value, so the first bare word is the command.
    name = next((a for a in argv if not a.startswith("-")), None)
    modules = [COMMANDS[name]] if name in COMMANDS else list(dict.fromkeys(COMMANDS.values()))
    for module in modules:
        importlib.import_module(f"hpcrl.cli.cmd_{module}")
