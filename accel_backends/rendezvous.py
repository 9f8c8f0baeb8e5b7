"""Where the ranks of a job meet: the TCP store rank 0 hosts, listening on ``MASTER_ADDR`` alone.

torch's ``env://`` rendezvous has rank 0 start a ``TCPStore`` that binds every interface whatever host it is
given (``::``, so a job started with ``MASTER_ADDR=127.0.0.1`` is reachable from the network, and the store serves
any key to anyone). Here rank 0 binds the listening socket itself, to ``MASTER_ADDR``'s address and
``MASTER_PORT``, and hands it to the store (``master_listen_fd``, in torch since 2.1, 2.10 and 2.13 alike); the
other ranks connect as ``env://`` would. A real address (several nodes) is bound the same way: the store listens
there, and on no other interface. Under torchrun's agent store (``TORCHELASTIC_USE_AGENT_STORE``) the agent hosts
it and every rank is a client, as torch does.
"""

from __future__ import annotations

import datetime
import os
import socket
from urllib.parse import urlparse

from .errors import DistributedSetupError

SCHEME = "accel-env"  # env://'s variables, a store that listens on MASTER_ADDR alone


def bound_listener(address: str, port: int = 0) -> socket.socket:
    """A TCP socket listening on ``address`` alone (port 0: one the kernel picks). ``SO_REUSEADDR`` as torch's
    own store sets it, so a port a finished job used can be bound again at once."""
    family, kind, proto, _, sockaddr = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)[0]
    listener = socket.socket(family, kind, proto)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(sockaddr)
        listener.listen(128)
    except OSError:
        listener.close()
        raise
    return listener


def _master(environ) -> tuple[str, int]:
    address, raw_port = environ.get("MASTER_ADDR"), environ.get("MASTER_PORT")
    if not address or not raw_port:
        raise DistributedSetupError("MASTER_ADDR and MASTER_PORT must both be set for a job of several processes "
                                    "(torchrun sets them; --master-addr / --master-port)")
    try:
        return address, int(raw_port)
    except ValueError:
        raise DistributedSetupError(f"MASTER_PORT={raw_port!r} is not an integer") from None


def job_store(rank: int, world_size: int, timeout: datetime.timedelta, environ=None):
    """The job's store for ``rank``: rank 0 hosts it on ``MASTER_ADDR`` only (unless torchrun's agent hosts it),
    the others join it."""
    from torch.distributed import TCPStore

    environ = os.environ if environ is None else environ
    address, port = _master(environ)
    agent_hosts = environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() in ("1", "true")
    if rank != 0 or agent_hosts:
        return TCPStore(address, port, world_size, is_master=False, timeout=timeout)
    try:
        listener = bound_listener(address, port)
    except OSError as exc:
        raise DistributedSetupError(
            f"rank 0 cannot listen on MASTER_ADDR={address} MASTER_PORT={port} ({exc.strerror or exc}): rank 0 hosts "
            "the job's rendezvous store there, so MASTER_ADDR must be an address of rank 0's machine and the port "
            "free (127.0.0.1 for one machine)") from None
    fd = listener.detach()  # the store owns the socket from here
    try:
        return TCPStore(address, port, world_size, is_master=True, timeout=timeout, master_listen_fd=fd)
    except BaseException:
        socket.close(fd)
        raise


def _handler(url: str, timeout: datetime.timedelta = datetime.timedelta(seconds=300), **_):
    """torch's rendezvous handler protocol: yield ``(store, rank, world_size)`` once (torch puts the default
    group's ``default_pg`` prefix on the store itself, as for ``env://``)."""
    query = dict(part.split("=", 1) for part in urlparse(url).query.split("&") if "=" in part)
    rank, world_size = int(query["rank"]), int(query["world_size"])
    yield job_store(rank, world_size, timeout), rank, world_size
    raise DistributedSetupError(f"{SCHEME}:// cannot rendezvous again (the job's store is fixed at its start)")


def init_method() -> str:
    """The ``init_method`` for ``init_process_group``: ``env://``'s variables, this module's store (registered
    with torch on first use; the store is made inside ``init_process_group``, as ``env://``'s is)."""
    from torch.distributed import register_rendezvous_handler

    try:
        register_rendezvous_handler(SCHEME, _handler)
    except RuntimeError:  # registered already in this process
        pass
    return f"{SCHEME}://"
