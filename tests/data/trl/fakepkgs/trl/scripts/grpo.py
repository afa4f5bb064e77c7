"""STAND-IN for `trl.scripts.grpo` (README.md beside the package)."""

import os
import runpy
import shlex
import sys
from pathlib import Path

if __name__ == "__main__":
    standin = Path(__file__).resolve().parents[3] / "trl_trainer_standin.py"
    sys.argv = [str(standin), *sys.argv[1:], *shlex.split(os.environ.get("HPCRL_TEST_TRAINER_EXTRA", ""))]
    runpy.run_path(str(standin), run_name="__main__")
