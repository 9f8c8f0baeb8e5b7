"""engine/grpo: the curves' panels, the trackers' view of metrics and config, and the missing-package messages."""

import sys

import pytest

from engine.rl.algorithms.grpo.report import panels
from engine.train.loggers import flat_params, numbers, require_logger
from engine.train.retention import human_size


def test_validation_panels_only_for_a_run_with_validation():
    rows = [{"step": 1, "reward_mean": 0.1, "loss": 0.2}, {"step": 2, "reward_mean": 0.2, "loss": 0.1}]
    assert [key for key, _ in panels(rows)] == ["reward_mean", "loss"]
    rows[1].update({"val/accuracy": 0.5, "val/reward_mean": 0.7})
    assert [key for key, _ in panels(rows)] == ["reward_mean", "val/accuracy", "val/reward_mean", "loss"]


def test_trackers_get_every_number_and_the_config_flattened():
    assert numbers({"step": 3, "loss": 1, "val/accuracy": 0.5, "note": "x", "flag": True}) == {
        "loss": 1.0, "val/accuracy": 0.5}
    config = {"nproc": "auto", "train": {"steps": 5, "seed": 0}, "data": {"path": None, "reward": ["a:b", "c:d"]},
              "engine": {"betas": [0.9, 0.999]}, "empty": {}}
    assert flat_params(config) == {"nproc": "auto", "train.steps": "5", "train.seed": "0", "data.path": "null",
                                   "data.reward": '["a:b", "c:d"]', "engine.betas": "[0.9, 0.999]", "empty": "{}"}


@pytest.mark.parametrize("name", ["wandb", "mlflow", "tensorboard"])
def test_a_missing_tracker_is_named_with_its_extra(monkeypatch, name):
    monkeypatch.setitem(sys.modules, name, None)  # what an environment without it looks like
    with pytest.raises(ValueError, match=rf"run.loggers includes {name}, which is not installed: pip install "
                                         rf"'accel-backends\[{name}\]'"):
        require_logger(name)


def test_mlflow_local_store_needs_sqlalchemy(monkeypatch):
    pytest.importorskip("mlflow")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setitem(sys.modules, "sqlalchemy", None)
    with pytest.raises(ValueError, match="default local store .* needs sqlalchemy"):
        require_logger("mlflow")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    require_logger("mlflow")  # a tracking server: no local database


def test_sizes_read_as_people_write_them():
    assert [human_size(n) for n in (512, 1536, 5 * 2**20, 18 * 2**30)] == ["512 B", "1.5 KiB", "5.0 MiB",
                                                                          "18.0 GiB"]
