"""``RewardModelConfig``: the schema, presets and checks of ``accel-rm``; the ``data``/``train`` sections and their
checks are those of every trainer on preference pairs (``engine.offline``)."""

from __future__ import annotations

import dataclasses
import math

from ...pair_config import pair_config, pair_problems
from ...run_config import accelerator_presets, demo_preset


@dataclasses.dataclass
class RewardSettings:
    margin_key: str | None = None  # a column of per-pair margins the chosen reward must clear (null: none)
    center_rewards_coef: float = 0.0  # > 0: adds coef x (r_chosen + r_rejected)^2, rewards centred on 0


RewardModelConfig = pair_config("RewardModelConfig", "rm", RewardSettings, __name__)

PRESETS: dict[str, dict] = {
    "default": {"engine": {"lr": 1e-4, "lr_schedule": "cosine"}},  # the library defaults (TRL's lr)
    # A new head starts from nothing and must read a two-token number 4 tokens back: two passes in steps of 16 pairs
    # (115 steps), warmed up and decayed (a constant 5e-3 over 86 steps of 32 was chaotic: its grad norm reached 15
    # and runs that differed only in summation order ended at 0.79 and 0.93).
    "cpu-demo": demo_preset(data={"demo_pairs": 1024}, train={"epochs": 2, "batch_size": 16, "micro_batch_tokens": 512},
                            run={"val_every": 29},
                            engine={"lr": 3e-3, "lr_schedule": "cosine", "warmup_steps": 10, "max_grad_norm": 1.0}),
    **accelerator_presets(max_length=2048, batch_size=64, micro_batch_tokens=16384, lr=1e-5, warmup_steps=10),
}


def check(config: RewardModelConfig, world_size: int) -> list[str]:
    """Every problem found from the options alone, one sentence each (each sequence carries one extra token: the
    one its score is read before, ``model.py``)."""
    problems = pair_problems(config, world_size, extra_tokens=1)
    coef = config.rm.center_rewards_coef
    if not (isinstance(coef, (int, float)) and math.isfinite(coef) and coef >= 0):
        problems.append(f"rm.center_rewards_coef must be a number >= 0 (0: none), got {coef!r}")
    key = config.rm.margin_key
    if key is not None and (not isinstance(key, str) or not key):
        problems.append(f"rm.margin_key must name a column of the data (or be null), got {key!r}")
    if int(config.engine.get("lora_rank", 0) or 0) > 0:
        problems.append("engine.lora_rank: a reward model trains its new score head and the model in full; LoRA is "
                        "not supported by accel-rm: set engine.lora_rank=0")
    return problems
