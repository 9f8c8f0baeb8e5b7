"""``rollout.tools`` / ``rollout.environment`` and their limits: checked before any worker starts, then built
into a ``MultiTurnRollout`` on every rank."""

from __future__ import annotations

from typing import Callable

from .loop import Limits, MultiTurnRollout
from .template import check_template
from .tools import ToolError, bound_tools, class_schemas, load_environment, load_tools, tool_schema

LIMIT_KEYS = ("max_tool_calls", "max_tool_response_tokens", "max_parallel_tool_calls")


def enabled(rollout_config) -> bool:
    return bool(rollout_config.tools) or bool(rollout_config.environment)


def _loaded(rollout_config):
    tools = load_tools(rollout_config.tools)
    environment = load_environment(rollout_config.environment) if rollout_config.environment else None
    schemas = [tool_schema(fn, "rollout.tools") for fn in tools.values()]
    if environment is not None:
        schemas += class_schemas(environment)
        clash = set(tools) & {s["function"]["name"] for s in class_schemas(environment)}
        if clash:
            raise ToolError(f"rollout.tools and rollout.environment both have a tool named {sorted(clash)[0]!r}: "
                            "rename one")
    return tools, environment, schemas


def check(config, tokenizer_source: Callable | None, prompt_limit: int | None = None) -> list[str]:
    """Problems with the agent keys (one sentence each); ``tokenizer_source()`` loads the model's tokenizer for the
    chat-template check; ``prompt_limit``: the longest prompt without tools, for the token budget."""
    r = config.rollout
    if not enabled(r):
        return []
    problems = []
    if r.tools is not None and (not isinstance(r.tools, list) or not all(isinstance(s, str) for s in r.tools)):
        return [f"rollout.tools must be a list of 'module:function' names, got {r.tools!r}"]
    for key in LIMIT_KEYS:
        value = getattr(r, key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            problems.append(f"rollout.{key} must be a positive integer, got {value!r}")
    if not isinstance(r.tool_timeout_s, (int, float)) or r.tool_timeout_s <= 0:
        problems.append(f"rollout.tool_timeout_s must be a positive number of seconds, got {r.tool_timeout_s!r}")
    if config.data.chat_template == "none":
        problems.append("rollout.tools / rollout.environment need the chat template (tools are rendered by it): "
                        "remove data.chat_template=none")
    try:
        tools, environment, schemas = _loaded(r)
    except ToolError as exc:
        return problems + [str(exc)]
    if environment is not None and not config.data.reward and not callable(getattr(environment, "get_reward", None)):
        problems.append(f"rollout.environment {r.environment!r} has no get_reward() and data.reward is not set: "
                        "give a reward (data.reward=module:function) or add get_reward(self) -> float")
    from ..engines.registry import resolve

    try:
        engine = resolve(r.engine)
    except ValueError:
        engine = None  # reported by the engine check
    if engine is not None and getattr(engine, "multi_turn", True) is False:
        problems.append(f"rollout.engine {r.engine!r} cannot continue a trajectory from token ids (multi_turn = "
                        "False): choose hf, hf-continuous or an engine that can, or remove rollout.tools / "
                        "rollout.environment")
    if tokenizer_source is not None and not problems:
        tokenizer = tokenizer_source()
        problems += check_template(tokenizer, schemas, f"model.path {config.model.path}")
        if not problems and config.train.micro_batch_tokens and prompt_limit is not None:
            problems += _budget_problems(config, tokenizer, schemas, prompt_limit)
    return problems


def _budget_problems(config, tokenizer, schemas, limit: int) -> list[str]:
    """The tool schemas lengthen every prompt: the token budget must hold them too."""
    from .template import prompt_ids

    user = [{"role": "user", "content": "x"}]
    extra = len(prompt_ids(tokenizer, user, schemas)) - len(prompt_ids(tokenizer, user, []))
    longest = limit + extra + config.rollout.max_new_tokens
    if longest <= config.train.micro_batch_tokens:
        return []
    return [f"train.micro_batch_tokens={config.train.micro_batch_tokens} is smaller than the longest possible "
            f"sequence with tools, {longest} tokens (prompt limit {limit} + {extra} tokens of tool schemas + "
            f"rollout.max_new_tokens {config.rollout.max_new_tokens}): raise train.micro_batch_tokens to at least "
            f"{longest}"]


def build(config, tokenizer, any_rank: Callable[[bool], bool] | None = None) -> MultiTurnRollout | None:
    """The multi-turn rollout of a run with tools or an environment, else None (single-turn rollouts). A template
    that is not prefix-preserving is refused here too (a trainer built without the CLI's check)."""
    r = config.rollout
    if not enabled(r):
        return None
    tools, environment, schemas = _loaded(r)
    problems = check_template(tokenizer, schemas, f"model.path {config.model.path}")
    if problems:
        raise ToolError(problems[0])
    limits = Limits(r.max_tool_calls, r.max_tool_response_tokens, float(r.tool_timeout_s), r.max_parallel_tool_calls)
    return MultiTurnRollout(tokenizer, schemas, tools, limits, environment, bound_tools, config.data.system_prompt,
                            any_rank)
