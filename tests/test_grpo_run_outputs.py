"""One short 2-rank accel-grpo run, read back: W&B (offline) and MLflow hold every metric of every step and the
resolved config, only rank 0 logged, run.keep_checkpoints kept the newest two, config.json is what --print-config
prints, and ``accel-grpo eval`` of the run repeats its last in-run validation."""

import json
import subprocess
import sys

import pytest
from conftest import REPO
from pool_commands import run_command

from engine.rl.algorithms.grpo.cli import main
from engine.rl.prompts import echo_reward
from engine.train.loggers import flat_params, numbers

pytestmark = pytest.mark.slow

PROMPTS = [("a x2:", "aa"), ("b x1:", "b"), ("c x3:", "ccc"), ("d x2:", "dd"), ("e x1:", "e"), ("f x3:", "fff"),
           ("g x1:", "g"), ("h x2:", "hh")]


def _jsonl(path, pairs):
    path.write_text("".join(json.dumps({"prompt": p, "answer": a}) + "\n" for p, a in pairs))
    return path


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("outputs")
    train, val = _jsonl(root / "train.jsonl", PROMPTS), _jsonl(root / "val.jsonl", PROMPTS)
    args = ["--preset", "cpu-demo", "train.prompts_per_step=4", "rollout.n=4", "train.prompts_per_update=4",
            "train.micro_batch_size=4",
            "run.progress=false", f"run.output_dir={root}", "run.name=tracked", "train.steps=2",
            "algorithm.kl_loss_coef=0", f"data.path={train}", f"data.val_path={val}",
            "data.reward=engine.grpo.tasks:echo_reward", "run.val_every=2", "run.save_every=1",
            "run.keep_checkpoints=1", "run.loggers=[jsonl,wandb,mlflow]"]
    env = {"ACCEL_BACKEND": "cpu", "WANDB_MODE": "offline", "MLFLOW_TRACKING_URI": ""}
    result = run_command("grpo", args, env=env)  # on the warm rank pool's 2 ranks: the checks are about the run
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = root / "tracked"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return run_dir, args, rows, result.stdout


def test_wandb_offline_run_holds_every_metric_and_the_resolved_config(run):
    run_dir, _, rows, _ = run
    (wandb_file,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")  # one run: only rank 0 logs
    # wandb's own reader of its transaction log
    listing = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(wandb_file)],
                             capture_output=True, text=True, timeout=120, check=True, cwd=REPO).stdout
    records = [json.loads(line) for line in listing.splitlines() if line.startswith("{")]
    history = {r["history"]["step"]["num"]: r["history"]["item"] for r in records if r["type"] == "history"}
    assert sorted(history) == [row["step"] for row in rows] == [0, 1, 2]  # 0: the baseline validation
    for row in rows:
        logged = {k: v for k, v in history[row["step"]].items() if not k.startswith("_")}
        assert logged == pytest.approx(numbers(row), rel=1e-12), row["step"]
    assert "val/accuracy" in history[0] and "val/accuracy" in history[2] and "val/accuracy" not in history[1]
    (config,) = [r["run"]["config"]["update"] for r in records if r["type"] == "run"]
    config.pop("_wandb", None)
    assert config == json.loads((run_dir / "config.json").read_text())


def test_mlflow_local_store_holds_every_metric_and_the_config_as_parameters(run):
    from mlflow.tracking import MlflowClient

    run_dir, _, rows, _ = run
    client = MlflowClient(f"sqlite:///{run_dir / 'mlflow.db'}")
    (logged,) = client.search_runs([client.get_experiment_by_name("accel-grpo").experiment_id])
    assert logged.info.run_name == "tracked" and logged.info.status == "FINISHED"
    assert logged.data.params == flat_params(json.loads((run_dir / "config.json").read_text()))
    for key in {key for row in rows for key in numbers(row)}:
        history = sorted((m.step, m.value) for m in client.get_metric_history(logged.info.run_id, key))
        assert history == [(row["step"], pytest.approx(row[key], rel=1e-12)) for row in rows if key in row], key


def test_keep_checkpoints_keeps_the_newest_and_prints_sizes(run):
    run_dir, _, _, stdout = run
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["step_000002"]
    for step in (1, 2):
        assert f"saved {run_dir / 'checkpoints' / f'step_{step:06d}'} (" in stdout
    assert "removed step_000001 (run.keep_checkpoints=1)" in stdout


def test_config_json_is_what_print_config_prints(run, capsys, monkeypatch):
    run_dir, args, _, _ = run
    monkeypatch.setenv("ACCEL_BACKEND", "cpu")
    monkeypatch.setenv("WANDB_MODE", "offline")
    capsys.readouterr()
    assert main([*args, "--print-config"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads((run_dir / "config.json").read_text())
    assert printed["derived"]["total_optimizer_steps"] == 2 and printed["engine"]["total_steps"] == 2
    assert printed["derived"]["sequences_per_rank"] == 8 and printed["engine"]["grad_sync"] == "auto"


def test_eval_of_the_run_repeats_its_last_validation(run, monkeypatch):
    run_dir, _, rows, _ = run
    monkeypatch.setenv("ACCEL_BACKEND", "cpu")
    assert main(["eval", str(run_dir), "--nproc", "1"]) == 0  # in this process: the checkpoint of 2 ranks
    out = run_dir / "eval" / "step_000002"
    results = json.loads((out / "results.json").read_text())
    assert results["step"] == 2 and results["prompts"] == len(PROMPTS) and results["world_size"] == 1
    assert results["val/accuracy"] == rows[-1]["val/accuracy"]
    assert results["val/reward_mean"] == pytest.approx(rows[-1]["val/reward_mean"], abs=1e-12)
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert [s["index"] for s in samples] == list(range(len(PROMPTS)))
    assert [(s["prompt"], s["answer"]) for s in samples] == PROMPTS
    assert all(s["reward"] == echo_reward(s["prompt"], s["response"], s["answer"]) for s in samples)
    assert not (out / "model.tmp").exists()
    print(f"in-run validation {rows[-1]['val/reward_mean']:.4f}, eval {results['val/reward_mean']:.4f}")
