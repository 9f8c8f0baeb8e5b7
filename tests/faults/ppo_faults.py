"""``accel-ppo`` killed between its two engines' saves: ``python tests/faults/ppo_faults.py RANK:STEP [args]``.

The real CLI and launcher run unchanged; only the worker is wrapped so that rank RANK SIGKILLs itself at the first
checkpoint after the policy's STEP-th update, once the policy's part is saved and before the critic's starts: a real
kill between the two saves.
"""

import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def faulty_worker(recipe_name: str, config_dict: dict, world_size: int, run_dir: str, resume: bool) -> dict:
    from engine.rl.algorithms.ppo.schema import PPOConfig
    from engine.train.registry import get_recipe

    rank, step = (int(x) for x in os.environ["PPO_KILL"].split(":"))
    trainer = get_recipe("ppo").trainer_of(PPOConfig.from_dict(config_dict), Path(run_dir), resume)
    critic = trainer.trained["critic"]
    save = critic.save_checkpoint

    def dying_save(path):
        if critic.rank == rank and trainer.actor.global_step == step:  # one policy update per step
            os.kill(os.getpid(), signal.SIGKILL)  # the policy's part of this step is on disk, the critic's is not
        save(path)

    critic.save_checkpoint = dying_save
    return trainer.train()


if __name__ == "__main__":
    import engine.rl.algorithms.ppo.cli as cli
    import engine.train.loop

    os.environ["PPO_KILL"] = sys.argv[1]
    engine.train.loop.worker = faulty_worker  # the frame's command runs the loop's worker on every rank
    sys.exit(cli.main(sys.argv[2:]))
