"""The wall time of every optimizer step of a transformers ``Trainer`` (between two ``on_step_end`` callbacks, the
first from ``on_train_begin``): how the TRL peer scripts time TRL's side. Imported from the script's own folder."""

from __future__ import annotations

import time


def step_clock():
    """``(callback, steps)``: pass the callback to the trainer; ``steps()`` gives the seconds of each step after."""
    from transformers import TrainerCallback

    marks: list[float] = []

    class Clock(TrainerCallback):
        def on_train_begin(self, *_, **__):
            marks.append(time.perf_counter())

        def on_step_end(self, *_, **__):
            marks.append(time.perf_counter())

    return Clock(), lambda: [b - a for a, b in zip(marks, marks[1:], strict=False)]
