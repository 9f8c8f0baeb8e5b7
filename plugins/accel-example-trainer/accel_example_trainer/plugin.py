"""The plugin module the entry point names: it registers a trainer (``count``, a recipe of the frame) and an RL
algorithm (``rloo``, one module: the one RL recipe runs it) by name, cheaply (their modules are imported only when
``accel-train count`` or ``accel-train rloo`` runs).

The hooks are the training frame's (``engine/train/hookspecs.py``). It is marked ``optionalhook`` instead of importing
the engine here: this module is loaded wherever the plugin registry is built (``accel-backends list`` too), and
pluggy checks it against the frame's specification as soon as ``engine.train`` is imported.
"""

import accel_backends

hookimpl = accel_backends.hookimpl(optionalhook=True)  # the training frame specifies these hooks (see above)


@hookimpl
def register_recipes(register):
    register("count", "accel_example_trainer.recipe:CountRecipe")


@hookimpl
def register_algorithms(register):
    register("rloo", "accel_example_trainer.rloo:RLOO")
