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
import secrets
import socket
import time

MIB = 1 << 20
SECRET_ENV = "HPCRL_COLLECTIVE_SECRET"
HANDSHAKE_S = 5.0  # a connection that has not proved the secret by then is dropped
MAX_LINE = 16 * MIB  # a control message longer than this is not from a node of the job


class AuthError(ConnectionError):
    """The other end of a link did not prove the job's secret."""


# ---------------------------------------------------------------- framed JSON over the control link

def send_msg(sock: socket.socket, obj) -> None:
    sock.sendall((json.dumps(obj) + "\n").encode())


def recv_msg(sock: socket.socket, buf: bytearray) -> dict:
    while b"\n" not in buf:
        if len(buf) > MAX_LINE:
            raise ConnectionError(f"a control message over {MAX_LINE} bytes")
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("control link closed")
        buf += chunk
    line, _, rest = bytes(buf).partition(b"\n")
    buf[:] = rest
    msg = json.loads(line)
    if not isinstance(msg, dict):
        raise ValueError("a control message that is not a JSON object")
    return msg


# ---------------------------------------------------------------- proving the job's secret on every link

def job_secret() -> bytes:
    """The per-job secret from the environment (hpcrl preflight sets it; by hand, export any shared value)."""
    value = os.environ.get(SECRET_ENV, "")
    if len(value) < 16:
        raise RuntimeError(f"{SECRET_ENV} is not set (or under 16 characters): every node needs the same "
                           "secret; `hpcrl preflight` draws one per job")
    return value.encode()


def _mac(key: bytes, *parts: str) -> str:
    return hmac.new(key, "|".join(parts).encode(), hashlib.sha256).hexdigest()


def admit(sock: socket.socket, key: bytes) -> bytearray | None:
    """The accepting side: challenge the peer; its buffer when it proved the secret, else None (closed)."""
    buf, nonce = bytearray(), secrets.token_hex(16)
    try:
        sock.settimeout(HANDSHAKE_S)
        send_msg(sock, {"challenge": nonce})
        msg = recv_msg(sock, buf)
        theirs = str(msg.get("nonce", ""))
        if len(theirs) >= 16 and hmac.compare_digest(str(msg.get("mac", "")), _mac(key, "join", nonce, theirs)):
            send_msg(sock, {"mac": _mac(key, "welcome", theirs, nonce)})
            return buf
    except (OSError, ValueError):
        pass
    sock.close()
    return None


def join(sock: socket.socket, key: bytes, timeout: float) -> bytearray:
    """The connecting side: answer the challenge and check the other end knows the secret too."""
    buf, mine = bytearray(), secrets.token_hex(16)
    sock.settimeout(timeout)
    challenge = str(recv_msg(sock, buf).get("challenge", ""))
    send_msg(sock, {"nonce": mine, "mac": _mac(key, "join", challenge, mine)})
    if not hmac.compare_digest(str(recv_msg(sock, buf).get("mac", "")), _mac(key, "welcome", mine, challenge)):
        raise AuthError(f"{sock.getpeername()[0]}:{sock.getpeername()[1]} answered without the job's secret "
                        "(another process holds the port?)")
    return buf


def accept_admitted(listener: socket.socket, key: bytes, deadline: float, rejected: list) -> tuple[socket.socket, bytearray] | None:
    """The next connection that proves the secret before the deadline; others are counted in rejected."""
    listener.settimeout(1.0)
    while time.monotonic() < deadline:
        try:
            conn, peer = listener.accept()
        except socket.timeout:
            continue
        buf = admit(conn, key)
        if buf is not None:
            return conn, buf
        rejected.append(peer[0])
    return None
