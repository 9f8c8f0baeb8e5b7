"""``count``: a tiny causal LM learns to continue runs of consecutive token ids (5 6 7 8 ...), with the next-token
loss. Everything a run needs beyond this file (the loop, checkpoints and resume, the config pipeline, loggers,
the commands) comes from the frame."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import torch

from engine import FSDPEngine
from engine.tiny_model import tiny_qwen2
from engine.train import ConfigRoot, ModelConfig, Plan, Recipe, RunConfig, StepResult, engine_options


@dataclasses.dataclass
class DataConfig:
    vocab: int = 32  # token ids 0..vocab-1; a run counts modulo vocab
    length: int = 16  # tokens per sequence
    batch_size: int = 8  # sequences per step over all ranks


@dataclasses.dataclass
class TrainConfig:
    steps: int = 20
    seed: int = 0


@dataclasses.dataclass
class CountConfig(ConfigRoot):
    preset: str = "default"
    nproc: int | str = "auto"
    model: ModelConfig = dataclasses.field(default_factory=lambda: ModelConfig(hidden_size=32, layers=2))
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    run: RunConfig = dataclasses.field(default_factory=RunConfig)
    engine: dict[str, Any] = dataclasses.field(default_factory=lambda: {"lr": 1e-2})
    trainer: str = "count"


@dataclasses.dataclass
class Parts:
    engine: FSDPEngine
    config: CountConfig


class CountRecipe(Recipe):
    name, tool, schema = "count", "accel-train count", CountConfig
    presets = {"default": {}, "cpu-demo": {"nproc": 2}}
    curves = (("loss", "next-token loss"), ("grad_norm", "grad norm"))
    sections, example = "model, data, train, run, engine", "train.steps=5 data.length=8"
    help = "Teach a tiny model to count (an example trainer from its own package)."

    def check(self, config, world_size):
        problems = []
        if config.data.batch_size % world_size:
            problems.append(f"data.batch_size={config.data.batch_size} does not divide over {world_size} ranks")
        if config.data.vocab < 2 or config.data.length < 2:
            problems.append("data.vocab and data.length must be at least 2")
        return problems

    def plan(self, config, world_size, *, verbose):
        per_rank = config.data.batch_size // world_size
        return Plan(config, world_size, config.train.steps, {"world_size": world_size, "sequences_per_rank": per_rank})

    def resolved(self, plan):
        return {**plan.config.to_dict(), "engine": dataclasses.asdict(self.engine_config(plan)),
                "derived": plan.derived}

    def engine_config(self, plan):
        return engine_options(dict(plan.config.engine), {"seed": plan.config.train.seed,
                                                         "total_steps": plan.total_steps})

    def build(self, plan, backend):
        m, d = plan.config.model, plan.config.data

        def model():
            return tiny_qwen2(seed=plan.config.train.seed, vocab_size=d.vocab, hidden_size=m.hidden_size,
                              layers=m.layers, max_positions=d.length)

        return Parts(FSDPEngine(model, self.engine_config(plan), backend), plan.config)

    def step(self, parts, index):
        d, engine = parts.config.data, parts.engine
        rows = d.batch_size // engine.world_size
        generator = torch.Generator().manual_seed(parts.config.train.seed * 7919 + index * 31 + engine.rank)
        starts = torch.randint(0, d.vocab, (rows, 1), generator=generator)
        ids = (starts + torch.arange(d.length)) % d.vocab
        started = time.perf_counter()
        with engine.train_mode():
            result = engine.forward_backward_batch([ids], _next_token_loss)
            grad_norm = engine.optimizer_step()
        row = {"loss": result["loss"], "grad_norm": grad_norm, "step_time_s": time.perf_counter() - started}
        return StepResult(metrics=lambda totals, _: {**row, "sequences": totals["sequences"]},
                          sums={"sequences": float(rows)}, shown=lambda r: {"loss": f"{r['loss']:.3f}"})

    def done_line(self, rows, seconds):
        return f"{self.tool}: loss {rows[0]['loss']:.3f} -> {rows[-1]['loss']:.3f} in {seconds:.0f} s" if rows else None


def _next_token_loss(module, ids):
    ids = ids.to(next(module.parameters()).device)
    return module(input_ids=ids, labels=ids).loss, ids.numel()
