"""``<trainer> export RUN_DIR|CHECKPOINT OUT``: a run's checkpoint as a Hugging Face model directory. The run's
``config.json`` is read with its trainer's schema (``read_run_config``) and the recipe says what model it trained
(``Recipe.run_model``: a ``RunModel``, the model and its engine options); the rest is shared.

The checkpoint's weights are read in full by this one process (``engine.checkpoint.read_model_state``: no process
group, whatever world size wrote them, optimizer state left alone), put into the run's model built on the meta
device, and saved with ``save_pretrained``: ``config.json``, safetensors weights, and the tokenizer files, chat
template and ``generation_config.json`` of the model the run trained (copied as they are), then how the run prompted
it (``prompting.py``: the system prompt as the template's default, ``max_new_tokens``, ``accel_prompting.json``).
LoRA runs are merged into the base weights (``--lora merged``, the default) or written as a PEFT adapter directory
(``--lora adapter``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from .. import EngineConfig, apply_lora, checkpoint
from ..checkpoint import META_FILE, STEP_DIRECTORY
from . import prompting
from .run_dir import unwritable

EXPORT_MARKER = ".accel-export"  # in every directory export writes: the only kind --force replaces
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
# Files of a model directory that describe how to talk to the model, copied verbatim into an export.
MODEL_FILES = ("tokenizer*", "special_tokens_map.json", "added_tokens.json", "vocab.*", "merges.txt", "*.tiktoken",
               "chat_template*", "generation_config.json")


class ExportError(ValueError):
    """Bad input to export or eval: the message says what is wrong; nothing was written."""


@dataclasses.dataclass
class RunModel:
    """What an export needs of a run: its model, its engine options (LoRA), and how to build the model."""

    model_path: str | None  # the local model directory it trained; None: a model built in code
    engine: EngineConfig
    build: Callable[[], tuple[Any, Any]]  # () -> (tokenizer, a model factory or a model directory)
    loader: str = "AutoModelForCausalLM"  # the transformers class that loads the export (its last line says so)
    prompt: dict = dataclasses.field(default_factory=dict)  # how the run prompted it (``Recipe.prompt_settings``)


LEGACY_TRAINER = "grpo"  # a run from before config.json named its trainer was a GRPO run


def read_run_config(run_dir: Path, recipe):
    """The configuration a run was started with (its ``config.json``), read with ``recipe``'s schema; a run of
    another trainer is named (with the command that reads it), not misread."""
    try:
        data = json.loads((run_dir / "config.json").read_text())
    except ValueError as exc:
        raise ExportError(f"{run_dir / 'config.json'} is not valid JSON: {exc}") from exc
    recorded = data.get("trainer", LEGACY_TRAINER)
    if recorded != recipe.name:
        raise ExportError(f"{run_dir} is an accel-{recorded} run: use accel-{recorded} export (or accel-{recorded} "
                          "eval)")
    try:
        return recipe.schema.from_dict(data)
    except (ValueError, TypeError) as exc:
        raise ExportError(f"{run_dir / 'config.json'} is not a readable {recipe.tool} config: {exc}") from exc


def run_loader(recipe) -> Callable[[Path], RunModel]:
    """``run_dir -> RunModel``: the run's model as ``recipe`` builds it, with how the run prompted it (from its
    recorded config and ``derived`` section), for an export to remember."""
    def load_run(run_dir: Path) -> RunModel:
        config = read_run_config(run_dir, recipe)
        run = recipe.run_model(config)
        derived = json.loads((run_dir / "config.json").read_text()).get("derived") or {}
        run.prompt = recipe.prompt_settings(config, derived)
        return run

    return load_run


def locate(source, step: int | None = None) -> tuple[Path, Path]:
    """``(run directory, checkpoint directory)`` for a run directory (its newest complete checkpoint, or ``step``)
    or a checkpoint directory inside a run (``<run>/checkpoints/step_N``)."""
    source = Path(source)
    if not source.is_dir():
        raise ExportError(f"{source} does not exist or is not a directory: pass a run directory or one of its "
                          "checkpoints/step_N directories")
    if (source / "config.json").is_file() and (source / "checkpoints").is_dir():
        directory = source / "checkpoints"
        if step is None:
            found = checkpoint.latest_complete(directory)
            if found is None:
                raise ExportError(f"run {source} has no complete checkpoint in {directory}")
            return source, found
        for name in (f"step_{step:06d}", f"step_{step:06d}.old"):
            if (directory / name / META_FILE).is_file():
                return source, directory / name
        have = ", ".join(str(checkpoint.step_of(p)) for p in reversed(checkpoint.complete_checkpoints(directory)))
        raise ExportError(f"run {source} has no complete checkpoint of step {step} (complete: {have or 'none'})")
    if STEP_DIRECTORY.fullmatch(source.name) or source.name.endswith(".partial") or (source / ".metadata").exists():
        if step is not None:
            raise ExportError("--step chooses among a run's checkpoints: pass the run directory with --step, or the "
                              "checkpoint directory alone")
        if not (source / META_FILE).is_file():
            raise ExportError(f"{source} is an incomplete checkpoint (no {META_FILE}: its save did not finish); "
                              "export a complete one")
        run_dir = source.parent.parent
        if not (run_dir / "config.json").is_file():
            raise ExportError(f"{source} is not inside a run directory (no {run_dir / 'config.json'} describing its "
                              "model)")
        return run_dir, source
    raise ExportError(f"{source} is neither a run directory (config.json and checkpoints/) nor a checkpoint "
                      "(checkpoints/step_N with engine_meta.json)")


def default_dtype(run: RunModel) -> str:
    """The dtype the trained model came in: bf16 when its ``config.json`` says bfloat16, else fp32."""
    if run.model_path is None:
        return "fp32"
    saved = json.loads((Path(run.model_path) / "config.json").read_text())
    return "bf16" if (saved.get("dtype") or saved.get("torch_dtype")) == "bfloat16" else "fp32"


def check_output(out: Path, force: bool, found: Path) -> None:
    """``out`` is new, empty, or (with ``force``) an earlier export: the directory an export wrote, with its
    ``EXPORT_MARKER``. Nothing else is ever replaced: not a run, not a folder of runs, not the checkpoint read."""
    if out.exists() and not out.is_dir():
        raise ExportError(f"output {out} is a file: pass a directory")
    if not out.is_dir() or not any(out.iterdir()):
        return
    if Path(found).resolve().is_relative_to(out.resolve()):
        raise ExportError(f"output directory {out} holds the checkpoint being exported ({found}): choose another OUT")
    if (out / EXPORT_MARKER).is_file():
        if not force:
            raise ExportError(f"output directory {out} holds an earlier export: choose another OUT or pass --force "
                              "to replace it")
        return
    what = ("is a run directory" if _is_run(out) else "holds runs" if any(map(_is_run, _subdirectories(out)))
            else "is not empty")
    raise ExportError(f"output directory {out} {what} and is not an earlier export: choose another OUT (--force "
                      f"replaces only a directory an export wrote, which holds {EXPORT_MARKER})")


def _is_run(directory: Path) -> bool:
    return (directory / "config.json").is_file() and (directory / "checkpoints").is_dir()


def _subdirectories(directory: Path) -> list[Path]:
    return [path for path in directory.iterdir() if path.is_dir()]


def trained_model(run: RunModel, state: dict[str, torch.Tensor]):
    """``(model, tokenizer)``: the run's model (wrapped by LoRA as the run had it) holding the checkpoint's weights."""
    from transformers import AutoConfig, AutoModelForCausalLM

    tokenizer, source = run.build()
    with torch.device("meta"):  # no memory, no random init: every weight comes from the checkpoint
        if callable(source):
            model = source()
        else:
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(source), dtype=torch.float32)
        if run.engine.lora_rank > 0:
            model = apply_lora(model, run.engine)
    try:
        model.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as exc:
        raise checkpoint.CorruptCheckpoint(f"the checkpoint does not fit the run's model: {str(exc)[:500]}") from exc
    if getattr(model.config, "tie_word_embeddings", False):
        model.tie_weights()
    return model, tokenizer


def export(source, out, load_run: Callable[[Path], RunModel], *, step: int | None = None, dtype: str | None = None,
           lora: str = "merged", force: bool = False) -> dict:
    """Write the checkpoint as a Hugging Face model directory (or a PEFT adapter) at ``out``; return a summary.

    Every check comes first: on bad input nothing is written or deleted. The directory appears complete or not at
    all (it is written next to ``out`` and renamed into place).
    """
    out = Path(out)
    run_dir, found = locate(source, step)
    run = load_run(run_dir)
    if lora not in ("merged", "adapter"):
        raise ExportError(f"--lora must be merged or adapter, got {lora!r}")
    if dtype is not None and dtype not in DTYPES:
        raise ExportError(f"--dtype must be bf16 or fp32, got {dtype!r}")
    lora_rank, model_path = run.engine.lora_rank, run.model_path
    if lora == "adapter" and not lora_rank:
        raise ExportError(f"--lora adapter: run {run_dir} trained the full model (engine.lora_rank=0), there is no "
                          "adapter: export without --lora")
    if lora == "adapter" and model_path is None:
        raise ExportError("--lora adapter needs a base model directory to apply it to; the built-in model has none: "
                          "use --lora merged")
    if model_path is not None and not (Path(model_path) / "config.json").is_file():
        raise ExportError(f"the run's model.path {model_path} (its model's config and tokenizer) is not there "
                          "any more: put the model directory back at that path")
    check_output(out, force, found)
    dtype = dtype or default_dtype(run)
    policy = checkpoint.policy_checkpoint(found)  # a run training several engines exports its policy
    checkpoint.checkpoint_meta(policy)  # complete, and every file has the size its save recorded

    from transformers.utils import logging

    logging.disable_progress_bar()
    model, tokenizer = trained_model(run, checkpoint.read_model_state(policy))
    if lora_rank and lora == "merged":
        model = model.merge_and_unload()  # W + scale * B @ A in fp32, before any cast
    model.to(DTYPES[dtype])
    if lora == "adapter":
        model.peft_config["default"].base_model_name_or_path = str(Path(model_path).resolve())
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f"{out.name}.partial-{os.getpid()}-{time.time_ns()}")
    partial.mkdir()  # a new directory: nothing of the user's is touched (and its mode is the umask's, as out's)
    try:
        model.save_pretrained(str(partial))
        tokenizer.save_pretrained(str(partial))
        if model_path is not None:
            for pattern in MODEL_FILES:  # as the trained model had them (save_pretrained may rewrite or drop keys)
                for file in Path(model_path).glob(pattern):
                    if file.is_file():
                        shutil.copy2(file, partial / file.name)
        prompting.write(partial, run.prompt)  # the system prompt, template choice and length it trained with
        (partial / EXPORT_MARKER).write_text(json.dumps({"checkpoint": str(found)}) + "\n")  # --force may replace it
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    if out.exists():
        check_output(out, True, found)  # still empty or an earlier export, just before it goes
        shutil.rmtree(out)
    partial.rename(out)
    return {"checkpoint": str(found), "step": checkpoint.step_of(found), "output": str(out), "dtype": dtype,
            "lora": lora if lora_rank else None,
            "files": sorted(p.name for p in out.iterdir() if p.name != EXPORT_MARKER),
            "builtin_model": model_path is None, "loader": run.loader}


EXPORT_HELP = """Write a run's checkpoint as a Hugging Face model directory: config.json, safetensors weights, and the
tokenizer files, chat template and generation config of the model the run trained, with how the run prompted it
(its system prompt as the chat template's default, max_new_tokens in generation_config.json, accel_prompting.json:
eval and a run started from the directory use them unless told otherwise). This one process reads the
checkpoint whatever number of processes wrote it. A LoRA run is merged into the base weights (--lora merged, the
default) or written as a PEFT adapter directory (--lora adapter)."""


def main(argv: list[str], load_run: Callable[[Path], RunModel], tool: str = "accel-grpo") -> int:
    parser = argparse.ArgumentParser(prog=f"{tool} export", description=EXPORT_HELP,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", metavar="RUN_DIR|CHECKPOINT",
                        help="a run directory (its newest complete checkpoint) or a checkpoints/step_N directory")
    parser.add_argument("out", metavar="OUT", help="the model directory to write")
    parser.add_argument("--step", type=int, help="the checkpoint of this step (with a run directory)")
    parser.add_argument("--dtype", choices=sorted(DTYPES),
                        help="weights' dtype (default: the trained model's, from its config.json: bf16 for "
                             "bfloat16, else fp32)")
    parser.add_argument("--lora", choices=("merged", "adapter"), default="merged",
                        help="a LoRA run: adapters merged into the base weights (default), or a PEFT adapter "
                             "directory")
    parser.add_argument("--force", action="store_true",
                        help=f"replace OUT when it holds an earlier export (its {EXPORT_MARKER} file); never a run "
                             "directory, a folder of runs or anything else")
    args = parser.parse_args(argv)
    try:
        summary = export(args.source, args.out, load_run, step=args.step, dtype=args.dtype, lora=args.lora,
                         force=args.force)
    except (ExportError, FileNotFoundError, checkpoint.CorruptCheckpoint, checkpoint.UnsafeCheckpoint) as exc:
        print(f"{tool} export: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # OUT read-only, a full disk: one line (the partial directory is gone)
        print(f"{tool} export: error: {unwritable(args.out, exc, 'OUT')}", file=sys.stderr)
        return 1
    kind = {"adapter": "a PEFT adapter", "merged": "LoRA merged"}.get(summary["lora"], "full model")
    loader = "PeftModel.from_pretrained(base, OUT)" if summary["lora"] == "adapter" else \
        f"{summary['loader']}.from_pretrained(OUT)"
    if summary["builtin_model"]:
        # transformers 5 gives every qwen2 model its Qwen2Tokenizer in AutoTokenizer, which cannot read a
        # character vocabulary; the tokenizer class the file names reads it as trained.
        loader += " and PreTrainedTokenizerFast.from_pretrained(OUT) (the built-in character tokenizer)"
    print(f"{tool} export: wrote {summary['output']} from {summary['checkpoint']} (step {summary['step']}, "
          f"{kind}, {summary['dtype']}): {', '.join(summary['files'])}; load with {loader}")
    return 0
