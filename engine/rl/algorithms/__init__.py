"""The built-in RL algorithms, one package each (``grpo``, ``ppo``, ``distill``): the algorithm (``Algorithm``, its
registration in its class attributes), its schema and presets, its checks and help, and what only it uses. They are
registered by name through ``register_algorithms`` (``engine/train/builtin.py``), as a plugin's are. The formulas
module that had this path is ``engine/rl/formulas.py`` (public as ``engine.grpo.algorithms``)."""
