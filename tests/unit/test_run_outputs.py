"""What a user reads of a run (issue 39): the end summary of a short run compares its first and last steps, the
progress is one line every few steps when stderr is not a terminal, the loss panel is titled by the terms in use, no
empty samples.jsonl, a worker failure ends with one uncut line (the rest in a file), a reward is a real number and
a TRL reward's wrong count is said with both counts, and config.json is replaced atomically with the old one kept."""

import io
import json

import numpy as np
import pytest
import torch


def test_a_short_runs_summary_compares_its_first_and_last_steps():
    """Bug: a run of 10 steps or fewer compared a window of every step with itself."""
    from engine.train.registry import get_recipe

    rows = [{"step": i + 1, "reward_mean": r} for i, r in enumerate([0.1, 0.2, 0.5, 0.7])]
    line = get_recipe("grpo").done_line(rows, 3.0)
    assert line == "accel-grpo: done in 3 s; reward mean over the first 2 steps 0.150, over the last 2 steps 0.600"
    assert "over the first 10 steps" in get_recipe("grpo").done_line(rows * 6, 3.0)
    assert "at its only step 0.100" in get_recipe("grpo").done_line(rows[:1], 1.0)
    sft = get_recipe("sft").done_line([{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.0}], 1.0)
    assert sft.startswith("accel-sft: done in 1 s; loss over the first step 2.000, over the last step 1.000")


def test_the_progress_is_a_line_every_few_steps_when_not_on_a_terminal():
    """Bug: the bar's redraws flooded a redirected log."""
    from engine.train.progress import LINES, progress_bar

    log = io.StringIO()
    progress = progress_bar(200, 0, "grpo", stream=log)
    for _ in range(200):
        progress.set_postfix({"reward": "0.50"})
        progress.update(1)
    progress.write("saved step_000200")
    progress.close()
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue() and len(lines) == LINES + 1
    assert lines[0].startswith("grpo: step 20/200 (10%, ") and lines[0].endswith(" reward=0.50")
    assert lines[-2].startswith("grpo: step 200/200 (100%") and lines[-1] == "saved step_000200"
    resumed = progress_bar(7, 5, "sft", stream=(short := io.StringIO()))  # a resumed run counts on from 5
    resumed.update(1)
    resumed.update(1)
    assert [line.split(" (")[0] for line in short.getvalue().splitlines()] == ["sft: step 6/7", "sft: step 7/7"]


def test_the_loss_panel_names_the_terms_in_use():
    """Bug: the loss panel said "policy + KL" for a run without a KL term."""
    from engine.rl.algorithms.grpo.config import build_config
    from engine.train.registry import get_recipe

    recipe = get_recipe("grpo")
    titles = dict(recipe.curves_for(build_config("default", None, [])))
    assert titles["loss"] == "loss (policy)" and "kl" not in titles
    titles = dict(recipe.curves_for(build_config("cpu-demo", None, ["algorithm.entropy_coeff=0.01"])))
    assert titles["loss"] == "loss (policy + KL + entropy bonus)" and titles["kl"] == "KL to reference"


def test_no_empty_samples_file(tmp_path):
    from engine.train.loggers import Loggers

    loggers = Loggers(["jsonl"], tmp_path, 0, {})
    loggers.write({"step": 1, "loss": 1.0})
    loggers.write_samples([])
    loggers.close()
    assert (tmp_path / "metrics.jsonl").is_file() and not (tmp_path / "samples.jsonl").exists()
    loggers = Loggers(["jsonl"], tmp_path, 0, {})
    loggers.write_samples([{"step": 1, "prompt": "p", "response": "r", "reward": 1.0, "advantage": 0.0}])
    loggers.close()
    assert json.loads((tmp_path / "samples.jsonl").read_text())["prompt"] == "p"


def test_a_worker_failure_is_one_uncut_line_and_the_rest_goes_to_a_file(tmp_path, capsys):
    """Bug: 90-186 lines of both ranks' tracebacks, and the useful line cut with '...'."""
    from accel_backends.spawn import RankOutcome
    from engine.runtime import WorkerFailed, report_early_end
    from engine.runtime.launcher import _describe

    cause = "RuntimeError: reward function f raised KeyError: 'answer' (row train.jsonl:17, prompt '" + "x" * 300 + "')"
    outcomes = [RankOutcome(0, 1, error="RuntimeError: Connection reset by peer\nwhile in all_gather",
                            traceback="Traceback (most recent call last):\n  rank 0's\n", raised_at=2.0,
                            details={"phase": "collect"}),
                RankOutcome(1, 1, error=cause, traceback="Traceback (most recent call last):\n  rank 1's\n",
                            raised_at=1.0, details={"phase": "reward"})]
    failed = WorkerFailed(*_describe(outcomes, [1, 1]))
    assert str(failed) == f"rank 1 failed in phase reward: {cause}"  # the first failure, uncut
    file = tmp_path / "tracebacks.txt"
    assert report_early_end("accel-grpo", failed, "continue with: accel-grpo --resume run.name=x",
                            traceback_file=file) == 1
    err = capsys.readouterr().err.splitlines()
    assert err == ["continue with: accel-grpo --resume run.name=x",
                   f"accel-grpo: error: rank 1 failed in phase reward: {cause} (tracebacks: {file}; --traceback "
                   "prints them)"]
    saved = file.read_text()
    assert "then rank 0 failed in phase collect: RuntimeError: Connection reset by peer while in all_gather" in saved
    assert "--- rank 0 ---" in saved and "rank 1's" in saved
    assert report_early_end("accel-grpo", failed) == 1  # --traceback: printed, then the line
    err = capsys.readouterr().err
    assert "rank 1's" in err and err.strip().splitlines()[-1].startswith("accel-grpo: error: rank 1 failed")
    # A rank that exited without a word comes before the others' echoes of it.
    gone = [RankOutcome(0, 1, error="RuntimeError: Connection reset by peer", raised_at=1.0), RankOutcome(1, 7)]
    assert str(WorkerFailed(*_describe(gone, [1, 7]))).startswith("rank 1 failed: exited with status 7")


def test_a_reward_is_a_real_number_and_a_trl_rewards_count_is_said():
    """Bug: a reward returning the string "1.0" was taken as 1.0; a TRL-style reward returning 1 value for 64
    completions said "got list" without the lengths."""
    from engine.rl.prompt_types import Sample
    from engine.rl.rewards import Reward, real_number, score_all

    for value, number in ((True, 1.0), (3, 3.0), (0.5, 0.5), (np.float32(0.25), 0.25), (np.int64(2), 2.0),
                          (torch.tensor(0.75), 0.75), (np.array(1.5), 1.5)):
        assert real_number(value) == number, value
    for value in ("1.0", None, [1.0], torch.tensor([1.0, 2.0]), np.array("1.0"), 1 + 2j):
        assert real_number(value) is None, value
    sample = Sample(prompt="p", answer="1", where="train.jsonl:3")
    text = Reward("m:text", lambda prompt, response, answer: "1.0", "simple")
    with pytest.raises(ValueError, match=r"returned '1.0' \(str\) for row train.jsonl:3: it must return a real "
                                         r"number"):
        score_all([text], [sample], ["r"])
    one = Reward("m:one", lambda prompts, completions, **columns: [1.0], "trl")
    with pytest.raises(ValueError, match=r"must return a list of 4 numbers, one per completion, got a list of 1 "
                                         r"\(for 4 completions\)"):
        score_all([one], [sample] * 4, ["r"] * 4)


def test_config_json_is_replaced_atomically_with_the_previous_record_beside_it(tmp_path):
    from engine.train.resume import record

    record(tmp_path, {"train": {"steps": 2}})
    assert not (tmp_path / "config.previous.json").exists()
    record(tmp_path, {"train": {"steps": 2}})  # the same record: nothing moves
    assert not (tmp_path / "config.previous.json").exists()
    record(tmp_path, {"train": {"steps": 4}})
    assert json.loads((tmp_path / "config.json").read_text()) == {"train": {"steps": 4}}
    assert json.loads((tmp_path / "config.previous.json").read_text()) == {"train": {"steps": 2}}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "config.previous.json"]


def test_resume_derives_the_engine_options_it_derived_before_again():
    """train.steps changed on resume: the schedule's length follows (it was derived, not given); a given one stays."""
    from engine.train.registry import get_recipe
    from engine.train.resume import resume_base

    recipe = get_recipe("grpo")
    recorded = recipe.schema.from_dict({"preset": "cpu-demo", "train": {"steps": 4, "seed": 0},
                                        "engine": {"total_steps": 4, "seed": 0, "lr": 0.1}})
    assert resume_base(recipe, recorded, {"total_optimizer_steps": 4}).engine == {"lr": 0.1}
    assert resume_base(recipe, recorded, {"total_optimizer_steps": 8}).engine == {"total_steps": 4, "lr": 0.1}
    assert recorded.engine["total_steps"] == 4  # the record itself is left as it was
