"""``pair``: a recipe training two engines at once (a policy and a critic, both tiny causal LMs learning to count),
registered through ``ACCEL_BACKENDS_PLUGINS=two_engines``, to check the frame's checkpoint of every trained engine.
``PAIR_KILL=RANK:STEP`` makes rank RANK SIGKILL itself at step STEP's save, after the policy's part is saved and
before the critic's starts: a real kill between the two engines' saves."""

from __future__ import annotations

import dataclasses
import os
import signal
from typing import Any

import torch

import accel_backends
from engine import FSDPEngine
from engine.tiny_model import tiny_qwen2
from engine.train import ConfigRoot, ModelConfig, Plan, Recipe, RunConfig, StepResult, engine_options

hookimpl = accel_backends.hookimpl(optionalhook=True)


@hookimpl
def register_recipes(register):
    register("pair", "two_engines:PairRecipe")


@dataclasses.dataclass
class TrainConfig:
    steps: int = 4
    seed: int = 0


@dataclasses.dataclass
class PairConfig(ConfigRoot):
    preset: str = "default"
    nproc: int | str = 2
    model: ModelConfig = dataclasses.field(default_factory=lambda: ModelConfig(hidden_size=16, layers=1))
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    run: RunConfig = dataclasses.field(default_factory=RunConfig)
    engine: dict[str, Any] = dataclasses.field(default_factory=lambda: {"lr": 1e-2})
    trainer: str = "pair"


@dataclasses.dataclass
class Parts:
    engines: dict
    config: PairConfig

    @property
    def engine(self):
        return self.engines["policy"]


def _dying_save(engine, step: int, rank: int):
    save = engine.save_checkpoint

    def save_checkpoint(path):
        if engine.rank == rank and engine.global_step == step:
            os.kill(os.getpid(), signal.SIGKILL)  # the policy's part of this step is on disk, the critic's is not
        save(path)

    return save_checkpoint


class PairRecipe(Recipe):
    name, tool, schema = "pair", "accel-train pair", PairConfig
    presets = {"default": {}, "cpu-demo": {}}
    curves = (("loss", "policy loss"), ("critic_loss", "critic loss"))

    def plan(self, config, world_size, *, verbose):
        return Plan(config, world_size, config.train.steps, {"world_size": world_size})

    def resolved(self, plan):
        return {**plan.config.to_dict(), "derived": plan.derived}

    def build(self, plan, backend):
        m, seed = plan.config.model, plan.config.train.seed
        engines = {}
        for index, name in enumerate(("policy", "critic")):
            def model(index=index):
                return tiny_qwen2(seed=seed + index, vocab_size=16, hidden_size=m.hidden_size, layers=m.layers,
                                  max_positions=8)

            lr = 1e-2 if name == "policy" else 3e-2  # each its own optimizer and learning rate
            engines[name] = FSDPEngine(model, engine_options(dict(plan.config.engine, lr=lr),
                                                             {"seed": seed, "total_steps": plan.total_steps}), backend)
        kill = os.environ.get("PAIR_KILL")
        if kill:
            rank, step = (int(x) for x in kill.split(":"))
            engines["critic"].save_checkpoint = _dying_save(engines["critic"], step, rank)
        return Parts(engines, plan.config)

    def step(self, parts, index):
        row = {}
        for name, engine in parts.engines.items():
            generator = torch.Generator().manual_seed(index * 31 + engine.rank + (7 if name == "critic" else 0))
            ids = (torch.randint(0, 16, (2, 1), generator=generator) + torch.arange(8)) % 16
            with engine.train_mode():
                result = engine.forward_backward_batch([ids], _next_token_loss)
                engine.optimizer_step()
            row["loss" if name == "policy" else "critic_loss"] = result["loss"]
        return StepResult(metrics=lambda totals, _: dict(row), sums={}, shown=lambda r: {})


def _next_token_loss(module, ids):
    ids = ids.to(next(module.parameters()).device)
    return module(input_ids=ids, labels=ids).loss, ids.numel()
