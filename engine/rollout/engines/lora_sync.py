"""``rollout.vllm.lora_sync``: how a LoRA policy's updates reach vLLM, and the adapter as vLLM loads it.

``merged``: the adapter folded into the base weights, the whole model pushed after every update (vLLM serves a
plain model). ``adapter``: vLLM serves the base model with LoRA enabled; the base weights go once (at the start, or
on resume), then after every update only the adapter, as a new versioned adapter (``accel-policy-v<N>``), the
previous ones unloaded. ``auto`` chooses by ``choose``'s rule (docs/perf.md, "LoRA with vLLM"). Pure logic and
files, no vLLM: the trainer and the servers' workers (which write an adapter they received) both use it.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

MODES = ("auto", "merged", "adapter")
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's max_lora_rank values (config/lora.py)
LORA_SLOTS = 2  # the adapter being pushed and the previous one (requests sent just before a push still name it)
ADAPTER_PREFIX = "accel-policy-"
# auto's rule, measured (docs/perf.md, "LoRA with vLLM"): adapter mode saves push time that grows with the model
# (the whole model against the adapter) and costs decode time that grows with the model and with the tokens decoded
# between two updates (vLLM's LoRA kernels decode slower than merged weights: 0.34-0.35 of merged mode's tokens/s
# on vLLM's CPU build, rank 8). The model's size cancels, so the step's tokens decide: adapter mode pays while an
# engine copy decodes at most this many tokens per update (break-even 43 tokens on hidden 512 x 8 layers, 78 on
# hidden 1024 x 16: accel-bench --scenarios lora_sync). Not measured on a GPU, where the decode penalty is smaller
# and a full push dearer: there adapter mode, chosen explicitly, may pay far sooner.
AUTO_MAX_DECODED_TOKENS = 64


def vllm_max_lora_rank(rank: int) -> int:
    """The smallest of vLLM's ``max_lora_rank`` values that holds ``rank``."""
    for allowed in VLLM_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ValueError(f"engine.lora_rank={rank} is larger than vLLM's largest max_lora_rank, {VLLM_LORA_RANKS[-1]}")


def problems(mode, lora_rank: int, own_wire: bool = True) -> list[str]:
    """``rollout.vllm.lora_sync``'s problems, as sentences."""
    if mode not in MODES:
        return [f"rollout.vllm.lora_sync must be one of {', '.join(MODES)}, got {mode!r}"]
    if mode != "adapter":
        return []
    if not lora_rank:
        return ["rollout.vllm.lora_sync=adapter pushes a LoRA adapter: it needs engine.lora_rank > 0 (this run "
                "trains the full model); set lora_sync to merged or auto"]
    if lora_rank > VLLM_LORA_RANKS[-1]:
        return [f"rollout.vllm.lora_sync=adapter: engine.lora_rank={lora_rank} is larger than vLLM's largest "
                f"max_lora_rank, {VLLM_LORA_RANKS[-1]}; use lora_sync=merged"]
    if not own_wire:
        return ["rollout.vllm.lora_sync=adapter needs this package's weight-transfer engine (adapters travel over "
                "its weight group): leave rollout.vllm.weight_transfer null, or use lora_sync=merged"]
    return []


def choose(mode: str, lora_rank: int, base_params: int | None, decoded_tokens: int | None,
           own_wire: bool = True) -> str:
    """``merged`` or ``adapter``. ``auto``: adapter when the policy is LoRA, its rank fits vLLM, adapters can
    travel (this package's engine) and an engine copy decodes at most ``AUTO_MAX_DECODED_TOKENS`` tokens between
    two updates (``decoded_tokens``; unknown: merged, as before there was a choice). ``base_params``: the base
    model's size, which the rule does not need (it cancels) but a zero-sized model refuses."""
    if mode != "auto":
        return mode
    if not lora_rank or lora_rank > VLLM_LORA_RANKS[-1] or not own_wire or not base_params or not decoded_tokens:
        return "merged"
    return "adapter" if decoded_tokens <= AUTO_MAX_DECODED_TOKENS else "merged"


def adapter_name(version: int, session: str = "") -> str:
    """``accel-policy-v3``; with a ``session`` (one trainer run against long-lived servers): ``accel-policy-ab12-v3``,
    so that another run's names never collide with this one's."""
    return f"{ADAPTER_PREFIX}{session + '-' if session else ''}v{version}"


def version_of(name: str) -> int:
    return int(name.rsplit("v", 1)[1])


def adapter_config(peft_config) -> dict:
    """A PEFT ``LoraConfig`` as the JSON of ``adapter_config.json`` (sets as sorted lists)."""
    fields = peft_config.to_dict()
    return {key: sorted(value) if isinstance(value, set) else value for key, value in fields.items()}


def write_adapter(directory: str | os.PathLike, tensors: dict[str, torch.Tensor], config: dict) -> Path:
    """A PEFT adapter directory (``adapter_config.json``, ``adapter_model.safetensors``) at ``directory``, written
    whole before it is renamed into place (a reader never sees half an adapter)."""
    from safetensors.torch import save_file

    directory = Path(directory)
    partial = directory.with_name(directory.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    (partial / "adapter_config.json").write_text(json.dumps(config, indent=1))
    save_file({name: tensor.detach().cpu().contiguous() for name, tensor in tensors.items()},
              str(partial / "adapter_model.safetensors"))
    shutil.rmtree(directory, ignore_errors=True)
    partial.rename(directory)
    return directory


def version_directory(root: str | os.PathLike, version: int) -> Path:
    return Path(root) / f"v{version}"


def prune(root: str | os.PathLike, keep_from: int) -> None:
    """Remove the adapter directories under ``root`` older than version ``keep_from``."""
    root = Path(root)
    if not root.is_dir():
        return
    for entry in root.iterdir():
        version = entry.name.removeprefix("v")
        if entry.name.startswith("v") and version.isdigit() and int(version) < keep_from:
            shutil.rmtree(entry, ignore_errors=True)
