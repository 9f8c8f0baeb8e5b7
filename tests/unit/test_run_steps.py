"""engine/train/steps.py: when both trainers' loops save a checkpoint, and the bar and loggers they close."""

from __future__ import annotations

import io
import re
from types import SimpleNamespace

from tqdm import tqdm

from engine.train.steps import advance, finish, save_if_due


class RecordingEngine:
    """Stands in for FSDPEngine.save_checkpoint: writes a file where the checkpoint would go."""

    def __init__(self):
        self.saved = []

    def save_checkpoint(self, path):
        path.mkdir(parents=True)
        (path / "weights").write_bytes(b"x" * 10)
        self.saved.append(path.name)


def test_checkpoints_every_save_every_steps_at_the_end_and_on_stop_keeping_the_newest(tmp_path, capsys):
    engine, run = RecordingEngine(), SimpleNamespace(save_every=3, keep_checkpoints=None)
    for step in range(7):
        save_if_due(engine, tmp_path, run, step, 7, stopping=False, rank=0, progress=None, tool="accel-sft")
    assert engine.saved == ["step_000003", "step_000006", "step_000007"]
    said = capsys.readouterr().out
    assert re.search(r"accel-sft: saved \S+step_000007 \(10 B in \d+\.\d s\)", said), said  # size and seconds
    stopped = RecordingEngine()
    save_if_due(stopped, tmp_path / "b", SimpleNamespace(save_every=None, keep_checkpoints=None), 1, 7,
                stopping=True, rank=1, progress=None, tool="accel-sft")
    assert stopped.saved == ["step_000002"] and capsys.readouterr().out == ""  # only rank 0 reports


def test_advance_moves_the_bar_and_finish_closes_and_plots():
    bar = tqdm(total=3, file=io.StringIO())
    advance(bar, {"loss": "1.000"})
    advance(None, {"loss": "1.000"})  # no bar (another rank, run.progress=false): nothing
    assert bar.n == 1 and "loss=1.000" in str(bar)
    drawn, closed = [], []
    finish(bar, SimpleNamespace(close=lambda: closed.append(True)), lambda: drawn.append(True))
    finish(None, None, lambda: drawn.append(False))  # not rank 0: nothing closed, nothing drawn
    assert bar.disable  # tqdm marks a closed bar disabled
    assert closed == [True] and drawn == [True]
