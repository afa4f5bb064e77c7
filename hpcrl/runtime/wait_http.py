"""Wait until a local HTTP service answers: `python3 -m hpcrl.runtime.wait_http URL [--timeout S] [--pid PID]`.

The job script starts the services a framework calls on localhost (open-instruct's code-execution
API) and waits for them with this before the driver starts. Exit 0 once GET URL answers 2xx;
1 when the deadline passes or the service's process (--pid) exits first, with one line saying
which. Standard library only: it runs in the job's environment.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import urllib.error
import urllib.request
from hpcrl.runtime.job_log import say


def pid_alive(pid: int | None) -> bool:
    """Whether the process runs (None: no process to watch); a zombie counts as gone."""
    if pid is None:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, not yet reaped by its parent) counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def wait(url: str, timeout: float, pid: int | None = None, name: str = "service") -> int:
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            say(f"hpcrl: error: {name} exited before it answered {url} ({last})")
            return 1
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - a local URL the script built
                if 200 <= resp.status < 300:
                    say(f"hpcrl: {name} answers {url}", sys.stdout)
                    return 0
                last = f"HTTP {resp.status}"
        except urllib.error.HTTPError as exc:
            last = f"HTTP {exc.code}"
        except (urllib.error.URLError, OSError) as exc:
            last = str(getattr(exc, "reason", exc))
        time.sleep(0.5)
    say(f"hpcrl: error: {name} did not answer {url} within {timeout:g} s ({last})")
    return 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m hpcrl.runtime.wait_http", description=__doc__.split("\n\n")[0])
    p.add_argument("url", help="e.g. http://127.0.0.1:10003/health")
    p.add_argument("--timeout", type=float, default=180.0, help="seconds (default 180)")
    p.add_argument("--pid", type=int, default=None, help="give up at once when this process exits")
    p.add_argument("--name", default="service", help="what to call it in messages")
    a = p.parse_args(argv)
    if a.timeout <= 0:
        p.error("--timeout must be positive")
    return wait(a.url, a.timeout, a.pid, a.name)


if __name__ == "__main__":
    sys.exit(main())
