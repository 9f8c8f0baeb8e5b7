"""``DPOConfig``: the schema, presets and checks of ``accel-dpo``; the pipeline (preset, YAML file, ``key=value``
overrides) is the shared one of ``engine/train/config.py``, the ``data``/``train`` sections and their checks are
those of every trainer on preference pairs (``engine.offline``)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from accel_backends.names import not_one_of

from ....config import EngineConfig
from ....train import config as train_config
from ...pair_config import pair_config, pair_problems
from ...run_config import accelerator_presets, demo_preset
from .loss import LOSS_TYPES


@dataclasses.dataclass
class DPOSettings:
    beta: float = 0.1  # how far the policy may move from the reference (ipo: its regularisation tau)
    loss_type: str = "sigmoid"  # sigmoid (DPO), ipo, hinge: TRL's meanings (loss.py)
    label_smoothing: float = 0.0  # sigmoid: the probability that a label is flipped (conservative DPO)
    rpo_alpha: float = 0.0  # > 0: adds rpo_alpha x the NLL of the chosen responses (token mean over the step; RPO)
    ref_model: str | None = None  # the reference model directory (null: model.path, the model DPO starts from)
    ref_param_offload: bool = False  # keep the frozen reference in host memory between uses


DPOConfig = pair_config("DPOConfig", "dpo", DPOSettings, __name__)

PRESETS: dict[str, dict] = {
    "default": {"engine": {"lr": 1e-6, "lr_schedule": "cosine"}},  # the library defaults (TRL's lr)
    "cpu-demo": demo_preset(data={"demo_pairs": 1024}, train={"epochs": 1, "batch_size": 32, "micro_batch_tokens": 512},
                            run={"val_every": 10},
                            engine={"lr": 2e-3, "lr_schedule": "constant", "max_grad_norm": 1.0}),
    **accelerator_presets(max_length=2048, batch_size=64, micro_batch_tokens=16384, lr=1e-6, warmup_steps=10),
}


def reference_config(config: DPOConfig) -> EngineConfig:
    """The frozen reference engine's options: the policy's sharding, precision and attention, no optimizer."""
    keep = {"fsdp_version", "mixed_precision", "wrap_class_names", "dist_timeout_s", "seed", "attn_implementation",
            "sequence_parallel_size"}
    options = {k: v for k, v in config.engine.items() if k in keep}
    options.update(frozen=True, param_offload=config.dpo.ref_param_offload)
    return train_config.engine_options(options, {"seed": config.train.seed})


def check(config: DPOConfig, world_size: int) -> list[str]:
    """Every problem found from the options alone, one sentence each."""
    problems = pair_problems(config, world_size)
    s = config.dpo
    if s.loss_type not in LOSS_TYPES:
        problems.append(not_one_of("dpo.loss_type", s.loss_type, LOSS_TYPES))
    if not (isinstance(s.beta, (int, float)) and math.isfinite(s.beta) and s.beta > 0):
        problems.append(f"dpo.beta must be a number > 0, got {s.beta!r}")
    if not 0 <= s.label_smoothing < 0.5:
        problems.append(f"dpo.label_smoothing is the probability that a label is flipped: it must be in [0, 0.5), "
                        f"got {s.label_smoothing}")
    elif s.label_smoothing and s.loss_type != "sigmoid":
        problems.append(f"dpo.label_smoothing applies to dpo.loss_type=sigmoid only (TRL's meaning), not "
                        f"{s.loss_type}: set it to 0 or use sigmoid")
    if not (isinstance(s.rpo_alpha, (int, float)) and s.rpo_alpha >= 0):
        problems.append(f"dpo.rpo_alpha must be >= 0 (0: no NLL term), got {s.rpo_alpha!r}")
    if s.ref_model is not None and not (Path(s.ref_model) / "config.json").is_file():
        problems.append(f"dpo.ref_model {s.ref_model} is not a Hugging Face model directory (no config.json)")
    if s.ref_param_offload and s.ref_model is None and int(config.engine.get("lora_rank", 0) or 0) > 0:
        problems.append("dpo.ref_param_offload: with LoRA the reference is the policy's own base model (adapters "
                        "disabled), there is no reference copy to offload: leave it false (or offload the policy "
                        "with engine.param_offload)")
    return problems
