"""A complete third-party backend: it runs on the host, so subclassing ``CPUBackend`` is all it takes.

A plugin for a real device sets ``device_type``, ``dist_backend`` and ``priority`` on a ``DeviceBackend``
subclass and overrides only what its torch device module does not provide.
"""

import accel_backends
from accel_backends.backends.cpu import CPUBackend


class ExampleBackend(CPUBackend):
    name = "example"
    priority = -10  # below the built-in CPU backend: chosen only when asked for by name


@accel_backends.hookimpl
def register_backends(register):
    register(ExampleBackend())
