"""The checks of the RL layer's shared config sections (``schema.py``: ``model``, ``data.*``, ``rollout.*``,
``train.*``, ``run.*``, ``engine.*``, and the rollout-correction keys every RL algorithm section carries), one
sentence each, before any worker starts. A recipe's ``check`` is ``problems(config, world_size, tool,
its_own_algorithm_problems)``."""

from __future__ import annotations

from pathlib import Path

from accel_backends.names import not_one_of

from ..sequence_parallel import config_problems
from ..train.settings import missing_model, run_problems
from . import reward_model
from .engine_settings import engine_config
from .model import BUILTIN_MODEL, check_model_dir
from .rollout_correction import CORRECTION_MODES
from .sizes import data_parallel_groups, max_sequence_tokens, prompt_token_limit


def problems(config, world_size: int, tool: str, algorithm_problems=()) -> list[str]:
    """Every problem that can be found before a worker starts (paths, sizes, names), as sentences: the keys'
    own values and ``algorithm_problems`` (the recipe's ``algorithm.*``) first; only when those hold, the sizes,
    the rollout engine, multi-turn settings and the engine options they make."""
    found = field_problems(config, tool) + list(algorithm_problems)
    if found:
        return found
    return setup_problems(config, world_size)


def field_problems(config, tool: str) -> list[str]:
    """The keys' values, each on its own (safe on values of any type)."""
    from .ahead import staleness_problems

    found = model_problems(config) + data_problems(config) + run_problems(config.run) + reward_model.problems(config)
    t, r = config.train, config.rollout
    if r.top_k < 0 or r.val_n < 1 or r.val_temperature < 0 or config.run.val_every < 0:
        found.append("rollout.top_k and run.val_every must be >= 0, rollout.val_n >= 1, rollout.val_temperature >= 0")
    if str(config.engine.get("mixed_precision", "")) == "fp16":
        found.append(f"engine.mixed_precision=fp16 is not supported by {tool} (no loss scaling: token-weighted "
                     "losses overflow in fp16); use engine.mixed_precision=bf16 (or auto)")
    for name, value in (("train.steps", t.steps), ("train.prompts_per_step", t.prompts_per_step),
                        ("train.ppo_epochs", t.ppo_epochs), ("train.micro_batch_size", t.micro_batch_size),
                        ("rollout.n", r.n), ("rollout.max_new_tokens", r.max_new_tokens)):
        if not isinstance(value, int) or value < 1:
            found.append(f"{name} must be a positive integer, got {value!r}")
    optional = (("train.prompts_per_update", t.prompts_per_update), ("train.mini_batch_size", t.mini_batch_size),
                ("train.micro_batch_tokens", t.micro_batch_tokens))
    for name, value in optional:
        if value is not None and (not isinstance(value, int) or value < 1):
            found.append(f"{name} must be a positive integer or null, got {value!r}")
    if not isinstance(t.padding_free, bool):
        found.append(f"train.padding_free must be true or false, got {t.padding_free!r}")
    found += correction_problems(config.algorithm)
    if config.run.log_samples < 0:
        found.append(f"run.log_samples must be >= 0, got {config.run.log_samples}")
    if config.run.val_before_train and not (config.data.val_path or config.data.val_fraction):
        found.append("run.val_before_train needs a validation set: data.val_path=... or data.val_fraction=...")
    from ..rollout.engines.vllm_settings import inert_problems

    return found + staleness_problems(config) + inert_problems(config.rollout, engine_facts())


def model_problems(config) -> list[str]:
    if config.model.path is None:
        return [missing_model(config.preset)]
    return [] if config.model.path == BUILTIN_MODEL else check_model_dir(config.model.path)


def data_problems(config) -> list[str]:
    """``data.*``: the files, the task and its reward, the validation set, formats and limits."""
    d, found = config.data, []
    if d.task == "gsm8k" and not d.path:
        found.append("task gsm8k needs data.path=/path/to/train.jsonl (a JSONL, JSON or Parquet file or a datasets "
                     "directory)")
    for key, path in (("data.path", d.path), ("data.val_path", d.val_path)):
        if path and not Path(path).exists():
            found.append(f"{key} {path} does not exist")
    if d.path and d.task == "echo" and not d.reward and not config.rollout.environment \
            and not reward_model.configured(config):
        found.append("data.path needs a reward: data.reward=module:function, or data.task=gsm8k for the GSM8K answer "
                     "check")
    if (d.val_path or d.val_fraction) and not d.path:
        found.append("data.val_path / data.val_fraction need data.path (the echo task has no held-out set)")
    if config.run.val_every and not (d.val_path or d.val_fraction):
        found.append("run.val_every needs a validation set: data.val_path=... or data.val_fraction=...")
    if not 0 <= d.val_fraction < 1:
        found.append(f"data.val_fraction must be in [0, 1), got {d.val_fraction}")
    if d.chat_template not in ("auto", "none"):
        found.append(f"data.chat_template must be auto or none, got {d.chat_template!r}")
    if d.reward_style not in ("auto", "simple", "verl", "trl"):
        found.append(f"data.reward_style must be auto, simple, verl or trl, got {d.reward_style!r}")
    if d.max_prompt_tokens is not None and d.max_prompt_tokens < 1:
        found.append(f"data.max_prompt_tokens must be a positive integer or null, got {d.max_prompt_tokens}")
    return found


def correction_problems(algorithm) -> list[str]:
    """``algorithm.rollout_correction`` and ``_cap`` (the step weighs every corrected term with them)."""
    found, mode = [], algorithm.rollout_correction
    if mode not in CORRECTION_MODES:
        found.append(not_one_of("algorithm.rollout_correction", mode, CORRECTION_MODES))
    if not algorithm.rollout_correction_cap > 1:
        found.append(f"algorithm.rollout_correction_cap must be > 1, got {algorithm.rollout_correction_cap}")
    return found


def setup_problems(config, world_size: int) -> list[str]:
    """What the valid keys make together: sizes, sampling, the rollout engine and multi-turn settings, the engine
    options."""
    found = batch_problems(config, world_size)
    r = config.rollout
    if not 0 < r.top_p <= 1 or r.temperature <= 0:
        found.append("rollout.top_p must be in (0, 1] and rollout.temperature > 0")
    if config.data.task not in ("echo", "gsm8k"):
        found.append(f"data.task must be echo or gsm8k, got {config.data.task!r}")
    from ..rollout.engines import check_engine  # loads the plugins: an engine that fails to import stops us here

    found += check_engine(r.engine)
    from ..rollout import multi_turn
    from .model import build_model

    found += multi_turn.check(config, lambda: build_model(config.model)[0], prompt_token_limit(config))
    if r.engine == "vllm":
        found += vllm_check(config, world_size)
    found += reward_model.reach_problems(config)  # a judge_url that does not answer: every reward would be 0
    try:
        engine_config(config, world_size)
    except (ValueError, TypeError) as exc:
        found.append(str(exc))
    return found


def engine_facts():
    """The backend's ``inference_engine_facts()`` (the defaults when the backend is unusable: its own problem is
    reported when the workers start)."""
    import accel_backends

    try:
        return accel_backends.get_backend().inference_engine_facts()
    except Exception:  # noqa: BLE001
        return accel_backends.InferenceEngineFacts()


def vllm_check(config, world_size: int) -> list[str]:
    """``rollout.engine=vllm``'s problems (vLLM missing: the package this device needs; ``rollout.vllm.*``)."""
    from ..rollout.engines.vllm_settings import vllm_problems

    return vllm_problems(config, world_size, max_sequence_tokens(config), engine_facts())


def sequence_parallel_problems(config, sp, world_size: int) -> list[str]:
    """``engine.sequence_parallel_size`` against the world size and the rollout engine (the model's own limits are
    the engine's, checked when it is built)."""
    if not isinstance(sp, int) or isinstance(sp, bool) or sp <= 1:
        return []  # 1, or a value engine_config refuses
    found = list(config_problems(sp, world_size))
    if config.rollout.engine == "vllm" and config.rollout.vllm.mode != "server":
        found.append(f"engine.sequence_parallel_size={sp} with rollout.engine=vllm in colocate mode is not supported "
                     "(every rank of a group would hold its own vLLM engine generating the same prompts): use "
                     "rollout.engine=hf, or rollout.vllm.mode=server")
    return found


def batch_problems(config, world_size: int) -> list[str]:
    """Step, update and micro-batch sizes that cannot work (the values are positive integers here)."""
    t, r = config.train, config.rollout
    sp = config.engine.get("sequence_parallel_size", 1)
    found = sequence_parallel_problems(config, sp, world_size)
    groups = data_parallel_groups(config, world_size)
    if t.prompts_per_step % groups:
        where = f"{world_size} ranks" if groups == world_size else f"{groups} data-parallel groups ({world_size} " \
            f"ranks / engine.sequence_parallel_size={sp})"
        found.append(f"train.prompts_per_step={t.prompts_per_step} does not divide over {where}")
    if t.mini_batch_size is not None and t.prompts_per_update is not None:
        found.append("set train.prompts_per_update (over all ranks) or the deprecated train.mini_batch_size (per "
                     "rank), not both")
    elif t.mini_batch_size is not None and not t.prompts_per_step % groups:
        per_rank = t.prompts_per_step // groups * r.n
        if per_rank % t.mini_batch_size:
            found.append(f"each rank rolls out {per_rank} sequences (prompts_per_step / ranks x rollout.n), which "
                         f"train.mini_batch_size={t.mini_batch_size} does not divide")
    elif t.prompts_per_update is not None and t.prompts_per_step % t.prompts_per_update:
        found.append(f"train.prompts_per_update={t.prompts_per_update} does not divide "
                     f"train.prompts_per_step={t.prompts_per_step}: every optimizer update takes as many prompts")
    if t.micro_batch_tokens is not None:
        limit = prompt_token_limit(config)
        if limit is None:
            found.append("train.micro_batch_tokens needs data.max_prompt_tokens (the longest prompt kept) so that "
                         "every sequence is known to fit the budget before training starts")
        elif limit + r.max_new_tokens > t.micro_batch_tokens:
            longest = limit + r.max_new_tokens
            found.append(f"train.micro_batch_tokens={t.micro_batch_tokens} is smaller than the longest possible "
                         f"sequence, {longest} tokens (prompt limit {limit} + rollout.max_new_tokens "
                         f"{r.max_new_tokens}): raise train.micro_batch_tokens to at least {longest}, or lower "
                         "data.max_prompt_tokens or rollout.max_new_tokens")
    return found
