"""``accel-backends smoke``: can every rank of a torchrun job reach every other through the selected backend?

Run it on every node under torchrun before a long multi-node job. Each rank joins the group through its backend's
``init_distributed()`` (so the backend's collective defaults and device binding apply, exactly as in training),
then: a small all-reduce whose sum is checked, a larger all-reduce (``--size-mb``) timed over ``--iters`` rounds
for the bus bandwidth and checked too, and an all-gather of every rank's host and device. Rank 0 prints one table
and a verdict; the exit status is 0 only when every check held.
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import sys
import time

from .distributed import read_launcher_env
from .errors import AccelBackendError

HOW_TO_RUN = ("run it on every node with torchrun, e.g. torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d "
              "--rdzv-endpoint HOST:29500 -m accel_backends smoke")
_LABEL_BYTES = 256  # room for "host|device" of one rank in the all-gather


class SmokeError(AccelBackendError):
    """The smoke test could not start or a rank could not join the group."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", nargs="?", help="backend to use (default: ACCEL_BACKEND, else auto-detected)")
    parser.add_argument("--size-mb", type=float, default=64.0,
                        help="size of the timed all-reduce in MiB (default 64)")
    parser.add_argument("--iters", type=int, default=5, help="timed all-reduce rounds (default 5)")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds to wait for every rank to join and for each collective (default 300)")


def run(args: argparse.Namespace) -> int:
    """One rank's part of the smoke test; returns the exit status (the same on every rank)."""
    info = read_launcher_env()
    if not info.launched:
        raise SmokeError(f"not started by torchrun (RANK, WORLD_SIZE, MASTER_ADDR... are not set): {HOW_TO_RUN}")
    if args.size_mb <= 0 or args.iters < 1 or args.timeout <= 0:
        raise SmokeError("--size-mb and --timeout must be positive and --iters at least 1")
    import torch
    import torch.distributed as dist

    from .registry import registry

    backend = registry().select(args.name)
    start = time.perf_counter()
    try:
        backend.init_distributed(datetime.timedelta(seconds=args.timeout))
    except AccelBackendError:
        raise  # already says what is wrong (an unusable backend, too few devices for LOCAL_RANK...)
    except Exception as exc:
        raise SmokeError(
            f"rank {info.rank} of {info.world_size} could not join the '{backend.dist_backend}' group at "
            f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')} within {args.timeout:g} s "
            f"({type(exc).__name__}: {_first_line(exc)}): check that every node started the same command, that "
            "the address is reachable from every node, and the network interface variables "
            "(docs/multi-node.md)") from None
    joined_s = time.perf_counter() - start
    try:
        device = backend.device()
        world = dist.get_world_size()
        results = {"join_s": joined_s}

        small = torch.tensor([float(info.rank + 1)], device=device)
        dist.all_reduce(small)
        expected_small = world * (world + 1) / 2
        results["small_ok"] = float(small.item()) == expected_small

        numel = max(1, int(args.size_mb * 2**20) // 4)
        large = torch.full((numel,), float(info.rank + 1), dtype=torch.float32, device=device)
        dist.all_reduce(large)  # also the warm-up of the timed rounds
        results["large_ok"] = bool((large == expected_small).all().item())
        large.zero_()
        backend.synchronize()
        dist.barrier()
        begin = time.perf_counter()
        for _ in range(args.iters):
            dist.all_reduce(large)
        backend.synchronize()
        seconds = (time.perf_counter() - begin) / args.iters
        results["allreduce_s"] = seconds
        results["bus_gbps"] = bus_bandwidth(numel * 4, seconds, world)

        labels = gather_labels(f"{socket.gethostname()}|{device}", device, world)
    except Exception as exc:
        raise SmokeError(f"rank {info.rank}: a collective failed or timed out after joining "
                         f"({type(exc).__name__}: {_first_line(exc)}); --timeout {args.timeout:g} s") from None
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    if info.rank == 0:
        print(report(backend, labels, results, args, expected_small))
    return 0 if results["small_ok"] and results["large_ok"] and len(labels) == world else 1


def bus_bandwidth(nbytes: int, seconds: float, world: int) -> float:
    """All-reduce bus bandwidth in GB/s: data size / time x 2(n-1)/n, the figure nccl-tests reports."""
    if seconds <= 0:
        return float("inf")
    return nbytes / seconds * (2 * (world - 1) / world) / 1e9


def gather_labels(label: str, device, world: int) -> list[str]:
    """Every rank's label, in rank order, through a fixed-size byte tensor (works on every backend)."""
    import torch
    import torch.distributed as dist

    data = label.encode()[:_LABEL_BYTES]
    row = torch.zeros(_LABEL_BYTES, dtype=torch.uint8)
    row[: len(data)] = torch.tensor(list(data), dtype=torch.uint8)
    row = row.to(device)
    rows = [torch.empty_like(row) for _ in range(world)]
    dist.all_gather(rows, row)
    return [bytes(r.cpu().tolist()).rstrip(b"\0").decode(errors="replace") for r in rows]


def hosts_table(labels: list[str]) -> list[tuple[str, list[int], list[str]]]:
    """(host, its ranks, their devices) in order of each host's first rank."""
    hosts: dict[str, tuple[list[int], list[str]]] = {}
    for rank, label in enumerate(labels):
        host, _, device = label.partition("|")
        ranks, devices = hosts.setdefault(host, ([], []))
        ranks.append(rank)
        devices.append(device)
    return [(host, ranks, devices) for host, (ranks, devices) in hosts.items()]


def _span(ranks: list[int]) -> str:
    return f"{ranks[0]}-{ranks[-1]}" if ranks == list(range(ranks[0], ranks[-1] + 1)) and len(ranks) > 1 \
        else ",".join(map(str, ranks))


def report(backend, labels: list[str], results: dict, args: argparse.Namespace, expected_small: float) -> str:
    """Rank 0's table and verdict."""
    world = len(labels)
    table = hosts_table(labels)
    rows = [("HOST", "RANKS", "COUNT", "DEVICES")]
    rows += [(host, _span(ranks), str(len(ranks)), " ".join(sorted(set(devices), key=devices.index)))
             for host, ranks, devices in table]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = [f"accel-backends smoke: backend {backend.name} ({backend.dist_backend}), {world} ranks on "
             f"{len(table)} host(s), joined in {results['join_s']:.1f} s", ""]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row[:3], widths, strict=True)) + "  " + row[3]
              for row in rows]
    small = "ok" if results["small_ok"] else "WRONG"
    large = "ok" if results["large_ok"] else "WRONG"
    lines += ["",
              f"all-reduce of each rank's rank+1: {small} (expected {expected_small:g})",
              f"all-reduce of {args.size_mb:g} MiB: {large}; {results['allreduce_s'] * 1e3:.2f} ms per round over "
              f"{args.iters} rounds, bus bandwidth {results['bus_gbps']:.2f} GB/s"]
    failed = [name for name, ok in (("small all-reduce", results["small_ok"]),
                                    ("large all-reduce", results["large_ok"])) if not ok]
    if failed:
        lines.append(f"verdict: FAILED ({', '.join(failed)} gave a wrong sum)")
    else:
        lines.append(f"verdict: OK: {world} ranks on {len(table)} host(s) reach each other through "
                     f"{backend.dist_backend}")
    return "\n".join(lines)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else "no message"


def main(argv: list[str] | None = None) -> int:
    """``python -m accel_backends.smoke`` (the same as ``accel-backends smoke``)."""
    parser = argparse.ArgumentParser(prog="accel-backends smoke", description=__doc__)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except AccelBackendError as exc:
        print(f"accel-backends smoke: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
