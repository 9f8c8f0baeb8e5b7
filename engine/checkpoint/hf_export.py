"""Hugging Face export: full weights gathered to rank 0, written as safetensors with the model's config."""

from __future__ import annotations

import shutil

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from .store import checkpoint_directory, on_device


def _peft_config(engine):
    for module in engine.module.modules():
        configs = getattr(module, "peft_config", None)
        if isinstance(configs, dict) and configs:
            return next(iter(configs.items()))
    return None


def merge_lora_weights(state: dict[str, torch.Tensor], adapter: str, scaling: float) -> dict[str, torch.Tensor]:
    """Fold ``W + scaling * B @ A`` into each base weight and return plain model names."""
    merged = {}
    for key, value in state.items():
        if ".lora_" in key:
            continue
        name = key.removeprefix("base_model.model.")
        if ".base_layer." in key:
            prefix, _, leaf = key.rpartition(".base_layer.")
            name = name.replace(".base_layer.", ".")
            if leaf == "weight":
                a = state[f"{prefix}.lora_A.{adapter}.weight"].float()
                b = state[f"{prefix}.lora_B.{adapter}.weight"].float()
                value = (value.float() + scaling * (b @ a)).to(value.dtype)
        merged[name] = value
    return merged


def export_hf(engine, path, merge_lora: bool = True) -> None:
    """Gather full weights to rank 0 and write them as safetensors with the model's config."""
    path = checkpoint_directory(path)
    with on_device(engine):
        # FSDP1 crashes offloading a full state dict "to the CPU" when it already is there: only offload from a device.
        on_host = engine.backend.device().type == "cpu"
        options = StateDictOptions(full_state_dict=True, cpu_offload=not on_host)
        full = get_model_state_dict(engine.module, options=options)
    if engine.rank == 0:
        from safetensors.torch import save_file

        partial = path.with_name(path.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        peft = _peft_config(engine)
        if peft is None:
            tensors, filename = full, "model.safetensors"
        else:
            adapter, config = peft
            scaling = config.lora_alpha / (config.r ** 0.5 if config.use_rslora else config.r)
            if merge_lora:
                tensors, filename = merge_lora_weights(full, adapter, scaling), "model.safetensors"
            else:
                tensors = {k.replace(f".{adapter}.", "."): v for k, v in full.items() if ".lora_" in k}
                filename = "adapter_model.safetensors"
                config.save_pretrained(str(partial))
        seen, unique = set(), {}
        for name, tensor in tensors.items():  # tied weights appear twice; keep the first
            if tensor.data_ptr() not in seen:
                seen.add(tensor.data_ptr())
                unique[name] = tensor.contiguous()
        save_file(unique, str(partial / filename), metadata={"format": "pt"})
        if engine.model_config is not None and (peft is None or merge_lora):
            engine.model_config.save_pretrained(str(partial))
        shutil.rmtree(path, ignore_errors=True)
        partial.rename(path)
    dist.barrier()
