"""``GRPOConfig``: presets, a YAML file and ``key=value`` overrides, checked before any worker starts."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from accel_backends.names import did_you_mean

from ...config import EngineConfig
from ...rl import reward_model
from ...rl.algorithms import AGGREGATION_MODES, KL_KINDS, SCALE_MODES
from ...rl.model import BUILTIN_MODEL, check_model_dir
from ...rl.rollout_correction import CORRECTION_MODES
from ...rl.sizes import (  # noqa: F401  (GRPO's names for them)
    data_parallel_groups,
    mini_batch_sequences,
    prompts_per_rank,
    sequences_per_rank,
    updates_per_step,
)
from ...sequence_parallel import config_problems
from ...train import config as train_config
from ...train.config import apply, coerce, parse_override  # noqa: F401  (GRPO's names for them)
from ...train.settings import missing_model, run_problems
from .loss_types import LOSS_TYPES
from .schema import (  # noqa: F401  (the config's sections, by their usual names)
    PRESETS,
    AlgorithmConfig,
    DataConfig,
    GRPOConfig,
    RolloutConfig,
    RunConfig,
    TrainConfig,
)


def build_config(preset: str | None, config_file: str | None, overrides: list[str]) -> GRPOConfig:
    """Preset, then the YAML file, then the overrides, in that order (``engine.train.config``)."""
    return train_config.build_config(GRPOConfig, PRESETS, preset, config_file, overrides)


def require_valid(config: GRPOConfig, world_size: int) -> None:
    """``check``'s problems as one ValueError: one line for one problem, a list for several."""
    train_config.require_valid(check(config, world_size))


def apply_loss_type(config: GRPOConfig) -> list[str]:
    """Fill the keys ``algorithm.loss_type`` decides that were left null, and move deprecated keys to their new
    names. Returns notices for the user (one sentence each). An unknown loss type is left for ``check``."""
    a, notices = config.algorithm, []
    if a.kl_coef is not None:
        notices.append(f"algorithm.kl_coef is deprecated: it is algorithm.kl_loss_coef (the KL term in the loss: "
                       f"verl's actor.kl_loss_coef, TRL's beta); using kl_loss_coef={a.kl_coef}")
        a.kl_loss_coef, a.kl_coef = a.kl_coef, None
    if a.norm_by_std is not None:
        implied = "group" if a.norm_by_std else "none"
        if a.scale_rewards is None or a.scale_rewards == implied:
            notices.append(f"algorithm.norm_by_std is deprecated: using algorithm.scale_rewards={implied}")
            a.scale_rewards = implied
        else:
            notices.append(f"algorithm.norm_by_std is deprecated and ignored: algorithm.scale_rewards="
                           f"{a.scale_rewards} is set")
        a.norm_by_std = None
    recipe = LOSS_TYPES.get(a.loss_type)
    if recipe is not None:
        for key in ("loss_agg", "clip_low", "clip_high", "scale_rewards"):
            if getattr(a, key) is None:
                setattr(a, key, getattr(recipe, "agg" if key == "loss_agg" else key))
    return notices


def _check_algorithm(config: GRPOConfig) -> list[str]:
    """The algorithm.* keys (and run.log_samples / run.val_before_train); safe on values of any type."""
    a, r, problems = config.algorithm, config.rollout, []
    if a.loss_type not in LOSS_TYPES:
        problems.append(f"algorithm.loss_type must be one of {', '.join(LOSS_TYPES)}, got {a.loss_type!r}"
                        f"{did_you_mean(str(a.loss_type), LOSS_TYPES, 'algorithm.loss_type=')}")
    if a.scale_rewards is not None and a.scale_rewards not in SCALE_MODES:
        problems.append(f"algorithm.scale_rewards must be one of {', '.join(SCALE_MODES)}, got {a.scale_rewards!r}")
    if a.loss_agg is not None and a.loss_agg not in AGGREGATION_MODES:
        problems.append(f"algorithm.loss_agg must be one of {', '.join(AGGREGATION_MODES)}, got {a.loss_agg!r}")
    recipe = LOSS_TYPES.get(a.loss_type)
    agg = a.loss_agg if a.loss_agg is not None else (recipe.agg if recipe else None)
    if agg == "seq-mean-token-sum-norm":
        length = a.loss_norm_length if a.loss_norm_length is not None else r.max_new_tokens
        if not isinstance(length, int) or isinstance(length, bool) or length < 1:
            problems.append(f"algorithm.loss_type={a.loss_type} (loss_agg seq-mean-token-sum-norm) divides by a length "
                            f"constant: set rollout.max_new_tokens or algorithm.loss_norm_length to a positive integer "
                            f"(got {length!r})")
    if recipe is not None:
        low = a.clip_low if a.clip_low is not None else recipe.clip_low
        high = a.clip_high if a.clip_high is not None else recipe.clip_high
        low_ok = 0 <= low <= 1 if recipe.loss_mode == "cispo" else 0 <= low < 1
        if not low_ok or high <= 0:
            problems.append(f"algorithm.clip_low must be in [0, 1) ([0, 1] for cispo) and algorithm.clip_high > 0, "
                            f"got {low} and {high}")
        if a.clip_c is not None and recipe.loss_mode != "vanilla":
            problems.append(f"algorithm.clip_c (dual clipping) does not apply to loss_type {a.loss_type}: set it to "
                            "null")
    if a.clip_c is not None and a.clip_c <= 1:
        problems.append("algorithm.clip_c must be > 1 (or null)")
    if a.kl_kind not in KL_KINDS:
        problems.append(f"algorithm.kl_kind must be one of {', '.join(KL_KINDS)}")
    for name in ("entropy_coeff", "kl_loss_coef", "kl_coef", "overlong_penalty_factor"):
        value = getattr(a, name)
        if value is not None and value < 0:
            problems.append(f"algorithm.{name} must be >= 0, got {value}")
    if a.filter_groups and (not isinstance(r.n, int) or r.n < 2):
        problems.append(f"algorithm.filter_groups needs rollout.n >= 2 (the rewards of a group of one are always "
                        f"all equal), got rollout.n={r.n!r}")
    if a.max_gen_batches < 1:
        problems.append(f"algorithm.max_gen_batches must be a positive integer, got {a.max_gen_batches}")
    if a.overlong_buffer_len < 0:
        problems.append(f"algorithm.overlong_buffer_len must be >= 0 (0: off), got {a.overlong_buffer_len}")
    elif a.overlong_buffer_len and isinstance(r.max_new_tokens, int) and a.overlong_buffer_len >= r.max_new_tokens:
        problems.append(f"algorithm.overlong_buffer_len={a.overlong_buffer_len} must be smaller than "
                        f"rollout.max_new_tokens={r.max_new_tokens} (the penalty starts that many tokens before the "
                        "limit)")
    if a.rollout_correction not in CORRECTION_MODES:
        problems.append(f"algorithm.rollout_correction must be one of {', '.join(CORRECTION_MODES)}, got "
                        f"{a.rollout_correction!r}"
                        f"{did_you_mean(str(a.rollout_correction), CORRECTION_MODES, 'algorithm.rollout_correction=')}")
    if not a.rollout_correction_cap > 1:
        problems.append(f"algorithm.rollout_correction_cap must be > 1, got {a.rollout_correction_cap}")
    if config.run.log_samples < 0:
        problems.append(f"run.log_samples must be >= 0, got {config.run.log_samples}")
    if config.run.val_before_train and not (config.data.val_path or config.data.val_fraction):
        problems.append("run.val_before_train needs a validation set: data.val_path=... or data.val_fraction=...")
    return problems
def prompt_token_limit(config: GRPOConfig) -> int | None:
    """The longest prompt a run can see, in tokens, when known before any data is read: ``data.max_prompt_tokens``,
    or the built-in echo task's longest prompt (one token per character at most)."""
    if config.data.max_prompt_tokens:
        return config.data.max_prompt_tokens
    if not (config.data.path or config.data.val_path) and config.data.task == "echo":
        from ...rl.prompts import EchoTask

        return EchoTask().longest_prompt_chars()
    return None


def max_sequence_tokens(config: GRPOConfig) -> int | None:
    """The longest prompt + response a run can see, when the prompt limit is known before any data is read."""
    limit = prompt_token_limit(config)
    return None if limit is None else limit + config.rollout.max_new_tokens


def deprecation_notices(config: GRPOConfig, world_size: int) -> list[str]:
    """Settings that still work this release but will not in the next, each with its replacement."""
    notices = []
    t = config.train
    if t.mini_batch_size is not None:
        prompts = mini_batch_sequences(config, world_size) / config.rollout.n
        equivalent = f"{prompts:g}" if prompts == int(prompts) else f"about {prompts:.1f}"
        notices.append(f"train.mini_batch_size counts sequences per rank and is deprecated (removed in the next "
                       f"release): set train.prompts_per_update, prompts per optimizer update over all ranks "
                       f"({equivalent} here on {world_size} rank(s)), which makes the same updates on any number of "
                       "ranks")
    return notices


def derived(config: GRPOConfig, world_size: int) -> dict:
    """The values that follow from the options and the world size (``--print-config``, ``config.json``); with
    vLLM servers, what ``rollout.vllm.borrow_threads`` comes to on this host (``borrow_threads``)."""
    from ...rollout.borrowing import shown_borrowing

    borrowing = shown_borrowing(config.rollout, world_size)
    return {
        "world_size": world_size,
        "prompts_per_rank": prompts_per_rank(config, world_size),
        "sequences_per_rank": sequences_per_rank(config, world_size),
        "sequences_per_update": mini_batch_sequences(config, world_size),  # over all ranks
        "micro_batch_tokens_per_rank": config.train.micro_batch_tokens,
        "micro_batch_size_per_rank": None if config.train.micro_batch_tokens else config.train.micro_batch_size,
        "optimizer_steps_per_step": updates_per_step(config, world_size),
        "total_optimizer_steps": config.train.steps * updates_per_step(config, world_size),
        **({"borrow_threads": borrowing} if borrowing else {}),
    }


def resolved(config: GRPOConfig, world_size: int) -> dict:
    """The whole configuration as a run uses it: every option, every engine default, and the derived values."""
    data = config.to_dict()
    data["engine"] = dataclasses.asdict(engine_config(config, world_size))
    data["derived"] = derived(config, world_size)
    return data


def engine_config(config: GRPOConfig, world_size: int, frozen: bool = False) -> EngineConfig:
    options = dict(config.engine)
    options.setdefault("seed", config.train.seed)
    # The schedule advances once per optimizer step, and a GRPO step may make several.
    options.setdefault("total_steps", config.train.steps * updates_per_step(config, world_size))
    if frozen:
        keep = {"fsdp_version", "mixed_precision", "wrap_class_names", "dist_timeout_s", "seed", "lora_rank",
                "lora_alpha", "lora_target_modules", "attn_implementation", "sequence_parallel_size"}
        options = {k: v for k, v in options.items() if k in keep}
        options.update(frozen=True, param_offload=config.algorithm.ref_param_offload)
    return train_config.engine_options(options, {})


def engine_facts():
    """The backend's ``inference_engine_facts()`` (the defaults when the backend is unusable: its own problem is
    reported when the workers start)."""
    import accel_backends

    try:
        return accel_backends.get_backend().inference_engine_facts()
    except Exception:  # noqa: BLE001
        return accel_backends.InferenceEngineFacts()


def vllm_check(config: GRPOConfig, world_size: int) -> list[str]:
    """``rollout.engine=vllm``'s problems (vLLM missing: the package this device needs; ``rollout.vllm.*``)."""
    from ...rollout.engines.vllm_settings import vllm_problems

    return vllm_problems(config, world_size, max_sequence_tokens(config), engine_facts())


def sequence_parallel_problems(config: GRPOConfig, sp, world_size: int) -> list[str]:
    """``engine.sequence_parallel_size`` against the world size and the rollout engine (the model's own limits are
    the engine's, checked when it is built)."""
    if not isinstance(sp, int) or isinstance(sp, bool) or sp <= 1:
        return []  # 1, or a value engine_config refuses
    problems = list(config_problems(sp, world_size))
    if config.rollout.engine == "vllm" and config.rollout.vllm.mode != "server":
        problems.append(f"engine.sequence_parallel_size={sp} with rollout.engine=vllm in colocate mode is not "
                        "supported (every rank of a group would hold its own vLLM engine generating the same "
                        "prompts): use rollout.engine=hf, or rollout.vllm.mode=server")
    return problems


def _batch_problems(config: GRPOConfig, world_size: int) -> list[str]:
    """Step, update and micro-batch sizes that cannot work (the values are positive integers here)."""
    problems = []
    t, r = config.train, config.rollout
    sp = config.engine.get("sequence_parallel_size", 1)
    problems += sequence_parallel_problems(config, sp, world_size)
    groups = data_parallel_groups(config, world_size)
    if t.prompts_per_step % groups:
        where = f"{world_size} ranks" if groups == world_size else f"{groups} data-parallel groups ({world_size} " \
            f"ranks / engine.sequence_parallel_size={sp})"
        problems.append(f"train.prompts_per_step={t.prompts_per_step} does not divide over {where}")
    if t.mini_batch_size is not None and t.prompts_per_update is not None:
        problems.append("set train.prompts_per_update (over all ranks) or the deprecated train.mini_batch_size (per "
                        "rank), not both")
    elif t.mini_batch_size is not None and not t.prompts_per_step % groups:
        per_rank = t.prompts_per_step // groups * r.n
        if per_rank % t.mini_batch_size:
            problems.append(f"each rank rolls out {per_rank} sequences (prompts_per_step / ranks x rollout.n), "
                            f"which train.mini_batch_size={t.mini_batch_size} does not divide")
    elif t.prompts_per_update is not None and t.prompts_per_step % t.prompts_per_update:
        problems.append(f"train.prompts_per_update={t.prompts_per_update} does not divide "
                        f"train.prompts_per_step={t.prompts_per_step}: every optimizer update takes as many prompts")
    if t.micro_batch_tokens is not None:
        limit = prompt_token_limit(config)
        if limit is None:
            problems.append("train.micro_batch_tokens needs data.max_prompt_tokens (the longest prompt kept) so that "
                            "every sequence is known to fit the budget before training starts")
        elif limit + r.max_new_tokens > t.micro_batch_tokens:
            longest = limit + r.max_new_tokens
            problems.append(f"train.micro_batch_tokens={t.micro_batch_tokens} is smaller than the longest possible "
                            f"sequence, {longest} tokens (prompt limit {limit} + rollout.max_new_tokens "
                            f"{r.max_new_tokens}): raise train.micro_batch_tokens to at least {longest}, or lower "
                            "data.max_prompt_tokens or rollout.max_new_tokens")
    return problems


def check(config: GRPOConfig, world_size: int) -> list[str]:
    """Every problem that can be found before a worker starts (paths, sizes, names), as sentences."""
    problems = []
    t, r = config.train, config.rollout
    if config.model.path is None:
        problems.append(missing_model(config.preset))
    elif config.model.path != BUILTIN_MODEL:
        problems += check_model_dir(config.model.path)
    d = config.data
    if d.task == "gsm8k" and not d.path:
        problems.append("task gsm8k needs data.path=/path/to/train.jsonl (a JSONL, JSON or Parquet file or a "
                        "datasets directory)")
    for key, path in (("data.path", d.path), ("data.val_path", d.val_path)):
        if path and not Path(path).exists():
            problems.append(f"{key} {path} does not exist")
    if d.path and d.task == "echo" and not d.reward and not config.rollout.environment \
            and not reward_model.configured(config):
        problems.append("data.path needs a reward: data.reward=module:function, or data.task=gsm8k for the GSM8K "
                        "answer check")
    if (d.val_path or d.val_fraction) and not d.path:
        problems.append("data.val_path / data.val_fraction need data.path (the echo task has no held-out set)")
    if config.run.val_every and not (d.val_path or d.val_fraction):
        problems.append("run.val_every needs a validation set: data.val_path=... or data.val_fraction=...")
    if not 0 <= d.val_fraction < 1:
        problems.append(f"data.val_fraction must be in [0, 1), got {d.val_fraction}")
    if d.chat_template not in ("auto", "none"):
        problems.append(f"data.chat_template must be auto or none, got {d.chat_template!r}")
    if d.reward_style not in ("auto", "simple", "verl", "trl"):
        problems.append(f"data.reward_style must be auto, simple, verl or trl, got {d.reward_style!r}")
    if d.max_prompt_tokens is not None and d.max_prompt_tokens < 1:
        problems.append(f"data.max_prompt_tokens must be a positive integer or null, got {d.max_prompt_tokens}")
    problems += run_problems(config.run) + reward_model.problems(config)
    if r.top_k < 0 or r.val_n < 1 or r.val_temperature < 0 or config.run.val_every < 0:
        problems.append("rollout.top_k and run.val_every must be >= 0, rollout.val_n >= 1, "
                        "rollout.val_temperature >= 0")
    if str(config.engine.get("mixed_precision", "")) == "fp16":
        problems.append("engine.mixed_precision=fp16 is not supported by accel-grpo (no loss scaling: token-weighted "
                        "losses overflow in fp16); use engine.mixed_precision=bf16 (or auto)")
    for name, value in (("train.steps", t.steps), ("train.prompts_per_step", t.prompts_per_step),
                        ("train.ppo_epochs", t.ppo_epochs), ("train.micro_batch_size", t.micro_batch_size),
                        ("rollout.n", r.n), ("rollout.max_new_tokens", r.max_new_tokens)):
        if not isinstance(value, int) or value < 1:
            problems.append(f"{name} must be a positive integer, got {value!r}")
    optional = (("train.prompts_per_update", t.prompts_per_update), ("train.mini_batch_size", t.mini_batch_size),
                ("train.micro_batch_tokens", t.micro_batch_tokens))
    for name, value in optional:
        if value is not None and (not isinstance(value, int) or value < 1):
            problems.append(f"{name} must be a positive integer or null, got {value!r}")
    if not isinstance(t.padding_free, bool):
        problems.append(f"train.padding_free must be true or false, got {t.padding_free!r}")
    problems += _check_algorithm(config)
    from ...rl.ahead import staleness_problems
    from ...rollout.engines.vllm_settings import inert_problems

    problems += staleness_problems(config) + inert_problems(config.rollout, engine_facts())
    if problems:
        return problems
    problems += _batch_problems(config, world_size)
    if r.n < 2:
        problems.append("rollout.n must be at least 2: GRPO compares samples within a group")
    if not 0 < r.top_p <= 1 or r.temperature <= 0:
        problems.append("rollout.top_p must be in (0, 1] and rollout.temperature > 0")
    if config.data.task not in ("echo", "gsm8k"):
        problems.append(f"data.task must be echo or gsm8k, got {config.data.task!r}")
    from ...rollout.engines import check_engine  # loads the plugins: an engine that fails to import stops us here

    problems += check_engine(r.engine)
    from ...rl.model import build_model
    from ...rollout import multi_turn

    problems += multi_turn.check(config, lambda: build_model(config.model)[0], prompt_token_limit(config))
    if r.engine == "vllm":
        problems += vllm_check(config, world_size)
    try:
        engine_config(config, world_size)
    except (ValueError, TypeError) as exc:
        problems.append(str(exc))
    return problems
