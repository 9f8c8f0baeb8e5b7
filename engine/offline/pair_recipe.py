"""``PairRecipe``: what DPO's and the reward model's recipes share beyond every offline recipe's (``recipe.py``): the
pairs planned, the resume rules, the eval inputs and the done line. A subclass names its objective's module, its
checks, the metric its done line reports and, for a reward model, the margin column."""

from __future__ import annotations

from . import pair_eval
from .pair_config import PAIR_RESUME_FIXED, plan_pairs
from .recipe import OfflineRecipe


class PairRecipe(OfflineRecipe):
    accuracy: tuple[str, str] = ("accuracy", "accuracy")  # (metric, words) of the done line
    resume_fixed = PAIR_RESUME_FIXED

    def check_options(self, config, world_size: int) -> list[str]:
        raise NotImplementedError

    def margin_key(self, config) -> str | None:
        return None

    def check(self, config, world_size):
        return self.check_options(config, world_size)

    def plan(self, config, world_size, *, verbose):
        return plan_pairs(self.tool, config, world_size, verbose=verbose, margin_key=self.margin_key(config))

    def eval_problems(self, config, target, world_size):
        return pair_eval.problems(config, target) + self.check_options(config, world_size)

    def eval_inputs(self, config):
        return pair_eval.inputs(config, self.margin_key(config))

    def done_line(self, rows, seconds):
        rows = [row for row in rows if "loss" in row]
        if not rows:
            return None
        final, (metric, words) = rows[-5:], self.accuracy
        line = (f"{self.tool}: done in {seconds:.0f} s; loss {rows[0]['loss']:.3f} at the first step, "
                f"{sum(r['loss'] for r in final) / len(final):.3f} over the last {len(final)}, {words} "
                f"{sum(r[metric] for r in final) / len(final):.3f}")
        vals = [row for row in rows if "val/loss" in row]
        if vals:
            line += f"; validation loss {vals[-1]['val/loss']:.3f}, {words} {vals[-1]['val/' + metric]:.3f}"
        return line
