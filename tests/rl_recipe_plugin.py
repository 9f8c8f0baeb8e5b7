"""A second RL recipe from a plugin (docs/adding-a-trainer.md): registers ``rloo``, whose whole code is its
algorithm, schema and presets (``rl_recipe_example.py``). Installed, it is an entry point's module; a test
registers it at run time (``accel_backends.register_plugin``); ``ACCEL_BACKENDS_PLUGINS=rl_recipe_plugin`` loads it
from the path. It imports nothing of the engine: the registry imports the recipe only when it is used."""

import accel_backends

hookimpl = accel_backends.hookimpl(optionalhook=True)


@hookimpl
def register_recipes(register):
    register("rloo", "rl_recipe_example:RLOORecipe")
