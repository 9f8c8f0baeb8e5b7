"""One bounded HTTP call to a judge (``judge.py``): ``reward_model.timeout_s`` bounds the WHOLE call (connect,
headers and every read of the body, not each socket read: a server dripping a byte at a time cannot hold a call
past it), a reply above ``MAX_REPLY_BYTES`` is refused, and every way a call can fail (an HTTP status, a refused
connection, a reply that is not HTTP, a body cut short, not JSON, too slow, too big) is one ``JudgeFailure`` whose
message names the cause, so the caller can retry it and, at the end, say why."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
import urllib.parse

MAX_REPLY_BYTES = 1 << 20  # a judge's chat reply is a few hundred bytes; anything near this is not a score
READ_CHUNK = 64 * 1024


class JudgeFailure(Exception):
    """One judge call that failed; ``str()`` is its cause in words, on one line (it ends up in the run's stop
    line)."""

    def __init__(self, cause: str) -> None:
        super().__init__(" ".join(str(cause).split()))


def _cut(connection: http.client.HTTPConnection) -> None:
    """The deadline passed: wake whatever read is blocked on the socket (a shutdown does; a close may not)."""
    sock = connection.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _read_body(reply: http.client.HTTPResponse, connection, deadline: float, max_bytes: int) -> bytes:
    """The reply's body, each read waiting at most until ``deadline``; refused above ``max_bytes``."""
    declared = reply.getheader("Content-Length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise JudgeFailure(f"reply of {int(declared)} bytes refused (the limit is {max_bytes})")
    body = bytearray()
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        if connection.sock is not None:
            connection.sock.settimeout(remaining)
        chunk = reply.read1(READ_CHUNK)
        if not chunk:
            break
        body += chunk
        if len(body) > max_bytes:
            raise JudgeFailure(f"reply longer than {max_bytes} bytes refused")
    if declared is not None and declared.isdigit() and len(body) < int(declared):
        raise JudgeFailure(f"reply cut short ({len(body)} of {int(declared)} bytes)")
    return bytes(body)


def call(url: str, body: dict | None, headers: dict, timeout_s: float,
         max_bytes: int = MAX_REPLY_BYTES) -> dict:
    """``url``'s JSON answer to ``body`` (POST; GET without one) within ``timeout_s`` in all, or ``JudgeFailure``."""
    parts = urllib.parse.urlsplit(url)
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    deadline = time.monotonic() + timeout_s
    connection = kind(parts.hostname or "", parts.port, timeout=timeout_s)
    timer = threading.Timer(timeout_s, _cut, (connection,))
    timer.daemon = True
    timer.start()
    try:
        data = None if body is None else json.dumps(body).encode()
        connection.request("GET" if data is None else "POST", target, body=data, headers=headers)
        reply = connection.getresponse()
        text = _read_body(reply, connection, deadline, max_bytes)
        if time.monotonic() >= deadline:
            raise TimeoutError
    except JudgeFailure:
        raise
    except (TimeoutError, socket.timeout):
        raise JudgeFailure(f"no complete reply within reward_model.timeout_s={timeout_s:g} s") from None
    except (http.client.HTTPException, OSError) as exc:
        if time.monotonic() >= deadline:  # the deadline cut the socket: say so, not what the cut looked like
            raise JudgeFailure(f"no complete reply within reward_model.timeout_s={timeout_s:g} s") from None
        if isinstance(exc, http.client.HTTPException):
            raise JudgeFailure(f"not an HTTP reply ({type(exc).__name__}: {str(exc)[:100]})") from None
        reason = getattr(exc, "strerror", None) or exc
        raise JudgeFailure(f"unreachable ({reason})") from None
    finally:
        timer.cancel()
        connection.close()
    if not 200 <= reply.status < 300:
        detail = text.decode(errors="replace").strip().replace("\n", " ")[:200]
        raise JudgeFailure(f"answered HTTP {reply.status}" + (f": {detail}" if detail else ""))
    try:
        return json.loads(text)
    except ValueError:
        raise JudgeFailure(f"answered {len(text)} bytes that are not JSON") from None
