"""The hook a device plugin implements.

A plugin is any module or object holding functions marked with ``@accel_backends.hookimpl``. Built-in backends
are plugins too: they use the same ``register_backends`` hook as a third-party distribution.

This module specifies only what the device layer needs: the backends, and extra rules for its conformance kit.
Layers above add their own hook specifications to the same plugin manager with
``accel_backends.add_hookspecs(module)``: the engine's observer events (``on_mode_switch``, ``on_transfer``,
``on_optimizer_step``) live in ``engine/hookspecs.py``, so this package knows nothing of engines.
"""

import pluggy

PROJECT_NAME = "accel_backends"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def register_backends(register):
    """Call ``register(backend)`` once per ``DeviceBackend`` instance this plugin provides.

    ``register(backend, replace=True)`` replaces a built-in backend of the same name; without ``replace`` a name
    clash is an error. Constructing a backend must be cheap and must not import vendor packages.
    """


@hookspec
def register_conformance_rules(register):
    """Call ``register(rule)`` once per extra ``accel_backends.testing.Rule`` the conformance kit should check.

    This is how a layer above adds rules about itself without this package importing it: the engine's rules
    (``engine-fsdp2``, ``engine-fsdp1``: one training step of the real engine on the backend; ``engine-packing``:
    the backend's attention keeps packed sequences apart) come from the engine's ``accel_backends.conformance``
    entry point. Such plugins load only when the kit runs.
    """


@hookspec
def register_certify_properties(register):
    """Call ``register(prop)`` once per ``accel_backends.testing.certify.Property`` of the report card for
    on-policy RL (``accel-backends certify NAME``), in the order the card lists them.

    The engine's properties (reductions, offload on uneven shards, gradients against a float64 reference, packed
    against padded, deferred against every-micro-batch sync, checkpoints, weight pushes and the log-prob gap, the
    same seed twice) come from ``engine/certify.py`` through the same ``accel_backends.conformance`` entry point as
    its conformance rules, loaded only when a card is made.
    """
