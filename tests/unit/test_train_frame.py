"""engine/train: the preset choice, the recipe registry (built-ins through the hook, plugins, errors naming the
plugin), the loop's one reduction of a step's figures over 2 real ranks, run names carrying the trainer (an old
run still found by --resume), the one config pipeline's refusals, and the phase timings accel-bench reads."""

import json
import time

import pytest
from distributed import run_ranks

from engine.train.config import choose_preset

PRESETS = {"default": {}, "cpu-demo": {}, "h100": {}}


def test_the_demo_only_without_a_model_or_data_and_the_named_preset_first(tmp_path):
    assert choose_preset(PRESETS, None, {}, []) == ("cpu-demo", "the demo: no --preset, no model.path and no data.path "
                                                                "given")
    name, why = choose_preset(PRESETS, None, {}, ["model.path=/m", "train.steps=3"])
    assert name == "default" and why.startswith("the library defaults: model.path given and no --preset")
    name, why = choose_preset(PRESETS, None, {"data": {"path": "x.jsonl"}}, ["model.path=/m"])
    assert name == "default" and "data.path and model.path given" in why
    assert choose_preset(PRESETS, None, {}, ["model.path="]) [0] == "cpu-demo"  # null: not a model of the user's
    assert choose_preset(PRESETS, "h100", {}, ["model.path=/m"]) == ("h100", "named with --preset")
    with pytest.raises(ValueError, match="unknown preset 'h200': choose one of default, cpu-demo, h100"):
        choose_preset(PRESETS, "h200", {}, [])
    assert choose_preset({"cpu-demo": {}}, None, {}, ["model.path=/m"])[0] == "cpu-demo"  # a recipe without one


def test_builtin_recipes_come_through_the_hook_and_plugins_are_named(tmp_path, monkeypatch):
    import accel_backends
    from engine.train.registry import RecipeError, get_recipe, recipe_names

    assert recipe_names() == ["distill", "dpo", "grpo", "ppo", "rm", "sft"]
    assert get_recipe("sft").tool == "accel-sft" and get_recipe("grpo").schema.__name__ == "GRPOConfig"
    assert get_recipe("dpo").tool == "accel-dpo" and get_recipe("rm").schema.__name__ == "RewardModelConfig"
    assert get_recipe("distill").tool == "accel-distill" and get_recipe("distill").schema.__name__ == "DistillConfig"
    with pytest.raises(RecipeError, match="unknown trainer 'stf' \\(did you mean sft\\?\\): registered trainers are "
                                          "distill, dpo, grpo, ppo, rm, sft"):
        get_recipe("stf")
    (tmp_path / "clash_trainer.py").write_text(
        "import accel_backends\nfrom engine.train import hookspecs\n\n"
        "@accel_backends.hookimpl\ndef register_recipes(register):\n"
        "    register('sft', 'clash_trainer:Nope')\n    register('odd', 'clash_trainer:NOT_A_RECIPE')\n"
        "NOT_A_RECIPE = object()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("ACCEL_BACKENDS_PLUGINS", "clash_trainer")
    accel_backends.reset_registry()
    with pytest.raises(RecipeError, match="trainer name 'sft' is registered twice: by plugin 'builtin.recipes' and "
                                          "by plugin 'clash_trainer'"):
        recipe_names()


def test_a_registration_that_is_not_a_recipe_is_refused_with_its_plugin(tmp_path, monkeypatch):
    import accel_backends
    from engine.train.registry import RecipeError, get_recipe

    (tmp_path / "odd_trainer.py").write_text(
        "import accel_backends\nfrom engine.train import hookspecs\n\n"
        "@accel_backends.hookimpl\ndef register_recipes(register):\n"
        "    register('odd', 'odd_trainer:NOT_A_RECIPE')\n    register('gone', 'no_such_module:Recipe')\n"
        "NOT_A_RECIPE = object()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("ACCEL_BACKENDS_PLUGINS", "odd_trainer")
    accel_backends.reset_registry()
    with pytest.raises(RecipeError, match="trainer 'odd' \\(from plugin 'odd_trainer'\\) is object, not a Recipe"):
        get_recipe("odd")
    with pytest.raises(RecipeError, match="trainer 'gone' \\(from plugin 'odd_trainer'\\) failed to import "
                                          "'no_such_module:Recipe': ModuleNotFoundError"):
        get_recipe("gone")


def _reduce(rank):
    import accel_backends
    from engine.train.loop import reduce_step
    from engine.train.recipe import StepResult

    backend = accel_backends.get_backend()
    backend.init_distributed()
    seen = {}

    def metrics(totals, largest):
        seen.update(totals=totals, largest=largest)
        return {"mean": totals["sum"] / totals["count"], "longest": largest["longest"]}

    result = StepResult(metrics=metrics, sums={"sum": 1.0 + rank, "count": 2.0},
                        maxima={"longest": 10.0 * (rank + 1), "neg_min": -float(rank)})
    row, stopping = reduce_step(result, backend.metrics_device())
    return row, stopping, seen


def test_the_loop_reduces_a_steps_figures_over_ranks_once():
    for row, stopping, seen in run_ranks(_reduce):
        assert row == {"mean": 3.0 / 4.0, "longest": 20.0} and stopping is False
        assert seen["totals"] == {"sum": 3.0, "count": 4.0}  # the stop flag is the loop's own, not the recipe's
        assert seen["largest"] == {"longest": 20.0, "neg_min": 0.0}


def test_run_names_carry_the_trainer_and_resume_finds_a_run_named_before(tmp_path):
    from engine.train.registry import get_recipe
    from engine.train.run_dir import run_dir

    config = get_recipe("sft").schema(preset="cpu-demo")
    config.run.output_dir = str(tmp_path)
    assert run_dir(config, False, "sft").name.startswith("sft-cpu-demo-")
    old_grpo, old_sft = tmp_path / "cpu-demo-20261201-101500", tmp_path / "cpu-demo-20261201-101600"
    for path, record in ((old_grpo, {}), (old_sft, {"trainer": "sft"})):
        path.mkdir()
        (path / "config.json").write_text(json.dumps(record))
    assert run_dir(config, True, "sft") == old_sft  # the old SFT run, not the newer-named GRPO one
    assert run_dir(config, True, "grpo") == old_grpo  # no trainer recorded: GRPO's, as before the record
    time.sleep(0.01)
    newer = tmp_path / "sft-cpu-demo-20261202-090000"
    newer.mkdir()
    assert run_dir(config, True, "sft") == newer


def test_eval_and_training_share_one_pipeline_that_refuses_a_preset_on_an_existing_config():
    from engine.train.cli import load
    from engine.train.registry import get_recipe

    recipe = get_recipe("grpo")
    base, _, _ = load(recipe, "cpu-demo", None, [])
    with pytest.raises(ValueError, match="--preset is for a new config"):
        load(recipe, "h100", None, [], base=base)
    config, notices, why = load(recipe, None, None, ["algorithm.kl_coef=0.5"], base=base)
    assert why == "the run's own configuration" and config.algorithm.kl_loss_coef == 0.5
    assert any("algorithm.kl_coef is deprecated" in n for n in notices)  # the recipe's migration ran
    assert base.algorithm.kl_loss_coef == 0.001  # the base is not changed


def test_phase_timings_collect_only_while_open():
    from engine.runtime import phase, phase_timings

    synced = []
    with phase_timings(lambda: synced.append(1)) as timer:
        with phase("update"):
            with phase("forward"):
                time.sleep(0.01)
        with phase("update"):
            pass
    with phase("update"):  # closed: nothing recorded
        pass
    assert timer.calls == {"forward": 1, "update": 2} and len(synced) == 3
    assert timer.seconds["update"] >= timer.seconds["forward"] >= 0.01
