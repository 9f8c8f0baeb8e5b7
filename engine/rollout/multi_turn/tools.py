"""Tools the model may call: ``rollout.tools`` functions and an environment's public methods, with their JSON
schemas as the chat template renders them (``transformers.utils.get_json_schema``: type hints and a Google-style
docstring)."""

from __future__ import annotations

import inspect
import types
from typing import Callable

from ...object_loader import load_object


class ToolError(ValueError):
    """A tool or an environment that cannot be used (one sentence naming the value and the fix)."""


def tool_schema(fn: Callable, where: str) -> dict:
    """The JSON schema of ``fn`` as ``apply_chat_template(tools=...)`` renders it; a function without a
    docstring or type hints is refused, naming it."""
    from transformers.utils import get_json_schema
    from transformers.utils.chat_template_utils import DocstringParsingException, TypeHintParsingException

    if not inspect.getdoc(fn):
        raise ToolError(f"{where}: tool {getattr(fn, '__name__', fn)!r} has no docstring: write one (a summary line "
                        "and an Args: section describing each parameter), the model reads it")
    try:
        return get_json_schema(fn)
    except (DocstringParsingException, TypeHintParsingException) as exc:
        raise ToolError(f"{where}: tool {getattr(fn, '__name__', fn)!r} cannot be described to the model: {exc} "
                        "(every parameter needs a type hint and a line in the docstring's Args: section)") from None


def load_tools(specs: list) -> dict[str, Callable]:
    """``rollout.tools`` as ``{name: function}``, each checked to have a schema."""
    tools: dict[str, Callable] = {}
    for spec in specs or []:
        fn = load_object(spec, what="function", key="rollout.tools", error=ToolError,
                         accept=lambda found: callable(found) and not inspect.isclass(found))
        tool_schema(fn, f"rollout.tools {spec!r}")
        name = fn.__name__
        if name in tools:
            raise ToolError(f"rollout.tools names two tools {name!r}: tool names must differ")
        tools[name] = fn
    return tools


RESERVED_METHODS = ("reset", "get_reward")


def environment_methods(cls) -> list[str]:
    """The public methods of an environment class that are tools: every one but ``reset`` and ``get_reward``."""
    return [name for name, member in inspect.getmembers(cls, inspect.isfunction)
            if not name.startswith("_") and name not in RESERVED_METHODS]


def load_environment(spec: str):
    """``rollout.environment``: the class, checked to have ``reset`` and tools that can be described."""
    cls = load_object(spec, what="class", key="rollout.environment", accept=inspect.isclass, error=ToolError)
    required = _required_parameters(cls)
    if required:
        raise ToolError(f"rollout.environment {spec!r} cannot be built with no arguments (its __init__ needs "
                        f"{', '.join(required)}): one instance is made per trajectory as {cls.__name__}(); give "
                        "those parameters defaults, or take the data row in reset(self, **row)")
    if not callable(getattr(cls, "reset", None)):
        raise ToolError(f"rollout.environment {spec!r} has no reset() method: add reset(self, **row), called with "
                        "the data row at the start of each trajectory")
    if not _reset_takes_keywords(cls):
        raise ToolError(f"rollout.environment {spec!r}: reset() takes no keyword arguments, but it is called with "
                        "the data row's columns (the prompt at least): define it as reset(self, **row)")
    methods = environment_methods(cls)
    if not methods:
        raise ToolError(f"rollout.environment {spec!r} has no public method: each public method is a tool the "
                        "model can call")
    probe = object()  # describes the bound method (self left out) without building an environment
    for name in methods:
        tool_schema(types.MethodType(getattr(cls, name), probe), f"rollout.environment {spec!r}")
    return cls


def _required_parameters(cls) -> list[str]:
    """The constructor's parameters without a default (``cls()`` would fail); none when it cannot be inspected."""
    try:
        parameters = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in parameters
            if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def _reset_takes_keywords(cls) -> bool:
    """Whether ``cls.reset`` accepts any keyword argument; True when it cannot be inspected."""
    skip = 1 if inspect.isfunction(inspect.getattr_static(cls, "reset", None)) else 0  # a plain method's self
    try:
        parameters = list(inspect.signature(cls.reset).parameters.values())[skip:]
    except (TypeError, ValueError):
        return True
    return any(p.kind in (p.VAR_KEYWORD, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) for p in parameters)


def class_schemas(cls) -> list[dict]:
    probe = object()
    return [tool_schema(types.MethodType(getattr(cls, name), probe), "rollout.environment")
            for name in environment_methods(cls)]


def bound_tools(instance) -> dict[str, Callable]:
    """An environment instance's tools, bound to it."""
    return {name: getattr(instance, name) for name in environment_methods(type(instance))}
