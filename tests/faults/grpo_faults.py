"""``accel-grpo`` with one fault injected: ``python tests/faults/grpo_faults.py KIND:RANK:STEP [accel-grpo args]``.

The real CLI and launcher run unchanged; only the worker is wrapped so that rank RANK, at GRPO step STEP (1-based):

* ``reward``: its reward scoring raises;
* ``kill-save``: it SIGKILLs itself while writing its part of that step's checkpoint;
* ``pause-rollout`` / ``pause-update``: it writes ``$FAULT_MARK`` and sleeps 3 s inside the rollout / the first
  micro-batch of the update, so that a test can send a signal that lands there.

``$FAULT_STAMP`` receives the time the fault fired (the tests measure fault -> clean exit).
"""

import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


class InjectedFault(RuntimeError):
    pass


def _mark(variable):
    path = os.environ.get(variable)
    if path:
        Path(path).write_text(repr(time.time()))


def faulty_worker(recipe_name: str, config_dict: dict, world_size: int, run_dir: str, resume: bool) -> dict:
    import engine.checkpoint.store
    import engine.rl.scoring as scoring
    from engine.rl.algorithms.grpo.config import GRPOConfig
    from engine.train.registry import get_recipe

    kind, rank, at = os.environ["GRPO_FAULT"].split(":")
    trainer = get_recipe("grpo").trainer_of(GRPOConfig.from_dict(config_dict), Path(run_dir), resume)
    armed = trainer.rank == int(rank)
    state = {"step": 0, "paused": False}

    def now() -> bool:
        return armed and state["step"] == int(at)

    def pause():
        if now() and not state["paused"]:
            state["paused"] = True
            _mark("FAULT_MARK")
            _mark("FAULT_STAMP")
            time.sleep(3)

    collect = trainer.collect

    def counting_collect(step):
        state["step"] = step + 1
        return collect(step)

    trainer.collect = counting_collect
    if kind == "reward":
        score_each = scoring.score_each  # what the RL step's scoring calls

        def raising_rewards(*args, **kwargs):
            if now():
                _mark("FAULT_STAMP")
                raise InjectedFault("reward function failed on purpose")
            return score_each(*args, **kwargs)

        scoring.score_each = raising_rewards
    elif kind == "kill-save":
        write_extra_state = engine.checkpoint.store.write_extra_state

        def dying_write(engine_, directory):
            if now():
                _mark("FAULT_STAMP")
                os.kill(os.getpid(), signal.SIGKILL)
            write_extra_state(engine_, directory)

        engine.checkpoint.store.write_extra_state = dying_write
    elif kind == "pause-rollout":
        sampler = trainer.sampler  # the trainer's one sampler (engine/rollout), single- or multi-turn

        def paused_sampler(*args, **kwargs):
            pause()
            return sampler(*args, **kwargs)

        trainer.sampler = paused_sampler
    elif kind == "pause-update":
        step_fn = trainer.loss_fn

        def paused_step_fn(module, micro):
            pause()
            return step_fn(module, micro)

        trainer.loss_fn = paused_step_fn
    else:
        raise ValueError(f"unknown fault {kind!r}")
    return trainer.train()


if __name__ == "__main__":
    import engine.rl.algorithms.grpo.cli as cli
    import engine.train.loop

    os.environ["GRPO_FAULT"] = sys.argv[1]
    engine.train.loop.worker = faulty_worker  # the frame's command runs the loop's worker on every rank
    sys.exit(cli.main(sys.argv[2:]))
