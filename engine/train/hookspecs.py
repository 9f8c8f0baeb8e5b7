"""The hook a trainer plugin implements, added to the device plugins' manager (as rollout engines' is).

A distribution declares a module in the ``accel_backends`` entry-point group (or names it in
``ACCEL_BACKENDS_PLUGINS``); that module defines::

    @accel_backends.hookimpl
    def register_recipes(register):
        register("dpo", "my_package.dpo:DPORecipe")

GRPO and SFT are registered through the same hook (``builtin.py``).
"""

import sys

import accel_backends
from accel_backends import hookspec


@hookspec
def register_recipes(register):
    """Call ``register(name, recipe)`` once per trainer this plugin provides.

    ``recipe`` is a ``Recipe`` subclass, or the text ``"package.module:Attribute"`` naming one: it is imported only
    when that trainer runs, so registering stays cheap. A name registered twice is an error naming both plugins.
    """


accel_backends.add_hookspecs(sys.modules[__name__])
