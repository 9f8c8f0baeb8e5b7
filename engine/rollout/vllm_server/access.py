"""Who may reach the vLLM servers a run starts: the address they listen on and the key every request must carry.

Every server (the rollout servers of ``rollout.vllm.mode=server``, the judge of ``reward_model.judge_model``)
listens on 127.0.0.1 unless the user names a host (``rollout.vllm.host``, ``reward_model.judge_host``), and is
started with a key the run draws (``new_key``), given in its environment (``VLLM_API_KEY``: not on the command
line, where ``ps`` would show it). vLLM's own check of that key covers only the paths under ``/v1``, ``/v2``,
``/inference`` and ``/cohere`` (vLLM 0.32, ``entrypoints/serve/middleware/authenticate.py``): its development
routes (``/collective_rpc``, ``/server_info``, the RL routes ``/pause``, ``/update_weights``...), ``/tokenize``,
``/health`` and ``/invocations`` answer without it. So each server also loads ``KeyMiddleware`` (vLLM's
``--middleware``), which refuses every request without the key, whatever its path. Clients send it as
``Authorization: Bearer <key>`` (``auth_headers``). See docs/security.md, "What listens where".
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import re
import secrets

KEY_ENV = "VLLM_API_KEY"  # vLLM reads its key here too (its /v1 check); KeyMiddleware reads the same
DEV_MODE_ENV = "VLLM_SERVER_DEV_MODE"  # vLLM's development and RL routes: only where the weight wire needs them
LOOPBACK = "127.0.0.1"
MIDDLEWARE = "engine.rollout.vllm_server.access.KeyMiddleware"
_WILDCARDS = {"0.0.0.0": "127.0.0.1", "::": "::1"}  # every interface: this machine reaches it on loopback
_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")


def new_key() -> str:
    """A fresh key for one run's servers (256 random bits)."""
    return secrets.token_urlsafe(32)


def auth_headers(key: str | None) -> dict[str, str]:
    """The request headers of a JSON call, with the key where there is one."""
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    return headers


def host_problem(key: str, value) -> str | None:
    """A sentence when ``value`` (config key ``key``) is not an address or host name a server can listen on."""
    if isinstance(value, str) and value:
        try:
            ipaddress.ip_address(value)
            return None
        except ValueError:
            labels = value.rstrip(".").split(".")
            if len(value) <= 253 and all(_LABEL.fullmatch(label) for label in labels) and \
                    not labels[-1].isdigit():
                return None
    return (f"{key} must be an IP address or host name of this machine to listen on (127.0.0.1: this machine "
            f"only; 0.0.0.0: every interface, reachable by anyone on the network), got {value!r}")


def managed_argument_problems(key: str, arguments, instead: dict[str, str]) -> list[str]:
    """Api_server arguments in ``key`` (``rollout.vllm.server_args``...) that would undo where a server listens or
    its key: a later ``--host`` wins over the run's, ``--api-key`` replaces the run's key in vLLM's own check.
    ``instead``: the config key to use for host and port."""
    if not isinstance(arguments, dict):
        return []
    named = {str(name).replace("-", "_"): str(name) for name in arguments}
    found = []
    for name, use in ((n, instead.get(n)) for n in ("host", "port", "api_key")):
        if name in named:
            what = f"set {use}" if use else "the run draws a key for its servers and sends it itself"
            found.append(f"{key}.{named[name]}: {what} (a server's address and key are not api_server arguments "
                         "here)")
    return found


def url_for(host: str, port: int) -> str:
    """The base URL this machine reaches a server listening on ``host``:``port`` by."""
    host = _WILDCARDS.get(host, host)
    try:
        literal = ipaddress.ip_address(host).version == 6
    except ValueError:
        literal = False
    return f"http://{'[' + host + ']' if literal else host}:{port}"


class KeyMiddleware:
    """ASGI middleware loaded into a vLLM server (``--middleware``): every HTTP request and websocket must carry
    ``Authorization: Bearer <KEY_ENV's value>``, or is refused (401; a websocket is closed). A server started
    without the key refuses everything: it fails closed. Standard library only."""

    def __init__(self, app) -> None:
        self.app = app
        key = os.environ.get(KEY_ENV, "")
        self.digest = hashlib.sha256(key.encode()).digest() if key else None

    def allowed(self, scope) -> bool:
        if self.digest is None:
            return False
        for name, value in scope.get("headers", ()):
            if name.lower() == b"authorization":
                scheme, _, token = value.decode("latin-1").partition(" ")
                if scheme.lower() == "bearer":
                    return secrets.compare_digest(hashlib.sha256(token.strip().encode()).digest(), self.digest)
        return False

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] not in ("http", "websocket") or self.allowed(scope):
            await self.app(scope, receive, send)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
        else:
            body = json.dumps({"error": "Unauthorized: this server wants its run's API key "
                                        "(Authorization: Bearer ...)"}).encode()
            await send({"type": "http.response.start", "status": 401,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode()),
                                    (b"www-authenticate", b"Bearer")]})
            await send({"type": "http.response.body", "body": body})
