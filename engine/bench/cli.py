"""``accel-bench``: every engine option and the GRPO step, measured side by side in one run.

Scenarios (``--scenarios``, default all but vllm_alone and distill):
  mode_switch  train_mode entry: fast path vs the pre-fix behaviour at 2 and 28 layers; parameter/optimizer
               offload round trips (time, bytes, moves, bandwidth); optimizer onload "step" vs "mode"
  grad_accum   1/2/4/8 micro-batches x FSDP1/FSDP2 x every / deferred / deferred+unsharded: step time,
               all-gathers, reduce-scatters and bytes per step (counted), peak memory; what grad_sync="auto" chose
  overhead     the engine's step against a minimal hand-written FSDP2 loop with the same optimisations
  rollout      FSDPEngine.generate: tokens per second and all-gathers per call, for two lengths; with
               --rollout-model, the rollout engines hf and hf-continuous side by side (time, tokens computed and
               produced, collectives per call)
  grpo         one GRPO step of a preset (cpu-demo): rollout, old/ref log-probs, update, tokens per second
  packing      one GRPO rollout's update, packed / padded / as before packing, interleaved: time, pad tokens,
               peak memory per token budget
  sft          one accel-sft step at 8 micro-batches per rank: packed deferred / packed every-micro-batch sync /
               padded, interleaved: step time, supervised tokens per second; activations per token budget
  sequence_parallel
               one long sequence's forward/backward at sp=1 and sp=2 (--sp-tokens), interleaved: time, the
               all-to-all exchange's time and bytes, activations and peak memory per rank (needs an even --nproc)
  distill      one on-policy distillation step against one GRPO step (no reference) on the same student, prompts
               and geometry, interleaved: seconds per response token, the ratio, the teacher's forward
  vllm_alone   vLLM by itself (where it is installed) decoding the GRPO model's geometry, one fresh process per
               thread count and binding: response tokens per second, to read the grpo scenario's rollout phase
               (--grpo-override rollout.engine=vllm) against; needs --grpo-model-dir or --grpo-case long
  lora_sync    (not in "all": needs vLLM) a LoRA policy's pushes to a colocated vLLM engine, rollout.vllm.lora_sync
               merged against adapter, two processes driven in turn: push time and bytes per update, decode tokens
               per second, on the mid-size and a larger geometry (--lora-geometries, --lora-rank)
  weight_sync  (not in "all") rollout.vllm.weight_sync full against delta, and the LoRA adapter alone, over the
               weight wire to a receiving thread: bytes and push time per update, the share of changed elements per
               step, per compute dtype and learning rate (--weight-sync-dtypes, --weight-sync-lrs, --steps)
  async_rollout
               (not in "all": needs vLLM, minutes per step) GRPO with one trainer and one vLLM server at
               rollout.max_staleness 0, 1, 2 against the colocated vLLM engine on 2 ranks, interleaved: response
               tokens per second, overlap, step time against the slower side, per binding (--async-*)
  scaling      (not in "all") the GRPO step on 1 rank against 2 ranks doing the same global work, the long-response
               case, jobs in turn (--scaling-*): the ratio of tokens per second, per phase wall and CPU seconds,
               threads per rank, collectives per step

--grpo-case long (grpo and packing) runs a model whose responses spread over 1..128 tokens (make-tiny-model
--hidden-size 128 --layers 4 --vocab-size 2048 --eos-bias 0.33 --single-eos, written to a temporary directory) on
16 echo prompts x 8 responses of up to 128 new tokens; --grpo-model-dir uses a model directory of your own.

Variants run interleaved (A, B, A, B...) and are reported as medians and min-max; ratios are the median over
rounds of each round's ratio. On a shared machine only ratios measured in one run mean anything.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import sys
import tempfile
from pathlib import Path

from . import (
    async_rollout,
    distill_step,
    grad_accum,
    grpo_step,
    lora_sync,
    mode_switch,
    overhead,
    packing,
    ppo_step,
    rollout,
    scaling,
    sequence_parallel,
    sft,
    vllm_alone,
    weight_sync,
)
from .common import LONG_CASE_MODEL, LONG_CASE_WORK, release  # noqa: F401  (the case's names, here too)
from .report import print_result

SCENARIOS = {"mode_switch": mode_switch.run, "grad_accum": grad_accum.run, "overhead": overhead.run,
             "rollout": rollout.run, "grpo": grpo_step.run, "packing": packing.run, "sft": sft.run,
             "sequence_parallel": sequence_parallel.run, "vllm_alone": vllm_alone.run, "lora_sync": lora_sync.run,
             "distill": distill_step.run, "ppo": ppo_step.run}
GRPO_SCENARIOS = ("grpo", "packing")
MODEL_DIR_SCENARIOS = GRPO_SCENARIOS + ("vllm_alone",)  # the scenarios that run --grpo-case / --grpo-model-dir
# Run by the launching process (they start processes of their own); named explicitly, never part of "all".
LAUNCHER_SCENARIOS = {"async_rollout": async_rollout.run, "scaling": scaling.run, "weight_sync": weight_sync.run}


def worker(options: dict) -> dict:
    import torch.distributed as dist

    import accel_backends

    backend = accel_backends.get_backend()
    backend.init_distributed()
    rank = dist.get_rank()
    result = {"backend": backend.name, "world_size": dist.get_world_size(), "options": options, "scenarios": {}}
    for name in options["scenarios"]:
        result["scenarios"][name] = SCENARIOS[name](options, backend, rank)
        release(backend)
    return result


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _positive_list(text: str) -> list[int]:
    values = [_positive(part) for part in text.split(",") if part.strip()]
    if not values:
        raise argparse.ArgumentTypeError("expected a comma-separated list of positive numbers, e.g. 1,2,4,8")
    return values


# Not in "all": named explicitly (vllm_alone and lora_sync need vLLM; distill and ppo build two trainers' runs).
ON_REQUEST = ("vllm_alone", "lora_sync", "distill", "ppo")
DEFAULT_SCENARIOS = [name for name in SCENARIOS if name not in ON_REQUEST]


def _scenarios(text: str) -> list[str]:
    if text == "all":
        return list(DEFAULT_SCENARIOS)
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [n for n in names if n not in SCENARIOS and n not in LAUNCHER_SCENARIOS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown scenario(s) {', '.join(unknown) or '(none)'}: choose from "
                                         f"{', '.join([*SCENARIOS, *LAUNCHER_SCENARIOS])} or all")
    return names


def _bindings(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names or any(n not in async_rollout.BINDINGS for n in names):
        raise argparse.ArgumentTypeError(f"bindings are {', '.join(async_rollout.BINDINGS)}, got {text!r}")
    return names


def _variants(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names or any(n not in async_rollout.VARIANTS for n in names):
        raise argparse.ArgumentTypeError(f"variants are {', '.join(async_rollout.VARIANTS)}, got {text!r}")
    return names


def _fsdp_versions(text: str) -> list[int]:
    values = _positive_list(text)
    if any(v not in (1, 2) for v in values):
        raise argparse.ArgumentTypeError(f"FSDP versions are 1 and 2, got {text!r}")
    return values


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="accel-bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--nproc", type=_positive, default=2, help="worker processes (ignored under torchrun)")
    add("--scenarios", type=_scenarios, default=list(DEFAULT_SCENARIOS),
        help="comma-separated, or all (default: every scenario but vllm_alone, which is run when named)")
    add("--json", type=Path, help="also write every figure to this file")
    add("--plot", type=Path, help="PNG of step time and collectives against micro-batches (needs grad_accum)")
    model = parser.add_argument_group("model (a randomly initialised Qwen2 built from a config)")
    model.add_argument("--hidden", type=_positive, default=64)
    model.add_argument("--intermediate", type=_positive, default=None, help="default: 2 x hidden")
    model.add_argument("--layers", type=_positive, default=2)
    model.add_argument("--heads", type=_positive, default=4)
    model.add_argument("--kv-heads", type=_positive, default=2)
    model.add_argument("--vocab", type=_positive, default=256)
    model.add_argument("--mixed-precision", choices=("auto", "fp32", "bf16", "fp16"), default="auto")
    work = parser.add_argument_group("work")
    work.add_argument("--batch", type=_positive, default=2, help="sequences per micro-batch")
    work.add_argument("--seq", type=_positive, default=32, help="tokens per sequence")
    work.add_argument("--steps", type=_positive, default=10, help="timed samples per variant")
    work.add_argument("--switches", type=_positive, default=10, help="timed mode-switch samples per variant")
    work.add_argument("--fsdp-version", type=int, choices=(1, 2), default=2,
                      help="for mode_switch and rollout")
    work.add_argument("--switch-layers", type=_positive_list, default=[2, 28], help="mode_switch model depths")
    work.add_argument("--fsdp-versions", type=_fsdp_versions, default=[1, 2], help="for grad_accum")
    work.add_argument("--micro-batch-counts", type=_positive_list, default=[1, 2, 4, 8], help="for grad_accum")
    work.add_argument("--micro-batches", type=_positive, default=4, help="for overhead")
    work.add_argument("--rollout-tokens", type=_positive_list, default=[8, 32], help="new tokens per generate")
    work.add_argument("--rollout-batch", type=_positive, default=8, help="sequences per generate")
    work.add_argument("--rollout-model", type=Path, default=None,
                      help="rollout: also compare the rollout engines (hf, hf-continuous) on this model directory, "
                           "e.g. from accel-grpo make-tiny-model DIR --hidden-size 128 --layers 4 --eos-bias 0.33 "
                           "--single-eos")
    work.add_argument("--rollout-prompts", type=_positive, default=16, help="prompts per rank for --rollout-model")
    work.add_argument("--rollout-n", type=_positive, default=8, help="responses per prompt for --rollout-model")
    work.add_argument("--rollout-max-new-tokens", type=_positive, default=128, help="for --rollout-model")
    grpo = parser.add_argument_group("grpo")
    grpo.add_argument("--grpo-preset", default="cpu-demo")
    grpo.add_argument("--grpo-steps", type=_positive, default=5, help="timed GRPO steps (after one warm-up)")
    grpo.add_argument("--grpo-override", dest="grpo_overrides", action="append", default=[], metavar="KEY=VALUE",
                      help="an accel-grpo override, e.g. train.prompts_per_step=8 (repeatable)")
    grpo.add_argument("--profile", action="store_true", help="add a torch.profiler table of one GRPO step")
    grpo.add_argument("--grpo-case", choices=("preset", "long"), default="preset",
                      help="long: responses spread over 1..128 tokens (see above); preset: the preset's own work")
    grpo.add_argument("--grpo-model-dir", type=Path, help="a model directory (sets model.path) for grpo and packing")
    grpo.add_argument("--packing-budgets", type=_positive_list, default=[256, 512, 1024, 2048],
                      help="token budgets whose update peak memory the packing scenario measures")
    ahead = parser.add_argument_group("async_rollout")
    ahead.add_argument("--async-steps", type=_positive, default=8,
                       help="GRPO steps per run: warm-up, timed, and a last one left out (4 for a quick look)")
    ahead.add_argument("--async-warmup", type=int, default=2, help="first steps of each run left out of the figures")
    ahead.add_argument("--async-rounds", type=_positive, default=1, help="runs per variant, interleaved")
    ahead.add_argument("--async-bindings", type=_bindings, default=["unbound", "split"],
                       help="unbound, split (server on the last core, trainer on the others), lend (server on "
                            "the last core, the trainer on every core, borrowing the server's while it idles: "
                            "rollout.vllm.borrow_threads), auto (the defaults only: each run starts its own "
                            "server, borrow_threads=auto places both), auto-lend, auto-split (auto with that "
                            "binding), comma-separated")
    ahead.add_argument("--async-threads", type=_positive, default=1, help="OMP threads of the server and trainer")
    ahead.add_argument("--async-variants", type=_variants, default=list(async_rollout.VARIANTS),
                       help=f"among {', '.join(async_rollout.VARIANTS)}")
    ahead.add_argument("--async-partial", action="store_true", help="rollout.partial=true in the server runs")
    ahead.add_argument("--async-case", choices=sorted(async_rollout.CASES), default="mid",
                       help="mid: 16 prompts x 8 responses of up to 128 tokens; long: 4 x 8 of up to 512")
    ahead.add_argument("--async-model-dir", type=Path, help="a model directory (default: the mid-size model)")
    scale = parser.add_argument_group("scaling (also --grpo-override, --grpo-preset)")
    scale.add_argument("--scaling-rounds", type=_positive, default=3, help="1-rank and 2-rank jobs, in turn")
    scale.add_argument("--scaling-steps", type=_positive, default=3, help="timed steps per job (after one warm-up)")
    scale.add_argument("--scaling-threads", type=_positive, default=1, help="intra-op threads of every rank")
    distill = parser.add_argument_group("distill")
    distill.add_argument("--distill-steps", type=_positive, default=5, help="timed rounds (after one warm-up)")
    distill.add_argument("--distill-teacher-hidden", type=_positive, default=128)
    distill.add_argument("--distill-teacher-layers", type=_positive, default=4)
    distill.add_argument("--distill-override", dest="distill_overrides", action="append", default=[],
                         metavar="KEY=VALUE", help="applied to both sides (e.g. model.path=DIR)")
    sp = parser.add_argument_group("sequence_parallel")
    sp.add_argument("--sp-tokens", type=_positive_list, default=[8192, 16384],
                    help="sequence lengths of the sequence_parallel scenario (each run at sp=1 and sp=2)")
    sp.add_argument("--sp-repeats", type=_positive, default=2, help="timed passes per variant and length")
    alone = parser.add_argument_group("vllm_alone")
    alone.add_argument("--vllm-prompts", type=_positive, default=16, help="prompts per sampling call")
    alone.add_argument("--vllm-n", type=_positive, default=8, help="responses per prompt")
    alone.add_argument("--vllm-max-tokens", type=_positive, default=128, help="the longest response")
    lora = parser.add_argument_group("lora_sync (also --vllm-prompts, --vllm-n, --vllm-max-tokens, --steps)")
    lora.add_argument("--lora-geometries", type=_geometries, default=list(lora_sync.GEOMETRIES),
                      help=f"among {', '.join(lora_sync.GEOMETRIES)}")
    lora.add_argument("--lora-rank", type=_positive, default=8, help="the policy's LoRA rank (also weight_sync's)")
    sync = parser.add_argument_group("weight_sync (also --steps, --lora-rank)")
    sync.add_argument("--weight-sync-dtypes", type=_dtypes, default=["bf16", "fp32"],
                      help="compute dtypes (the pushed weights' dtype), among bf16, fp32")
    sync.add_argument("--weight-sync-lrs", type=_learning_rates, default=[1e-6, 1e-5], help="Adam learning rates")
    return parser


def _dtypes(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names or any(n not in ("bf16", "fp32") for n in names):
        raise argparse.ArgumentTypeError(f"dtypes are bf16 and fp32, got {text!r}")
    return names


def _learning_rates(text: str) -> list[float]:
    try:
        values = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        values = []
    if not values or any(not 0 < v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"learning rates are numbers in (0, 1), comma-separated, got {text!r}")
    return values


def _geometries(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names or any(n not in lora_sync.GEOMETRIES for n in names):
        raise argparse.ArgumentTypeError(f"geometries are {', '.join(lora_sync.GEOMETRIES)}, got {text!r}")
    return names


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.plot and "grad_accum" not in args.scenarios:
        parser.error("--plot draws the grad_accum scenario: add it to --scenarios")
    if "async_rollout" in args.scenarios and not 0 <= args.async_warmup <= args.async_steps - 2:
        parser.error(f"--async-steps {args.async_steps} leaves no timed step after --async-warmup "
                     f"{args.async_warmup} and the last step (which is left out): use at least "
                     f"{max(args.async_warmup, 0) + 2}")
    if args.rollout_model is not None and not (args.rollout_model / "config.json").is_file():
        parser.error(f"--rollout-model {args.rollout_model} is not a model directory (no config.json): write one with "
                     "accel-grpo make-tiny-model DIR")
    with contextlib.ExitStack() as stack:
        for name in ("vllm_alone", "lora_sync"):
            if name in args.scenarios and importlib.util.find_spec("vllm") is None:
                parser.error(f"the {name} scenario needs vLLM in this Python (pip install vllm, or vLLM's CPU build)")
        if "scaling" in args.scenarios and (problem := scaling.settings_problem(args.grpo_preset, args.grpo_overrides)):
            parser.error(problem)
        if any(name in args.scenarios for name in MODEL_DIR_SCENARIOS):
            args.grpo_overrides = _case_overrides(args, stack) + args.grpo_overrides
            _check_grpo_settings(parser, args)
        options = {k: v for k, v in vars(args).items() if k not in ("nproc", "json", "plot", "grpo_model_dir")}
        options["rollout_model"] = str(args.rollout_model) if args.rollout_model else None
        if "distill" in args.scenarios:
            options["distill_teacher_dir"] = _distill_teacher(args, stack)
        paths = [o.split("=", 1)[1] for o in args.grpo_overrides if o.startswith("model.path=")]
        options["vllm_model_dir"] = paths[-1] if paths else None
        return _run_and_report(args, options)


def _case_overrides(args, stack: contextlib.ExitStack) -> list[str]:
    """Overrides for --grpo-case and --grpo-model-dir (a long-case model is written to a temporary directory)."""
    overrides = []
    model_dir = args.grpo_model_dir
    if args.grpo_case == "long":
        overrides += LONG_CASE_WORK
        if model_dir is None:
            from ..demo_model import make_tiny_model

            model_dir = make_tiny_model(Path(stack.enter_context(tempfile.TemporaryDirectory())) / "long-case",
                                        **LONG_CASE_MODEL)
    if model_dir is not None:
        overrides.append(f"model.path={model_dir}")
    return overrides


def _distill_teacher(args, stack: contextlib.ExitStack) -> str:
    """The distill scenario's teacher: the built-in character model at the asked size, in a temporary directory."""
    from ..rl.algorithms.distill.demo import write_char_model

    directory = Path(stack.enter_context(tempfile.TemporaryDirectory())) / "teacher"
    return str(write_char_model(directory, args.distill_teacher_hidden, args.distill_teacher_layers))


def _run_and_report(args, options: dict) -> int:
    from ..runtime import Interrupted, WorkerFailed, report_early_end, run

    in_workers = [name for name in options["scenarios"] if name in SCENARIOS]
    try:
        result = run(worker, args.nproc, {**options, "scenarios": in_workers}) if in_workers else _launcher_only()
    except (WorkerFailed, Interrupted) as exc:
        return report_early_end("accel-bench", exc, "no results written")
    for name in options["scenarios"]:
        if name in LAUNCHER_SCENARIOS:
            result["scenarios"][name] = LAUNCHER_SCENARIOS[name](options)
    print_result(result)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
        print(f"results written to {args.json}")
    if args.plot:
        from .plot import plot_grad_accum

        if plot_grad_accum(result, args.plot, args.json):
            print(f"plot written to {args.plot}")
    return 0


def _launcher_only() -> dict:
    import accel_backends

    return {"backend": accel_backends.get_backend().name, "world_size": 1, "scenarios": {}}


def _check_grpo_settings(parser, args) -> None:
    """Preset and overrides are checked here, before any worker starts."""
    from ..train.cli import load
    from ..train.registry import get_recipe

    recipe = get_recipe("grpo")
    try:
        config, notices, _ = load(recipe, args.grpo_preset, None, args.grpo_overrides)  # training's pipeline
    except (ValueError, FileNotFoundError) as exc:
        parser.error(f"grpo: {exc}")
    for notice in notices:
        print(f"accel-bench: notice: grpo: {notice}", file=sys.stderr)
    problems = recipe.check(config, args.nproc)
    if problems:
        parser.error("grpo: " + "; ".join(problems))
