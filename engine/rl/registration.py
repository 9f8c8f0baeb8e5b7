"""What the one RL recipe (``recipe.py``) reads from a registered algorithm's class: its command's name and help,
its config schema and presets, its checks, what ``--resume`` may not change, its curves and its sub-commands. A
plugin registers an ``Algorithm`` subclass (``register_algorithms``), so an algorithm is one module, no recipe
class; ``Algorithm`` derives from ``Registered`` and every default below is the RL layer's."""

from __future__ import annotations


class Registered:
    """Class attributes and class methods: read before any worker starts (no instance is made for them)."""

    tool = ""  # the command's name in messages ("": ``accel-train <name>``)
    help = ""  # the command's --help text
    schema: type | None = None  # the config root: an ``RLConfig`` with its own ``algorithm`` section
    presets: dict[str, dict] = {"default": {}}
    curves: tuple[tuple[str, str], ...] = ()  # curves.png's (metric, title) panels; (): the RL layer's
    sections = ""  # the YAML file's sections, for --help ("": the RL layer's)
    example = ""  # a pair of overrides, for --help ("": the RL layer's)
    path_keys: tuple[str, ...] = ()  # options holding a path, beyond the RL layer's
    resume_fixed: dict[str, str] = {}  # what ``--resume`` may not change, beyond the RL layer's

    @classmethod
    def check(cls, config, world_size: int, tool: str) -> list[str]:
        """Every problem found from the options alone, one sentence each: the RL layer's shared sections."""
        from .checks import problems

        return problems(config, world_size, tool)

    @classmethod
    def migrate(cls, config) -> list[str]:
        """Deprecated keys moved to their new names; notices for the user."""
        return []

    @classmethod
    def load_inputs(cls, config, verbose: bool):
        """The run's inputs (``parts.load_inputs``), read before any worker starts."""
        from .parts import load_inputs

        return load_inputs(config, verbose=verbose)

    @classmethod
    def commands(cls) -> dict:
        """Sub-commands of its own (``export`` and ``eval`` are the frame's)."""
        return {}

    @classmethod
    def curves_for(cls, config) -> tuple[tuple[str, str], ...] | None:
        """The curves of a run with ``config`` (None: ``curves``)."""
        return None

    @classmethod
    def eval_offload(cls, config) -> bool:
        """Whether ``eval``'s model keeps its parameters in host memory between uses."""
        return False
