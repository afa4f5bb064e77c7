"""Is a crashed driver's log a network failure? `python3 -m hpcrl.runtime.classify LOG`.

The job script asks this when the driver exits with an error of its own: a libfabric/CXI
error, an NCCL system or remote error, or a collective timeout with no CUDA OOM before it is a
failure of the machines, which a continuation on other nodes may get past (reason
`network-error`); anything else is the run's own crash. Prints the match and exits 0 for a
network failure, exits 1 otherwise (also when the log cannot be read). Reads the last 4 MiB.
"""

from __future__ import annotations

import sys

from hpcrl.logs.driver_log import network_failure

TAIL_BYTES = 4 * 1024 * 1024


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0] in ("-h", "--help"):
        print(__doc__.strip().splitlines()[0], file=sys.stdout if argv[:1] in (["-h"], ["--help"]) else sys.stderr)
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    try:
        with open(argv[0], "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - TAIL_BYTES))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return 1
    found = network_failure(text)
    if found is None:
        return 1
    print(found)
    return 0


if __name__ == "__main__":
    sys.exit(main())
