"""The TCP listeners of given processes, read from /proc (Linux): which address each listens on.

A machine-wide ``ss -ltn`` also shows every other process's listeners (other tests, other users); this looks only
at sockets whose inodes the given processes hold, so a test asserts about its own server and nothing else."""

from __future__ import annotations

import ipaddress
import os
import re

_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's "st" column


def _socket_inodes(pids) -> set[str]:
    inodes = set()
    for pid in pids:
        try:
            names = os.listdir(f"/proc/{pid}/fd")
        except (FileNotFoundError, PermissionError):
            continue
        for name in names:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{name}")
            except OSError:
                continue
            found = re.fullmatch(r"socket:\[(\d+)\]", link)
            if found:
                inodes.add(found.group(1))
    return inodes


def _address(hex_address: str) -> str:
    """/proc/net/tcp{,6}'s address (32-bit words in host order, little-endian here) as text."""
    raw = bytes.fromhex(hex_address)
    ordered = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(ordered))


def listening(pids) -> list[tuple[str, int]]:
    """``(address, port)`` of every TCP socket the processes ``pids`` listen on."""
    inodes, found = _socket_inodes(pids), []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == _LISTEN and inode in inodes:
                address, port = local.rsplit(":", 1)
                found.append((_address(address), int(port, 16)))
    return found


def exposed(pids) -> list[tuple[str, int]]:
    """The listeners of ``pids`` on an address other machines could reach (not loopback)."""
    return [(address, port) for address, port in listening(pids) if not _loopback(address)]


def _loopback(address: str) -> bool:
    parsed = ipaddress.ip_address(address)
    return (getattr(parsed, "ipv4_mapped", None) or parsed).is_loopback


def process_group(group: int) -> list[int]:
    """The pids in process group ``group`` (a server and its workers under the guard)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getpgid(int(entry)) == group:
                    pids.append(int(entry))
            except (ProcessLookupError, PermissionError):
                continue
    return pids
