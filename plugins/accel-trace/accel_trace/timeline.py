"""One rank's timeline in Chrome's trace-event format, and its per-step summary.

Files, in the directory given: ``trace-rank<N>.json`` (``{"traceEvents": [...]}``; open it in
https://ui.perfetto.dev or chrome://tracing) and ``steps-rank<N>.json`` (one entry per optimizer step). Process
id is the rank, thread id one per engine (a GRPO policy and its reference model are two rows). Both files are
rewritten, atomically, after every optimizer step and whenever an outermost mode context closes, so a run that
crashes keeps its timeline up to the last of them.

Events: ``train_mode`` / ``eval_mode`` begin and end (``B``/``E``, one per mode switch); moves as complete events
(``X``, when the engine measured their duration) or instants, with bytes in their arguments; optimizer steps as
instants carrying the step's metrics; memory (GiB allocated and peak) as a counter sampled at each of those.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path


def _now_us() -> float:
    return time.time_ns() / 1000.0  # wall clock: the ranks' files line up when opened together


def _plain(value):
    """A JSON value Perfetto accepts: numbers finite (else a string), tensors and numpy scalars as numbers."""
    if hasattr(value, "item") and callable(value.item):
        try:
            value = value.item()
        except (ValueError, RuntimeError):
            return str(value)
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    return str(value)


class Timeline:
    def __init__(self, directory: str, rank: int) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.rank = rank
        self.events: list[dict] = [
            {"name": "process_name", "ph": "M", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}},
        ]
        self.steps: list[dict] = []
        self._threads: dict[int, int] = {}  # id(engine) -> tid
        self._open: dict[int, list[tuple[str, float]]] = {}  # tid -> stack of (mode, start)
        self._pending: dict[int, dict] = {}  # tid -> what happened since that engine's last step

    # -- events -------------------------------------------------------------------------------------------------

    def mode_switch(self, engine, mode: str, entering: bool) -> None:
        tid, now = self._thread(engine), _now_us()
        self._add(engine, tid, {"name": f"{mode}_mode", "cat": "mode", "ph": "B" if entering else "E", "ts": now})
        stack = self._open[tid]
        if entering:
            stack.append([mode, now])  # [mode, time from which it still has to be counted]
            return
        if stack:
            if len(stack) == 1:  # an outermost context closed: count its time, and save what we have
                self._count_mode_time(tid, now)
                stack.pop()
                self.write()
            else:
                stack.pop()

    def transfer(self, engine, what: str, destination: str, num_bytes: int, seconds: float | None) -> None:
        tid, now = self._thread(engine), _now_us()
        args = {"what": what, "destination": destination, "bytes": int(num_bytes)}
        event = {"name": f"{what} -> {destination}", "cat": "move", "args": args}
        if seconds is not None:
            event.update(ph="X", ts=now - seconds * 1e6, dur=seconds * 1e6)
        else:
            event.update(ph="i", s="t", ts=now)
        self._add(engine, tid, event, memory=False)
        pending = self._pending[tid]
        pending["moves"] = pending.get("moves", 0) + 1
        key = f"bytes_to_{destination}"
        pending[key] = pending.get(key, 0) + int(num_bytes)
        if seconds is not None:
            pending["move_s"] = pending.get("move_s", 0.0) + seconds

    def optimizer_step(self, engine, step: int, metrics: dict) -> None:
        tid, now = self._thread(engine), _now_us()
        args = {"step": step, **{k: _plain(v) for k, v in metrics.items()}}
        self._add(engine, tid, {"name": "optimizer_step", "cat": "step", "ph": "i", "s": "t", "ts": now,
                                "args": args})
        self._count_mode_time(tid, now)  # the step belongs to the mode it ran in, up to now
        pending = self._pending[tid]
        summary = {"engine": tid, "step": step, "wall_s": (now - pending.pop("since")) / 1e6, **pending}
        summary.update({k: args[k] for k in ("grad_norm", "lr", "skipped") if k in args})
        memory = self._memory(engine)
        if memory:
            summary["peak_allocated_gib"] = memory.get("peak_allocated_gib")
        self.steps.append(summary)
        self._pending[tid] = {"since": now}
        self.write()

    # -- helpers ------------------------------------------------------------------------------------------------

    def _count_mode_time(self, tid: int, now: float) -> None:
        """Add the outermost open mode's time since it was last counted to the engine's pending step."""
        stack = self._open[tid]
        if stack:
            mode, counted_from = stack[0]
            pending = self._pending[tid]
            key = f"{mode}_mode_s"
            pending[key] = pending.get(key, 0.0) + (now - counted_from) / 1e6
            stack[0][1] = now

    def _thread(self, engine) -> int:
        key = id(engine)
        tid = self._threads.get(key)
        if tid is None:
            tid = self._threads[key] = len(self._threads) + 1
            label = f"engine {tid} ({getattr(getattr(engine, 'backend', None), 'name', '?')})"
            self.events.append({"name": "thread_name", "ph": "M", "pid": self.rank, "tid": tid,
                                "args": {"name": label}})
            self._open[tid] = []
            self._pending[tid] = {"since": _now_us()}
        return tid

    def _add(self, engine, tid: int, event: dict, memory: bool = True) -> None:
        self.events.append({**event, "pid": self.rank, "tid": tid})
        sample = self._memory(engine) if memory else None
        if sample:
            self.events.append({"name": "memory GiB", "ph": "C", "ts": event["ts"], "pid": self.rank, "tid": tid,
                                "args": sample})

    @staticmethod
    def _memory(engine) -> dict | None:
        backend = getattr(engine, "backend", None)
        try:
            stats = backend.memory_stats()
        except Exception:  # noqa: BLE001 - a trace must never break training
            return None
        figures = {"allocated_gib": stats.allocated, "peak_allocated_gib": stats.peak_allocated}
        return {k: round(v / 2**30, 4) for k, v in figures.items() if v is not None}

    def write(self) -> None:
        _write_json(self.directory / f"trace-rank{self.rank}.json",
                    {"traceEvents": self.events, "displayTimeUnit": "ms"})
        _write_json(self.directory / f"steps-rank{self.rank}.json", self.steps)


def _write_json(path: Path, document) -> None:
    temporary = path.with_name(path.name + f".tmp{os.getpid()}")
    temporary.write_text(json.dumps(document, allow_nan=False))
    os.replace(temporary, path)
