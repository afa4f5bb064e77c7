"""One line of a job's log, written whole (standard library only: it runs in the job's environment).

The job's log is one pipe that the batch script, its background monitors and the steps' output all write
into. `print` writes the text and its newline in two calls when Python's streams are unbuffered
(PYTHONUNBUFFERED=1, common in container images), and another process's line lands between them: "gpumon: no
NVIDIA GPU found on c5n1hpcrl: phase vllm_server" (a fresh-clone CI run; a reader looking for the phase line
missed it). A pipe keeps a single write of up to PIPE_BUF (4096) bytes whole, so each line goes in one call.
"""

from __future__ import annotations

import sys
from typing import TextIO


def say(text: str, stream: TextIO | None = None) -> None:
    """text and its newline in one write to stream (standard error by default), flushed."""
    out = sys.stderr if stream is None else stream
    out.write(text + "\n")
    out.flush()
