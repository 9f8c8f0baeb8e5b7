"""GRPO with a reward model as its reward (reward_model.path, sharded across the 2 CPU processes): the model's
score rises, combined with a rule reward through data.reward_weights, and its figures are in every metrics row."""

import json

import pytest
from pool_commands import run_command
from reward_models import make_reward_model

pytestmark = pytest.mark.slow


def test_grpo_with_a_reward_model_raises_its_score(tmp_path):
    model = make_reward_model(tmp_path / "rm")
    result = run_command("grpo", ["train.prompts_per_step=8", "rollout.n=4", "train.steps=8",  # on the warm pool
                                  "train.micro_batch_size=16", "run.progress=false", f"run.output_dir={tmp_path}",
                                  "run.name=rm-run", f"reward_model.path={model}",
                                  "reward_model.sharding=sharded", "data.reward=engine.rl.prompts:echo_reward",
                                  "data.reward_weights=[0.1,1.0]"], timeout=400)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "rm-run" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 8
    for row in rows:  # the weighted sum of the rule reward and the model's score
        assert row["reward_mean"] == pytest.approx(0.1 * row["reward/echo_reward"] + row["reward/reward_model"],
                                                   abs=1e-4)
        assert row["reward_model/score_mean"] == pytest.approx(row["reward/reward_model"], abs=1e-4)
        assert row["reward_model/failures"] == 0 and row["reward_model/s"] > 0
    first, last = (sum(row["reward_model/score_mean"] for row in part) / 3 for part in (rows[:3], rows[-3:]))
    assert last > first + 0.3, [row["reward_model/score_mean"] for row in rows]
