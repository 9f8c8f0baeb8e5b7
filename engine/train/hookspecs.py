"""The hooks a trainer plugin implements, added to the device plugins' manager (as rollout engines' is).

A distribution declares a module in the ``accel_backends`` entry-point group (or names it in
``ACCEL_BACKENDS_PLUGINS``); that module defines::

    @accel_backends.hookimpl
    def register_recipes(register):
        register("dpo", "my_package.dpo:DPORecipe")

or, for an RL algorithm (one module, no recipe class: the one RL recipe runs it)::

    @accel_backends.hookimpl
    def register_algorithms(register):
        register("rloo", "my_package.rloo:RLOO")

The built-in trainers and algorithms are registered through the same hooks (``builtin.py``).
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


@hookspec
def register_algorithms(register):
    """Call ``register(name, algorithm)`` once per RL algorithm this plugin provides.

    ``algorithm`` is an ``engine.rl.Algorithm`` subclass, or the text ``"package.module:Class"`` naming one
    (imported only when it runs). Its class attributes give the command's help, schema, presets and checks
    (``engine/rl/registration.py``); ``accel-train NAME`` runs it on the one RL recipe. A name is one trainer's or
    one algorithm's: registered twice, it is an error naming both plugins.
    """


accel_backends.add_hookspecs(sys.modules[__name__])
