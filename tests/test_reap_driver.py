"""The job script's reap_driver (templates/driver.sh.j2) in bash alone. Bash 5.2 can lose the status of a child
it reaped while a trap ran; `wait "$DRIVER_PID"` then blocked on the job's other children (Ray's head) until
Slurm's KILL and the end line was lost (the lost-node test, with a node lost at the driver's start). The real
loss cannot be provoked on demand; a driver `wait` cannot collect (one still running) stands for it here."""

from __future__ import annotations

import subprocess

from helpers import bash_functions, rendered_script
from hpcrl import contract

FUNCTIONS = bash_functions(rendered_script(), "reap_driver") + "log() { printf 'hpcrl: %s\\n' \"$*\"; }\n"


def reap(setup: str) -> str:
    script = (
        FUNCTIONS
        + "NODE_DIR=$(mktemp -d)\n"
        + setup
        + 'reap_driver\necho "code=$DRIVER_CODE"\nkill $(jobs -p) 2>/dev/null\n'
    )
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60).stdout


def test_an_exited_drivers_status_is_read():
    out = reap("STOP_REASON=''\n(exit 7) &\nDRIVER_PID=$!\nsleep 0.3\n")
    assert out.splitlines()[-1] == "code=7" and "lost" not in out, out


def test_a_status_wait_cannot_collect_is_taken_as_the_stops():
    # Beside it another child that never ends, as Ray's head is: without the timer, wait would block on both.
    out = reap("STOP_REASON=worker-died\nsleep 300 >/dev/null 2>&1 &\nsleep 300 >/dev/null 2>&1 &\nDRIVER_PID=$!\n")
    assert "the driver's exit status was lost (bash reaped it in a trap); taken as 143" in out, out
    assert out.splitlines()[-1] == "code=143", out
    assert contract.REAP_WAIT_S < 10  # a lost status costs the stop little of Slurm's KillWait


def test_without_a_stop_a_lost_status_is_a_crash():
    out = reap("STOP_REASON=''\nsleep 300 >/dev/null 2>&1 &\nDRIVER_PID=$!\n")
    assert out.splitlines()[-1] == "code=1", out
