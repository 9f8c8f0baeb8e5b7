"""Device backends for hardware-portable training, found and selected through pluggy.

    >>> import accel_backends
    >>> backend = accel_backends.get_backend()      # ACCEL_BACKEND, else the best available device
    >>> backend.name, backend.device(), backend.dist_backend
"""

# ruff: noqa: E402 - torch is imported through the guard below before any module of this package imports it
from .torch_import import import_torch

import_torch()  # before anything imports torch: a broken device-backend autoload gets a diagnosis, not a traceback

from .base import DeviceBackend, InferenceEngineFacts, SequenceParallelFacts, WeightGroup
from .distributed import DistributedInfo
from .errors import (
    AccelBackendError,
    BackendNotFoundError,
    BackendRegistrationError,
    BackendUnavailableError,
    DistributedSetupError,
)
from .hookspecs import hookimpl, hookspec
from .memory import MemoryStats
from .registry import (
    BackendInfo,
    PluginLoadWarning,
    add_hookspecs,
    get_backend,
    hook,
    list_backends,
    plugin_failures,
    register_plugin,
    reset_registry,
    unregister_plugin,
)

__all__ = [
    "AccelBackendError",
    "BackendInfo",
    "BackendNotFoundError",
    "BackendRegistrationError",
    "BackendUnavailableError",
    "DeviceBackend",
    "DistributedInfo",
    "DistributedSetupError",
    "InferenceEngineFacts",
    "MemoryStats",
    "PluginLoadWarning",
    "SequenceParallelFacts",
    "WeightGroup",
    "add_hookspecs",
    "get_backend",
    "hook",
    "hookimpl",
    "hookspec",
    "list_backends",
    "plugin_failures",
    "register_plugin",
    "reset_registry",
    "unregister_plugin",
]
