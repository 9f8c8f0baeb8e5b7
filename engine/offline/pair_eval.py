"""What the trainers on preference pairs hand the frame's ``eval`` command (``engine/train/evaluate.py``): the loss
and metrics of a model over held-out pairs, the same figures as a run's ``val/*``.

The pairs are ``data.val_path``, else the run's own held-out share (its ``data.val_path`` or ``data.val_fraction``,
or the demo task's). A run's checkpoint reaches the recipe's ``evaluate`` exported as a model directory (LoRA
merged); a model directory as it is.
"""

from __future__ import annotations

HELP = """{tool} eval scores held-out preference pairs: val/loss and the run's validation metrics ({metrics}) over
every pair, val/pairs.

example:
  {tool} eval runs/NAME data.val_path=val.jsonl --json val.json"""


def problems(config, target: dict) -> list[str]:
    """A model directory needs ``data.val_path``; a run its own held-out pairs or ones given."""
    d = config.data
    if "model" in target and not d.val_path:
        return ["evaluating a model directory needs data.val_path=FILE"]
    if "run" in target and d.path and not (d.val_path or d.val_fraction):  # the demo task holds some out
        return [f"run {target['run']} has no validation set: pass data.val_path=FILE"]
    return []


def evaluation_set(config, margin_key: str | None = None) -> list:
    """The tokenized pairs an eval scores; a bad row fails here in one line."""
    from .model_files import load_tokenizer, resolve_model_path
    from .pair_data import evaluation_pairs

    resolve_model_path(config)
    return evaluation_pairs(config.data, load_tokenizer(config.model.path), config.train.seed, margin_key)


def inputs(config, margin_key: str | None = None) -> dict:
    """Every held-out pair read and tokenized in the launching process: results.json's ``pairs``."""
    pairs = evaluation_set(config, margin_key)
    if not pairs:
        raise ValueError("the validation set is empty")
    return {"pairs": len(pairs)}
