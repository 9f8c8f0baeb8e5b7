"""Where a weight group meets: the TCP store the trainer's rank 0 hosts, bound to the trainer's address alone, and
the proof each joining server worker gives that it holds the run's secret.

torch's ``TCPStore`` listens on every interface whatever host it is given, and serves anyone who connects (any
key read or written, no password). Here the trainer binds the listening socket itself, to its address
(``rollout.vllm.weight_transfer_address``, 127.0.0.1 by default), and hands it to the store. Then, per group:

- the trainer draws a nonce into the store (``host_store``) and the pusher tells each server, through its keyed
  HTTP route ``/init_weight_transfer_engine``, the store's address and the run's ``secret``;
- each worker writes ``HMAC(secret, nonce:rank)`` under its rank (``join``); the trainer reads every rank's proof
  and refuses the group, before any weight is sent, when one is not right (``admit``);
- the group itself meets under a key prefix derived from the secret and the nonce: a TCPStore cannot list its
  keys, so a peer without the secret cannot find, read or overwrite the group's rendezvous (its members'
  addresses).

Limits, said plainly: the secret travels in the body of a plain-HTTP request (on loopback by default); a process
that can reach the store can still write a wrong proof first, which stops the run (refused, never accepted); the
collective library's own connections (gloo's, NCCL's, HCCL's) carry no authentication of their own. Standard
library and torch only: this runs in the trainer and in vLLM's workers.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import secrets
import socket

NONCE_KEY = "accel-auth/nonce"
PROOF_KEY = "accel-auth/proof/{rank}"
GROUP_PREFIX = "accel-weights"


class RefusedPeer(PermissionError):
    """A peer joined the weight group's store without the run's secret."""


def new_secret() -> str:
    return secrets.token_hex(32)


def _digest(secret: str, message: str) -> str:
    return hmac.new(secret.encode(), message.encode(), hashlib.sha256).hexdigest()


def proof(secret: str, nonce: str, rank: int) -> str:
    """What worker ``rank`` writes to show it holds ``secret`` (bound to this group's nonce: not replayable)."""
    return _digest(secret, f"{nonce}:proof:{rank}")


def group_prefix(secret: str, nonce: str) -> str:
    """The key prefix the group meets under: unguessable without the secret."""
    return f"{GROUP_PREFIX}/{_digest(secret, f'{nonce}:group')[:32]}"


def host_store(address: str, world_size: int, timeout_s: float):
    """Rank 0's store, listening on ``address`` only (its ``.port``: the port it got), its nonce drawn; returns at
    once (the members join later)."""
    from torch.distributed import TCPStore

    from accel_backends.rendezvous import bound_listener  # the trainer's side only (a server worker never hosts)

    listener = bound_listener(address)
    port = listener.getsockname()[1]
    fd = listener.detach()  # the store owns the socket from here
    try:
        store = TCPStore(address, port, world_size, is_master=True, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=timeout_s), master_listen_fd=fd)
    except Exception:
        socket.close(fd)
        raise
    store.set(NONCE_KEY, secrets.token_hex(16))
    return store


def join(address: str, port: int, rank: int, secret: str, timeout_s: float):
    """A worker's side: connect to the trainer's store, write this rank's proof; the group's (prefixed) store."""
    from torch.distributed import PrefixStore, TCPStore

    store = TCPStore(address, port, is_master=False, timeout=datetime.timedelta(seconds=timeout_s))
    nonce = store.get(NONCE_KEY).decode()
    store.set(PROOF_KEY.format(rank=rank), proof(secret, nonce, rank))
    return PrefixStore(group_prefix(secret, nonce), store)


def admit(store, secret: str, ranks, timeout_s: float):
    """The trainer's side: wait for every rank's proof and check it; the group's (prefixed) store. A wrong proof
    raises ``RefusedPeer`` before the group exists (so before any weight moves)."""
    from torch.distributed import PrefixStore

    nonce = store.get(NONCE_KEY).decode()
    for rank in ranks:
        key = PROOF_KEY.format(rank=rank)
        store.wait([key], datetime.timedelta(seconds=timeout_s))
        if not hmac.compare_digest(store.get(key).decode(errors="replace"), proof(secret, nonce, rank)):
            raise RefusedPeer(f"a process without this run's secret joined the weight group's store at "
                              f"{_address(store)} as rank {rank}: refused before any weight was sent (something else "
                              "on this machine reached the store; see docs/security.md, 'What listens where')")
    return PrefixStore(group_prefix(secret, nonce), store)


def _address(store) -> str:
    return f"{getattr(store, 'host', '?')}:{getattr(store, 'port', '?')}"
