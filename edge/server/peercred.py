"""The uid of the process at the other end of a Unix socket (Linux SO_PEERCRED)."""

from __future__ import annotations

import socket
import struct

_UCRED = struct.Struct("3i")  # pid, uid, gid


def peer_uid(sock: socket.socket | None) -> int | None:
    if sock is None or not hasattr(socket, "SO_PEERCRED"):
        return None
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    except OSError:
        return None
    _pid, uid, _gid = _UCRED.unpack(raw)
    return uid
