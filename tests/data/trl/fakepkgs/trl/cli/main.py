"""STAND-IN for `python -m trl.cli.main vllm-serve ...` (README.md beside the package)."""

import os
import runpy
import shlex
import sys
from pathlib import Path

if __name__ == "__main__":
    if sys.argv[1:2] != ["vllm-serve"]:
        sys.exit(f"trl stand-in: only vllm-serve, not {sys.argv[1:2]}")
    standin = Path(__file__).resolve().parents[3] / "vllm_serve_standin.py"
    sys.argv = [str(standin), *sys.argv[2:], *shlex.split(os.environ.get("HPCRL_TEST_SERVE_EXTRA", ""))]
    runpy.run_path(str(standin), run_name="__main__")
