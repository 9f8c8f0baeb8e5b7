"""A third party's RL algorithm as one module, no recipe class (the example plugin's ``rloo``,
plugins/accel-example-trainer/accel_example_trainer/rloo.py: RLOO advantages, a policy gradient and a KL term to a
frozen reference), registered through ``register_algorithms`` by the plugin's entry-point module, runs on the one RL
recipe through the frame's command (one rank, in this process: the RL step on 2 ranks is GRPO's tests'): the step's
figures come out, the samples carry RLOO's advantages, the reference's KL and its forward's time are reported, and
the shared sections are checked before any worker starts. docs/adding-a-trainer.md is built on it."""

import json
import sys
from pathlib import Path

import pytest

import accel_backends

PLUGIN_SOURCE = str(Path(__file__).resolve().parents[2] / "plugins" / "accel-example-trainer")
sys.path.insert(0, PLUGIN_SOURCE)
try:
    from accel_example_trainer import plugin  # the plugin's source, not installed
    from accel_example_trainer.rloo import RLOO
finally:  # left on the path, a copy built in place (its egg-info) would register the plugin for every later test
    sys.path.remove(PLUGIN_SOURCE)


@pytest.fixture
def registered(monkeypatch):
    """The plugin's entry-point module registered for the test (the workers find the algorithm by its name)."""
    monkeypatch.syspath_prepend(PLUGIN_SOURCE)  # its registrations name modules the registry imports when asked
    if plugin in accel_backends.registry.registry().plugin_manager.get_plugins():
        yield  # found already as an entry point (the plugin built in place by another test puts its metadata here)
        return
    accel_backends.register_plugin(plugin)
    yield
    accel_backends.unregister_plugin(plugin)


def test_an_rl_recipe_of_its_algorithm_alone_trains(registered, tmp_path, monkeypatch):
    from engine.rl.recipe import RLRecipe
    from engine.train import cli
    from engine.train.registry import get_recipe

    monkeypatch.setenv("ACCEL_BACKEND", "cpu")
    recipe = get_recipe("rloo")  # the one RL recipe, bound to the registered algorithm
    assert type(recipe) is RLRecipe and recipe.algorithm is RLOO and recipe.tool == "accel-train rloo"
    code = cli.main(get_recipe("rloo"), ["--preset", "cpu-demo", "--nproc", "1", "run.progress=false",
                                         f"run.output_dir={tmp_path}", "run.name=rloo", "run.log_samples=4"])
    assert code == 0
    run = tmp_path / "rloo"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2]
    for row in rows:
        assert row["kl"] >= 0.0 and row["grad_norm"] > 0.0 and "pg_loss" in row and "reward/echo_reward" in row
        assert row["frozen/ref_s"] > 0.0  # the step times every frozen model's forward
    assert rows[1]["kl"] > 0.0  # the policy moved away from its reference after the first update
    for row in rows:  # MFU per phase on the CPU (its peak measured by a GEMM probe): the update's is the headline
        assert 0.0 < row["perf/mfu"] == row["perf/mfu/update"] < 1.0
        for phase in ("update", "rollout", "ref_log_probs"):
            assert row[f"perf/mfu/{phase}"] > 0.0 and row[f"perf/tflops/{phase}"] > 0.0, phase
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 2 * 4 * 4  # 2 steps, 4 prompts, 4 responses each
    assert any(s["advantage"] != 0.0 for s in samples)
    for start in range(0, len(samples), 4):
        group = samples[start:start + 4]
        total = sum(s["reward"] for s in group)
        for s in group:  # the score less the mean of the other three
            assert s["advantage"] == pytest.approx(s["reward"] - (total - s["reward"]) / 3, abs=1e-5)
    assert (run / "checkpoints" / "step_000002").is_dir() and (run / "curves.png").is_file()


def test_its_shared_sections_are_checked_before_any_worker():
    from engine.rl.recipe import RLRecipe
    from engine.train.config import build_config

    recipe = RLRecipe("rloo", RLOO)

    def problems(*overrides):
        return recipe.check(build_config(recipe.schema, recipe.presets, "cpu-demo", None, list(overrides)), 2)

    assert problems() == []
    assert problems("algorithm.rollout_correction=token_trunc", "rollout.n=0") == [
        "rollout.n must be a positive integer, got 0",
        "algorithm.rollout_correction must be one of none, token_truncate, token_mask, sequence_truncate, "
        "sequence_mask, band, seq_geo_mask, got 'token_trunc' "
        "(did you mean algorithm.rollout_correction=token_truncate?)"]
    assert problems("train.prompts_per_step=3") == ["train.prompts_per_step=3 does not divide over 2 ranks"]
