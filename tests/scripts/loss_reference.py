"""Write tests/data/loss_reference.json: GRPO's micro-batch loss, its weight, metrics, rollout-mismatch figures and
the gradients with respect to the policy's log-probs and entropy, for every loss type and option, as the trainer
computed them before the loss became a sum of terms (issue 36).

    git archive 311318f | tar -x -C /tmp/rl-main
    PYTHONPATH=/tmp/rl-main python tests/scripts/loss_reference.py tests/data/loss_reference.json

The committed file was written that way, from main at commit 311318f: the trainer's own ``GRPOTrainer.loss_fn``
ran on each case with the model's forward replaced by fixed log-probs and entropy (everything after the forward is
the code under test). tests/unit/test_loss_terms.py feeds the same inputs to today's loss and compares. Run again
only against that commit; the committed file must stay as it is.
"""

import json
import sys
from types import SimpleNamespace

import torch

B, T = 4, 7
LENGTHS = (7, 3, 5, 0)  # loss tokens per sequence; the last has none (a masked-out response)

# (name, algorithm overrides, what the micro-batch holds)
CASES = []
for loss_type in ("grpo", "dapo", "dr_grpo", "bnpo", "gspo", "cispo"):
    CASES.append((f"{loss_type}", {"loss_type": loss_type}, {}))
    CASES.append((f"{loss_type}-kl-entropy", {"loss_type": loss_type, "kl_loss_coef": 0.05, "entropy_coeff": 0.01},
                  {"ref": True}))
    CASES.append((f"{loss_type}-old-corrected", {"loss_type": loss_type}, {"old": True, "sampling": True}))
for agg in ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm",
            "micro-batch-token-mean"):
    CASES.append((f"agg-{agg}", {"loss_type": "grpo", "loss_agg": agg, "kl_loss_coef": 0.1, "entropy_coeff": 0.02},
                  {"ref": True, "old": True}))
for kind in ("k1", "abs", "k2", "k3"):
    CASES.append((f"kl-{kind}", {"loss_type": "dapo", "kl_loss_coef": 0.2, "kl_kind": kind}, {"ref": True}))
for mode in ("none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask"):
    CASES.append((f"correction-{mode}", {"loss_type": "dapo", "rollout_correction": mode,
                                         "rollout_correction_cap": 1.05}, {"sampling": True, "old": True}))
CASES += [
    ("dual-clip", {"loss_type": "dapo", "clip_c": 1.5}, {"old": True}),
    ("dual-clip-grpo-kl", {"loss_type": "grpo", "clip_c": 2.0, "kl_loss_coef": 0.1}, {"old": True, "ref": True}),
    ("clip-range", {"loss_type": "dapo", "clip_low": 0.01, "clip_high": 0.02}, {"old": True}),
    ("norm-length", {"loss_type": "dr_grpo", "loss_norm_length": 11}, {"old": True}),
    ("filler", {"loss_type": "dapo", "kl_loss_coef": 0.1}, {"ref": True, "filler": True}),
    ("token-sum-micro-batches", {"loss_type": "grpo", "loss_agg": "token-sum"}, {"old": True, "micro_batches": 5}),
]


def inputs(seed: int) -> dict:
    generator = torch.Generator().manual_seed(seed)

    def uniform(*shape):
        return torch.rand(*shape, generator=generator)

    mask = torch.zeros(B, T, dtype=torch.long)
    for row, length in enumerate(LENGTHS):
        mask[row, :length] = 1
    log_probs = -3 * uniform(B, T)
    return {"mask": mask, "log_probs": log_probs, "entropy": 2 * uniform(B, T),
            "old": log_probs + 0.3 * (uniform(B, T) - 0.5), "ref": log_probs + 0.5 * (uniform(B, T) - 0.5),
            "sampling": log_probs + 0.2 * (uniform(B, T) - 0.5), "advantages": 2 * (uniform(B) - 0.5)}


def run(case: tuple, loss_fn, settings_of, algorithm_config, mismatch_type) -> dict:
    name, overrides, holds = case
    data = inputs(len(name))
    algorithm = algorithm_config(**overrides)
    layout = SimpleNamespace(filler=bool(holds.get("filler")))
    layout.to = lambda device: layout
    micro = {"layout": layout, "loss_mask": data["mask"], "advantages": data["advantages"],
             "old_log_probs": data["old"] if holds.get("old") else None,
             "ref_log_probs": data["ref"] if holds.get("ref") else None,
             "sampling_log_probs": data["sampling"] if holds.get("sampling") else None,
             "micro_batches": holds.get("micro_batches", 3)}
    log_probs = data["log_probs"].clone().requires_grad_(True)
    entropy = data["entropy"].clone().requires_grad_(True)
    mismatch = mismatch_type()
    trainer = SimpleNamespace(
        loss=settings_of(algorithm, 9), backend=SimpleNamespace(device=lambda: torch.device("cpu")),
        config=SimpleNamespace(rollout=SimpleNamespace(temperature=1.0, top_k=0, top_p=1.0), algorithm=algorithm),
        actor=SimpleNamespace(sequence_parallel=SimpleNamespace(enabled=False)), _mismatch=mismatch)
    loss, weight, metrics = loss_fn(trainer, lambda: (log_probs, entropy), micro)
    loss.backward()
    return {"name": name, "overrides": overrides, "holds": holds, "max_new_tokens": 9, "seed": len(name),
            "loss": loss.item(), "weight": float(weight), "metrics": metrics,
            "grad_log_probs": log_probs.grad.tolist(),
            "grad_entropy": entropy.grad.tolist() if entropy.grad is not None else None,
            "mismatch": {**mismatch.sums(), **mismatch.maxima()} if holds.get("sampling") else None}


def main_loss_fn():
    """``GRPOTrainer.loss_fn`` of the tree on the path, with the model's forward replaced by a callable."""
    import engine.recipes.grpo.trainer as trainer_module

    def loss_fn(trainer, forward, micro):
        original = trainer_module.sequence_log_probs
        trainer_module.sequence_log_probs = lambda *args, **kwargs: forward()
        try:
            return trainer_module.GRPOTrainer.loss_fn(trainer, None, micro)
        finally:
            trainer_module.sequence_log_probs = original

    return loss_fn


def main(out: str) -> None:
    from engine.recipes.grpo.loss_types import resolve
    from engine.recipes.grpo.rollout_correction import MismatchStats
    from engine.recipes.grpo.schema import AlgorithmConfig

    loss_fn = main_loss_fn()
    cases = [run(case, loss_fn, resolve, AlgorithmConfig, MismatchStats) for case in CASES]
    seeds = sorted({case["seed"] for case in cases})
    stored = {str(seed): {key: value.tolist() for key, value in inputs(seed).items()} for seed in seeds}
    with open(out, "w") as f:
        json.dump({"commit": "311318f", "torch": torch.__version__, "inputs": stored, "cases": cases}, f)
        f.write("\n")
    print(f"wrote {len(cases)} cases to {out}")


if __name__ == "__main__":
    main(sys.argv[1])
