"""The plugin module the entry point names: it registers the trainer by name, cheaply (the recipe's module is
imported only when ``accel-train count`` runs).

The hook is the training frame's (``engine/train/hookspecs.py``). It is marked ``optionalhook`` instead of importing
the engine here: this module is loaded wherever the plugin registry is built (``accel-backends list`` too), and
pluggy checks it against the frame's specification as soon as ``engine.train`` is imported.
"""

import accel_backends

hookimpl = accel_backends.hookimpl(optionalhook=True)  # the training frame specifies this hook (see above)


@hookimpl
def register_recipes(register):
    register("count", "accel_example_trainer.recipe:CountRecipe")
