"""Running tool calls: concurrently (``rollout.max_parallel_tool_calls`` at a time), each within
``rollout.tool_timeout_s``, its result cut to ``rollout.max_tool_response_tokens`` tokens.

A failure never stops the run: an unknown tool, wrong arguments, an exception or a timeout become
``{"error": "..."}`` as the tool's result (the model reads it) and count as failures. A call that times out is
left running in a daemon thread (Python cannot stop a thread); its result is discarded.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from .parsing import ToolCall


@dataclasses.dataclass(frozen=True)
class ToolResult:
    content: str
    failed: bool


def error(message: str) -> ToolResult:
    return ToolResult(json.dumps({"error": message}), True)


def as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return str(value)


def call_tool(tools: dict[str, Callable], call: ToolCall, timeout_s: float) -> ToolResult:
    """One call, in a thread of its own so that a hanging tool costs ``timeout_s`` and no more."""
    fn = tools.get(call.name)
    if fn is None:
        return error(f"unknown tool {call.name!r}; the tools are {', '.join(sorted(tools)) or 'none'}")
    outcome: dict[str, Any] = {}

    def run():
        try:
            value = fn(**call.arguments)
            if inspect.isawaitable(value):
                value = asyncio.run(value)
            outcome["value"] = value
        except BaseException as exc:  # noqa: BLE001 - sys.exit() too: the model reads the error, the run goes on
            outcome["error"] = f"{type(exc).__name__}: {exc}"

    worker = threading.Thread(target=run, name=f"tool-{call.name}", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        return error(f"tool {call.name!r} did not finish within rollout.tool_timeout_s={timeout_s:g} s")
    if "error" in outcome:
        return error(outcome["error"])
    return ToolResult(as_text(outcome.get("value")), False)


def truncate(tokenizer, text: str, max_tokens: int) -> str:
    """``text`` cut to its first ``max_tokens`` tokens."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return text if len(ids) <= max_tokens else tokenizer.decode(ids[:max_tokens])


def run_calls(jobs: list[tuple[dict[str, Callable], ToolCall]], *, timeout_s: float, parallel: int,
              tokenizer=None, max_tokens: int | None = None) -> list[ToolResult]:
    """Every ``(tools, call)`` of a round (the calls of all trajectories' turns), ``parallel`` at a time, results
    in order."""
    if not jobs:
        return []
    with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(jobs))), thread_name_prefix="tools") as pool:
        results = list(pool.map(lambda job: call_tool(job[0], job[1], timeout_s), jobs))
    if tokenizer is not None and max_tokens is not None:
        results = [dataclasses.replace(r, content=truncate(tokenizer, r.content, max_tokens)) for r in results]
    return results
