"""What ``accel-sft eval`` scores (the frame's eval command, ``engine/train/evaluate.py``, does the rest): loss and
token accuracy on a validation set, summed over its supervised tokens on every rank (the same figures as a run's
``val/loss`` and ``val/mean_token_accuracy``).

The validation set is ``data.val_path``, else the run's own (its ``data.val_path`` or ``data.val_fraction``, or the
demo task's held-out share). And what an SFT run remembers in an export (``prompt_settings``): the system message
every training conversation began with, and its longest trained response as the generation limit.
"""

from __future__ import annotations

from ....train.recipe import Evaluation
from .config import check

HELP = """accel-sft eval scores a validation set: val/loss and val/mean_token_accuracy over its supervised tokens (as
a run's validation), val/num_tokens.

example:
  accel-sft eval runs/NAME data.val_path=val.jsonl --json val.json"""


def evaluation_set(config, tokenizer):
    """The tokenized examples to evaluate: ``data.val_path`` alone, or the run's held-out share."""
    import copy

    from .dataset import build_data

    d = config.data
    if d.val_path:
        alone = copy.deepcopy(d)
        alone.path, alone.val_path, alone.val_fraction = d.val_path, None, 0.0
        return build_data(alone, config.train.loss_on, tokenizer, config.train.seed).train
    return build_data(d, config.train.loss_on, tokenizer, config.train.seed).val


def problems(config, target: dict, world_size: int) -> list[str]:
    """A model directory needs ``data.val_path``; a run its own validation set or one given; the options as a run
    checks them."""
    if "model" in target and not config.data.val_path:
        return ["evaluating a model directory needs data.val_path=FILE"]
    if "run" in target and config.data.path and not (config.data.val_path or config.data.val_fraction):
        return [f"run {target['run']} has no validation set: pass data.val_path=FILE"]
    return check(config, world_size)


def load_inputs(config) -> dict:
    """Every validation row read and tokenized here, so that a bad one fails before any worker starts."""
    from ...model_files import load_tokenizer

    examples = evaluation_set(config, load_tokenizer(config.model.path))
    if not examples:
        raise ValueError("the validation set is empty")
    return {"examples": len(examples)}


def evaluate(config, checkpoint: str | None, backend) -> Evaluation:
    """The validation set scored on this rank's micro-batches, forward only (``checkpoint``: a run's, loaded into
    the run's model whatever world size wrote it; a run trained with sequence parallelism evaluates on slices, as it
    validated); the figures are the global sums' ratios."""
    from ....train.recipe import Plan
    from ...model_files import load_tokenizer
    from ...step import score
    from .trainer import parts_of

    items = evaluation_set(config, load_tokenizer(config.model.path))
    parts = parts_of(Plan(config, 0, 1, {}), backend, checkpoint)
    parts.plan.world_size = parts.world_size
    return Evaluation(metrics=score(parts, items))


def prompt_settings(config) -> dict:
    """How the run's data prompted the model: the system message every training conversation began with (none
    when they differ) and the longest supervised span trained, in tokens, as ``max_new_tokens``. {} when the data
    cannot be read any more."""
    from ...model_files import load_tokenizer
    from .data import DataError
    from .dataset import build_data

    try:
        data = build_data(config.data, config.train.loss_on, load_tokenizer(config.model.path), config.train.seed)
    except (DataError, OSError, ValueError):
        return {}
    if data.format == "text":
        return {}  # plain text: no prompt, no response
    longest = max((_longest_span(item.mask) for item in data.train), default=0)
    return {"system_prompt": data.system_prompt, "max_new_tokens": longest or None}


def _longest_span(mask: list[int]) -> int:
    best = run = 0
    for value in mask:
        run = run + 1 if value else 0
        best = max(best, run)
    return best
