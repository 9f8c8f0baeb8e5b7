"""The plugin module the entry point names: it registers the trainer by name, cheaply (the recipe's module is
imported only when ``accel-train count`` runs)."""

import accel_backends
from engine.train import hookspecs  # noqa: F401 - specifies register_recipes before this module implements it


@accel_backends.hookimpl
def register_recipes(register):
    register("count", "accel_example_trainer.recipe:CountRecipe")
