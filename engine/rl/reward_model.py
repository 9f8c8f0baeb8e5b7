"""Model-served rewards for every RL recipe (``reward_model.*``): a sequence-classification model scoring each
response in the trainer's processes, or an LLM judge behind an OpenAI-compatible chat endpoint (``judge.py``):
``judge_url``, or ``judge_model``, a model directory the run serves with vLLM (``judge_server.py``).

Either is one more reward of the run, next to the rule rewards of ``data.reward``: its weight is the last entry of
``data.reward_weights`` (one per reward function, then one for the model), and without ``data.reward`` it is the
run's only reward. It is called once per rollout with the whole batch (style ``model``: it sees each ``Sample``,
response and, multi-turn, the trajectory's messages) and keeps its own figures, which the step reports as
``reward_model/score_mean`` (over the responses it scored), ``reward_model/failures`` (judge calls that failed,
each a reward of 0) and ``reward_model/s`` (seconds spent scoring, mean over ranks).

Failures are failures: a step where more than ``reward_model.max_failure_frac`` of the responses the model scored
failed stops the run in one line naming the endpoint and the last cause (``failure_stop``, on the counts summed over
ranks, so every rank stops at the same step), and a ``judge_url`` that gives no HTTP answer is refused before any
worker starts (``reach_problems``).
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

from ..rollout.vllm_server.access import host_problem, managed_argument_problems
from ..runtime import OneLineError
from .judge import JudgeReward, api_key_env_problem
from .rewards import Reward
from .scorers import STAT_KEYS, STYLE, ClassifierReward

DEFAULT_JUDGE_PROMPT = (
    "Rate how well the response answers the prompt, from 0 (wrong or useless) to 10 (correct and complete).\n\n"
    "Prompt:\n{prompt}\n\nResponse:\n{response}\n\nReference answer (may be empty):\n{answer}\n\n"
    "Reply with the score only, as a number.")


@dataclasses.dataclass
class RewardModelConfig:
    path: str | None = None  # a sequence-classification model directory (accel-rm's export): scores each response
    judge_url: str | None = None  # an OpenAI-compatible chat endpoint (.../v1) whose reply holds the score
    judge_model: str | None = None  # a model directory served by a vLLM server the run starts and stops (judge_*)
    judge_name: str | None = None  # the model name sent to judge_url; null: the first one its /models lists
    # judge_url's API key: the NAME of an environment variable holding it, sent as "Authorization: Bearer KEY"
    judge_api_key_env: str | None = None
    judge_prompt: str = DEFAULT_JUDGE_PROMPT  # with {prompt}, {response} and {answer}
    judge_max_tokens: int = 32  # of the judge's reply
    # the reply's form, imposed through vLLM's structured outputs so that any model answers a parseable score
    judge_answer_regex: str = r"[0-9]{1,2}(\.[0-9])?"
    judge_constrained: bool | None = None  # send judge_answer_regex: null: to judge_model only; true: to judge_url too
    judge_port: int = 0  # judge_model's server port; 0: a free one
    # the address judge_model's server listens on: 127.0.0.1 (this machine only); another (0.0.0.0: every
    # interface) exposes it, still wanting the run's key (docs/security.md, "What listens where")
    judge_host: str = "127.0.0.1"
    judge_start_timeout_s: float = 600.0  # how long judge_model's server may take to answer /health
    judge_max_model_len: int | None = None  # judge_model's context (prompt + reply); null: the model's own
    judge_kv_cache_gib: float | None = None  # judge_model's KV cache in GiB where the device sizes it so (the CPU)
    judge_server_args: dict = dataclasses.field(default_factory=dict)  # other api_server arguments of judge_model
    timeout_s: float = 60.0  # per judge call, all of it (connect to last byte); past it: retried, then a failure
    retries: int = 2  # further attempts after a failed judge call (any failure: status, no reply, timeout, garbage)
    max_failure_frac: float = 0.5  # a step whose failed responses exceed this share of those scored stops the run
    max_parallel: int = 8  # judge calls in flight at once, per rank
    batch_size: int = 16  # responses per forward of reward_model.path
    # reward_model.path on several ranks: auto (sharded when its weight files exceed replicate_max_gib), replicated
    # (a full copy on each rank) or sharded (one frozen engine across the trainer's ranks, as the policy)
    sharding: str = "auto"
    replicate_max_gib: float = 2.0  # sharding=auto replicates a model whose weight files take at most this (GiB)
    param_offload: bool = False  # a sharded reward model's parameters in host memory between its scorings
    max_length: int = 4096  # tokens of prompt + response the reward model reads (the start is cut beyond it)


def configured(config) -> RewardModelConfig | None:
    """The run's ``reward_model`` section when it names a model or a judge (recipes without the section: None)."""
    section = getattr(config, "reward_model", None)
    if section is None or not (section.path or section.judge_url or section.judge_model):
        return None
    return section


def problems(config) -> list[str]:
    """What is wrong with ``reward_model.*``, one sentence each, before any worker starts."""
    section = getattr(config, "reward_model", None)
    if section is None:
        return []
    found, given = [], [key for key in ("path", "judge_url", "judge_model") if getattr(section, key)]
    if len(given) > 1:
        found.append(f"reward_model.{' and reward_model.'.join(given)} are set: a run scores with one reward "
                     "model, so set only one")
    if section.judge_model:
        found += judge_model_problems(section)
    elif changed_server_keys(section):
        found.append(f"reward_model.{', reward_model.'.join(changed_server_keys(section))}: set only with "
                     "reward_model.judge_model (the judge server the run starts)")
    if section.path:
        from ..train.hub_names import hub_problem, local_model_dir

        local = local_model_dir(section.path)
        if hub_problem(section.path, "reward_model.path"):
            found.append(hub_problem(section.path, "reward_model.path"))
        elif not local.is_dir():
            found.append(f"reward_model.path {section.path} is not a directory (a sequence-classification model "
                         "such as accel-rm's export)")
        elif not (local / "config.json").is_file():
            found.append(f"reward_model.path {section.path} has no config.json: is it a model directory?")
        else:
            from ..checkpoint import pickled_weights_problems

            found += classifier_problems(str(local))
            found += pickled_weights_problems(local, "reward_model.path")
    if section.sharding not in SHARDINGS:
        found.append(f"reward_model.sharding must be one of {', '.join(SHARDINGS)}, got {section.sharding!r}")
    if isinstance(section.replicate_max_gib, bool) or not isinstance(section.replicate_max_gib, (int, float)) or \
            section.replicate_max_gib < 0:
        found.append(f"reward_model.replicate_max_gib must be a number >= 0, got {section.replicate_max_gib!r}")
    if api_key_env_problem(section):
        found.append(api_key_env_problem(section))
    if section.judge_url and not str(section.judge_url).startswith(("http://", "https://")):
        found.append(f"reward_model.judge_url must be an http:// or https:// URL, got {section.judge_url!r}")
    if "{response}" not in str(section.judge_prompt):
        found.append("reward_model.judge_prompt must contain {response} (and may use {prompt} and {answer})")
    for key in ("timeout_s", "judge_max_tokens", "max_parallel", "batch_size", "max_length"):
        value = getattr(section, key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            found.append(f"reward_model.{key} must be a positive number, got {value!r}")
    frac = section.max_failure_frac
    if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0 <= frac <= 1:
        found.append(f"reward_model.max_failure_frac must be a number in [0, 1], got {frac!r}")
    if isinstance(section.retries, bool) or not isinstance(section.retries, int) or section.retries < 0:
        found.append(f"reward_model.retries must be an integer >= 0, got {section.retries!r}")
    if section.judge_constrained not in (None, True, False):
        found.append(f"reward_model.judge_constrained must be true, false or null, got {section.judge_constrained!r}")
    try:
        re.compile(str(section.judge_answer_regex))
    except re.error as exc:
        found.append(f"reward_model.judge_answer_regex is not a regular expression ({exc})")
    return found


def classifier_problems(path: str) -> list[str]:
    """``reward_model.path``'s ``config.json``: a sequence-classification model with one label (a causal LM there
    would otherwise fail in every worker, late and at length)."""
    try:
        raw = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError) as exc:
        return [f"reward_model.path {path}: its config.json is not valid JSON ({exc})"]
    names = [str(name) for name in raw.get("architectures") or []]
    if names and not any(name.endswith("ForSequenceClassification") for name in names):
        return [f"reward_model.path {path} is a {names[0]}, not a sequence-classification model: a reward model "
                "scores with one label (AutoModelForSequenceClassification, num_labels=1, as accel-rm exports it); "
                "to score with a causal LM, serve it as a judge (reward_model.judge_model=DIR)"]
    labels = len(raw.get("id2label") or {}) or raw.get("num_labels", 2)
    if labels != 1:
        return [f"reward_model.path {path} has {labels} labels: a reward model has one (num_labels=1), as accel-rm "
                "exports it"]
    return []


SHARDINGS = ("auto", "replicated", "sharded")
SERVER_KEYS = ("judge_host", "judge_port", "judge_start_timeout_s", "judge_max_model_len", "judge_kv_cache_gib",
               "judge_server_args")


def changed_server_keys(section) -> list[str]:
    defaults = RewardModelConfig()
    return [key for key in SERVER_KEYS if getattr(section, key) != getattr(defaults, key)]


def judge_model_problems(section) -> list[str]:
    """``reward_model.judge_model``'s directory and server keys, and vLLM in this Python (named before any worker
    starts, with the package this device needs, as for rollout.engine=vllm)."""
    found = []
    model = Path(str(section.judge_model))
    if not (model / "config.json").is_file():
        found.append(f"reward_model.judge_model {section.judge_model} is not a model directory (no config.json): "
                     "give a directory vLLM can serve")
    port = section.judge_port
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port < 65536:
        found.append(f"reward_model.judge_port must be a port number (0: a free one), got {port!r}")
    host = host_problem("reward_model.judge_host", section.judge_host)
    if host:
        found.append(host)
    for key in ("judge_start_timeout_s", "judge_max_model_len", "judge_kv_cache_gib"):
        value = getattr(section, key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
            found.append(f"reward_model.{key} must be a positive number{'' if key.endswith('_s') else ' or null'}, "
                         f"got {value!r}")
    if not isinstance(section.judge_server_args, dict):
        found.append(f"reward_model.judge_server_args must be a mapping of api_server arguments, got "
                     f"{section.judge_server_args!r}")
    found += managed_argument_problems("reward_model.judge_server_args", section.judge_server_args, {
        "host": "reward_model.judge_host", "port": "reward_model.judge_port"})
    from ..rollout.engines.vllm_settings import vllm_installed

    if not vllm_installed():
        import accel_backends

        package = accel_backends.get_backend().inference_engine_facts().package
        found.insert(0, f"reward_model.judge_model needs vLLM, which is not installed in this Python: install "
                        f"{package}, or serve the judge elsewhere and set reward_model.judge_url=http://HOST:PORT/v1")
    return found


def split_weights(weights: list | None, rules: int, with_model: bool) -> tuple[list | None, float]:
    """``data.reward_weights`` as (the rule rewards' weights, the model's): with a reward model the list has one
    entry more than there are reward functions, the model's last."""
    if not with_model or weights is None:
        return weights, 1.0
    if len(weights) != rules + 1:
        raise ValueError(f"data.reward_weights has {len(weights)} entries for {rules} reward function(s) and the "
                         f"reward model: give {rules + 1}, the reward model's last")
    return list(weights[:-1]), weights[-1]


def model_rewards(config, backend=None, engine_options=None) -> list[Reward]:
    """``[Reward]`` for the run's reward model or judge (its weight: ``data.reward_weights``' last entry), else [].
    ``engine_options(config, section)``: a sharded ``reward_model.path``'s frozen engine options, or None for a
    replicated one (``engine_settings.reward_model_engine``)."""
    section = configured(config)
    if section is None:
        return []
    _, weight = split_weights(config.data.reward_weights, _rule_count(config), True)
    if section.path:
        import accel_backends

        backend = backend or accel_backends.get_backend()
        fn = ClassifierReward(section, backend, engine_options(config, section) if engine_options else None)
        spec = section.path
    elif section.judge_model:
        import accel_backends

        from .judge_server import served_judge_url

        url, key = served_judge_url(section, backend or accel_backends.get_backend())
        fn, spec = JudgeReward(section, url, api_key=key), section.judge_model
    else:
        fn, spec = JudgeReward(section), section.judge_url
    return [Reward(spec, fn, STYLE, float(weight))]


def _rule_count(config) -> int:
    reward = config.data.reward
    return 1 if isinstance(reward, str) else len(reward or [])


def take_stats(rewards: list[Reward]) -> dict[str, float]:
    """The model-served rewards' figures since the last call (empty without one)."""
    found = [reward.fn for reward in rewards if reward.style == STYLE]
    if not found:
        return {}
    totals = dict.fromkeys(STAT_KEYS, 0.0)
    for fn in found:
        for key, value in fn.take_stats().items():
            totals[key] += value
    return totals


def rank_sums(parts: list[dict]) -> dict[str, float]:
    """One rank's figures of a step (``parts``: each draw's ``take_stats``), to be summed over ranks."""
    if not any(parts):
        return {}
    return {**{key: sum(part.get(key, 0.0) for part in parts) for key in STAT_KEYS}, "reward_model_ranks": 1.0}


def metrics(totals: dict[str, float]) -> dict[str, float]:
    """``reward_model/*`` from ``rank_sums`` summed over ranks (empty without a reward model)."""
    if "reward_model_ranks" not in totals:
        return {}
    return {"reward_model/score_mean": totals["reward_model_score_sum"] / max(totals["reward_model_scored"], 1.0),
            "reward_model/failures": totals["reward_model_failures"],
            "reward_model/s": totals["reward_model_seconds"] / max(totals["reward_model_ranks"], 1.0)}


def reach_problems(config) -> list[str]:
    """``reward_model.judge_url`` that gives no HTTP answer (or refuses the run), one sentence, before any worker:
    a run would otherwise score every response 0. A judge the run serves itself (``judge_model``) is not up yet."""
    section = configured(config)
    if section is None or not section.judge_url:
        return []
    problem = JudgeReward(section).reachability_problem()
    return [problem] if problem else []


def failure_stop(rewards: list[Reward], totals: dict[str, float], step: int) -> str | None:
    """The stop line when more than ``reward_model.max_failure_frac`` of the step's model-scored responses failed
    (``totals``: ``rank_sums`` summed over ranks, the same on every rank), else None."""
    if "reward_model_ranks" not in totals:
        return None
    failed = int(totals["reward_model_failures"])
    asked = failed + int(totals["reward_model_scored"])
    fns = [reward.fn for reward in rewards if reward.style == STYLE]
    limit = fns[0].section.max_failure_frac if fns else 0.5
    if not asked or failed <= limit * asked:
        return None
    cause = next((fn.last_failure for fn in fns if fn.last_failure), "") or "the cause was seen on another rank"
    where = ", ".join(fn.where for fn in fns)
    return (f"reward_model: step {step + 1}: {failed} of {asked} responses could not be scored by {where} (more than "
            f"reward_model.max_failure_frac={limit:g}); last failure: {cause}. Check the judge (or raise "
            "reward_model.timeout_s / retries); the run stops rather than train on rewards of 0")


def stop_on_failures(rewards: list[Reward], totals: dict[str, float], step: int) -> None:
    """``failure_stop``'s line raised as a ``OneLineError`` (the launcher's one line, exit status != 0)."""
    line = failure_stop(rewards, totals, step)
    if line:
        raise OneLineError(line)
