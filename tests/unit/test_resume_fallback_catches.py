"""``run.resume_fallback`` (engine/checkpoint/run_checkpoints.py) catches every checkpoint failure, torch's
``CheckpointException`` (a ``BaseException``) among them, but never an interrupt; a cut last line of
``metrics.jsonl`` is dropped with a note instead of blocking the resume (engine/train/report.py)."""

import json
import warnings

import pytest
from torch.distributed.checkpoint.api import CheckpointException, _wrap_exception

from engine import checkpoint
from engine.checkpoint import run_checkpoints


def _steps(tmp_path, *steps):
    for step in steps:
        (tmp_path / f"step_{step:06d}").mkdir()
        (tmp_path / f"step_{step:06d}" / checkpoint.META_FILE).write_text("{}")


def _loads(failures: dict, loaded: list):
    """A stand-in for loading the engines: a step in ``failures`` raises what it maps to."""
    def load_engines(engines, path, *checked):
        if path.name in failures:
            raise failures[path.name]
        loaded.append(path.name)
    return load_engines


def test_a_checkpoint_exception_falls_back_to_the_previous_checkpoint(tmp_path, monkeypatch):
    _steps(tmp_path, 1, 2)
    loaded = []
    failure = CheckpointException("read failed", {0: _wrap_exception(RuntimeError("invalid load key"))})
    assert not isinstance(failure, Exception)  # why ``except Exception`` missed it
    monkeypatch.setattr(run_checkpoints, "check_engines_readable", lambda engines, path: {}, raising=False)
    monkeypatch.setattr(run_checkpoints, "load_engines", _loads({"step_000002": failure}, loaded))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert run_checkpoints.load_latest({"policy": object()}, tmp_path).name == "step_000001"
    assert loaded == ["step_000001"]
    assert any("falling back to the previous complete checkpoint" in str(w.message) for w in caught)
    with pytest.raises(checkpoint.CorruptCheckpoint, match="resume_fallback=true would load the previous one"):
        run_checkpoints.load_latest({"policy": object()}, tmp_path, fallback=False)


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt(), SystemExit(3)])
def test_an_interrupt_is_never_taken_for_a_damaged_checkpoint(tmp_path, monkeypatch, interrupt):
    _steps(tmp_path, 1, 2)
    loaded = []
    monkeypatch.setattr(run_checkpoints, "check_engines_readable", lambda engines, path: {}, raising=False)
    monkeypatch.setattr(run_checkpoints, "load_engines", _loads({"step_000002": interrupt}, loaded))
    with pytest.raises(type(interrupt)):
        run_checkpoints.load_latest({"policy": object()}, tmp_path)
    assert loaded == []


def test_a_cut_last_metrics_line_is_dropped_with_a_note(tmp_path, capsys):
    from engine.train.report import MetricsLog

    path = tmp_path / "metrics.jsonl"
    rows = [{"step": 1, "loss": 0.5}, {"step": 2, "loss": 0.4}, {"step": 3, "loss": 0.3}]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows) + '{"step": 4, "lo')  # killed mid-write
    log = MetricsLog(path, resume_step=2)
    assert [json.loads(line) for line in path.read_text().splitlines()] == rows[:2]
    err = capsys.readouterr().err.strip()
    assert err.startswith("note: ") and "\n" not in err and "metrics.jsonl" in err and "last line" in err, err
    log.write({"step": 3, "loss": 0.2})
    assert json.loads(path.read_text().splitlines()[-1]) == {"step": 3, "loss": 0.2}
    path.write_text(json.dumps(rows[0]) + "\n{not json\n" + json.dumps(rows[1]) + "\n")  # damage inside: refused
    with pytest.raises(ValueError, match=r"metrics.jsonl line 2 is not JSON"):
        MetricsLog(path, resume_step=2)
