"""The one config pipeline every command goes through (train, ``--resume``, eval, the bench): ``load``. The schema,
presets, migrations and checks stay with each recipe; the steps (``config.py``) are the frame's."""

from __future__ import annotations


def load(recipe, preset: str | None, config_file: str | None, overrides: list[str], *, base=None,
         remember: bool = True):
    """The one config pipeline: ``base`` (a run's config, a model directory's preset) or the preset chosen by
    ``choose_preset``, then the YAML file, then the overrides, then the recipe's migrations; every path option
    made absolute (from the directory the command runs in). With ``remember``, a model directory's remembered
    prompt settings (``prompting.py``: an export's) fill the options the file and the overrides leave out.
    Returns ``(config, notices, why)``: the notices and why that preset applies."""
    import copy

    from . import prompting
    from .config import apply, build_config, choose_preset, parse_override, read_config_file, resolve_paths

    file_data = read_config_file(config_file) if config_file else {}
    if base is None:
        name, why = choose_preset(recipe.presets, preset, file_data, overrides)
        config = build_config(recipe.schema, recipe.presets, name, None, [])
    else:
        if preset:
            raise ValueError("--preset is for a new config: this one starts from an existing configuration")
        config, why = copy.deepcopy(base), "the run's own configuration"
    apply(config, file_data)
    parsed = [parse_override(override) for override in overrides]
    for override in parsed:
        apply(config, override)
    notices = recipe.migrate(config)
    resolve_paths(config, recipe.path_keys)
    if remember:
        notices += prompting.fill(config, recipe.prompt_keys(), [file_data, *parsed])
    return config, notices, why
