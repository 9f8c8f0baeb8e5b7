"""The hook a rollout-engine plugin implements, added to the device plugins' manager (as the engine's events are).

A plugin distribution declares a module in the ``accel_backends`` entry-point group (or is named in
``ACCEL_BACKENDS_PLUGINS``); that module imports this one first, then defines::

    @accel_backends.hookimpl
    def register_rollout_engines(register):
        register("vllm", "accel_vllm.engine:VLLMRolloutEngine")

The built-in ``hf`` and ``hf-continuous`` engines are registered through the same hook (``builtin.py``).
"""

import sys

import accel_backends
from accel_backends import hookspec


@hookspec
def register_rollout_engines(register):
    """Call ``register(name, engine)`` once per rollout engine this plugin provides.

    ``engine`` is a ``RolloutEngine`` subclass (or any callable taking a ``RolloutContext`` and returning an
    engine), or the text ``"package.module:Attribute"`` naming one: it is imported only when that engine is
    chosen (``rollout.engine``), so registering must stay cheap and import no inference library. A name
    registered twice is an error naming both plugins.
    """


accel_backends.add_hookspecs(sys.modules[__name__])
