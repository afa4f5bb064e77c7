"""The links of preflight's collective: framed JSON messages, and the challenge that proves the
job's secret at both ends of every link before anything else is read.

Standard library only. It travels with preflight_collective.py (hpcrl preflight sends both
sources; the node needs no hpcrl) and is imported from beside it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import queue
import re
import secrets
import socket
import threading
import time

MIB = 1 << 20
SECRET_ENV = "HPCRL_COLLECTIVE_SECRET"
HANDSHAKE_S = 5.0  # a connection gets this long, in all, to prove the secret
HANDSHAKE_LINE = 512  # bytes: a handshake message is ~130; also keeps json's nesting far below the recursion limit
MAX_LINE = 16 * MIB  # a control message longer than this is not from a node of the job
MAX_PENDING = 64  # handshakes at once; a connection beyond them is closed at once (and counted)
_NONCE = re.compile(r"[0-9a-f]{32}")
_MAC = re.compile(r"[0-9a-f]{64}")


class AuthError(ConnectionError):
    """The other end of a link did not prove the job's secret."""


# ---------------------------------------------------------------- framed JSON over the control link


def send_msg(sock: socket.socket, obj) -> None:
    sock.sendall((json.dumps(obj) + "\n").encode())


def recv_msg(sock: socket.socket, buf: bytearray, limit: int = MAX_LINE, until: float | None = None) -> dict:
    """One JSON object; with `until` (a monotonic time), the whole message by then, not each recv."""
    while b"\n" not in buf:
        if len(buf) > limit:
            raise ConnectionError(f"a message over {limit} bytes")
        if until is not None:
            left = until - time.monotonic()
            if left <= 0:
                raise TimeoutError("the message did not arrive in time")
            sock.settimeout(left)
        chunk = sock.recv(65536 if until is None else limit + 1)
        if not chunk:
            raise ConnectionError("link closed")
        buf += chunk
    line, _, rest = bytes(buf).partition(b"\n")
    if len(line) > limit:
        raise ConnectionError(f"a message over {limit} bytes")
    buf[:] = rest
    msg = json.loads(line)
    if not isinstance(msg, dict):
        raise ValueError("a message that is not a JSON object")
    return msg


# ---------------------------------------------------------------- proving the job's secret on every link


def job_secret() -> bytes:
    """The per-job secret from the environment (hpcrl preflight sets it; by hand, export any shared value)."""
    value = os.environ.get(SECRET_ENV, "")
    if len(value) < 16:
        raise RuntimeError(
            f"{SECRET_ENV} is not set (or under 16 characters): every node needs the same "
            "secret; `hpcrl preflight` draws one per job"
        )
    return value.encode()


def _mac(key: bytes, *parts: str) -> str:
    return hmac.new(key, "|".join(parts).encode(), hashlib.sha256).hexdigest()


def _field(msg: dict, name: str, shape: re.Pattern[str]) -> str:
    value = msg.get(name)
    if not isinstance(value, str) or not shape.fullmatch(value):
        raise ValueError(f"no well-formed {name}")
    return value


def admit(sock: socket.socket, key: bytes, until: float) -> bytearray | None:
    """The accepting side: challenge the peer, which must answer by `until`; its buffer when it
    proved the secret, else None (closed). Whatever the peer sends, nothing escapes from here."""
    buf, nonce = bytearray(), secrets.token_hex(16)
    try:
        sock.settimeout(max(0.1, until - time.monotonic()))
        send_msg(sock, {"challenge": nonce})
        msg = recv_msg(sock, buf, HANDSHAKE_LINE, until)
        theirs, mac = _field(msg, "nonce", _NONCE), _field(msg, "mac", _MAC)
        if hmac.compare_digest(mac, _mac(key, "join", nonce, theirs)):
            send_msg(sock, {"mac": _mac(key, "welcome", theirs, nonce)})
            return buf
    except Exception:  # noqa: BLE001 - an intruder's bytes: malformed, deep, slow or closed, all refused
        pass
    sock.close()
    return None


def join(sock: socket.socket, key: bytes, timeout: float) -> bytearray:
    """The connecting side: answer the challenge and check the other end knows the secret too."""
    buf, mine = bytearray(), secrets.token_hex(16)
    until = time.monotonic() + timeout
    try:
        peer = "%s:%s" % sock.getpeername()[:2]
        challenge = _field(recv_msg(sock, buf, HANDSHAKE_LINE, until), "challenge", _NONCE)
        send_msg(sock, {"nonce": mine, "mac": _mac(key, "join", challenge, mine)})
        proof = _field(recv_msg(sock, buf, HANDSHAKE_LINE, until), "mac", _MAC)
    except Exception as exc:  # noqa: BLE001 - whatever the other end sent, one clear error
        raise AuthError(f"the other end did not complete the handshake ({type(exc).__name__}: {exc})"[:300]) from None
    if not hmac.compare_digest(proof, _mac(key, "welcome", mine, challenge)):
        raise AuthError(f"{peer} answered without the job's secret (another process holds the port?)")
    sock.settimeout(None)
    return buf


class Gate:
    """Admits connections on a listener: each proves the secret in a thread of its own, so a
    connection that stalls holds only its own thread, never the nodes behind it."""

    def __init__(self, listener: socket.socket, key: bytes, rejected: list):
        self.listener, self.key, self.rejected = listener, key, rejected
        self.admitted: queue.Queue = queue.Queue()
        self.pending = threading.BoundedSemaphore(MAX_PENDING)
        # Connections taken and still proving the secret (the admitting thread's id -> address); close()
        # counts them, so the count is the same however the threads were scheduled.
        self.proving: dict[int, str] = {}
        self.closed = False
        self.lock = threading.Lock()
        listener.settimeout(0.2)

    def close(self) -> None:
        """Done with this gate (its peers are in): every connection still proving the secret is counted as
        rejected now, since every peer it waited for has proved itself; an admission that ends later is
        closed and not counted again."""
        with self.lock:
            self.closed = True
            self.rejected.extend(self.proving.values())
            self.proving.clear()

    def next(self, deadline: float) -> tuple[socket.socket, bytearray] | None:
        """The next connection that proved the secret, or None at the deadline."""
        while time.monotonic() < deadline:
            try:
                return self.admitted.get_nowait()
            except queue.Empty:
                pass
            try:
                conn, peer = self.listener.accept()
            except socket.timeout:
                continue
            except OSError:  # the listener was closed
                return None
            if not self.pending.acquire(blocking=False):
                conn.close()
                self.rejected.append(peer[0])
                continue
            until = min(time.monotonic() + HANDSHAKE_S, deadline)
            thread = threading.Thread(target=self._admit, args=(conn, peer[0], until), daemon=True)
            with self.lock:
                thread.start()
                assert thread.ident is not None
                self.proving[thread.ident] = peer[0]
        return None

    def _admit(self, conn: socket.socket, addr: str, until: float) -> None:
        try:
            buf = admit(conn, self.key, until)
            with self.lock:
                counted = self.proving.pop(threading.get_ident(), None) is None  # close() counted it
                if buf is None:
                    if not counted:
                        self.rejected.append(addr)
                elif counted:
                    conn.close()
                else:
                    self.admitted.put((conn, buf))
        finally:
            self.pending.release()


if __name__ == "__main__":
    import sys

    print(
        "usage: python -m hpcrl.runtime.preflight_link --help\n\n"
        "The links of preflight's collective check (framed JSON and the per-job secret's challenge);\n"
        "no command of its own: preflight_collective.py imports it (python -m hpcrl.runtime.preflight_collective)."
    )
    sys.exit(0 if len(sys.argv) == 2 and sys.argv[1] in ("-h", "--help") else 2)
