"""The SFT loop, run by every rank: for each global batch, this rank's micro-batches -> forward/backward with the
exact token-weighted loss (deferred gradient sync) -> optimizer step -> metrics -> validation -> checkpoint.

Data, masks and batching are decided before the loop (``dataset.py``, ``batches.py``); this file reads top to
bottom.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

import accel_backends

from .. import FSDPEngine, checkpoint, runtime
from ..train.loggers import Loggers
from ..train.progress import progress_bar
from ..train.report import plot_curves
from ..train.steps import advance, finish, save_if_due
from ..runtime import sum_over_ranks
from .batches import rank_micro_batches, schedule
from .config import SFTConfig, engine_config, resolved
from .dataset import build_data
from .loss import per_token_losses
from .model import load_tokenizer

CURVES = (("loss", "loss (supervised tokens)"), ("val/loss", "validation loss"),
          ("mean_token_accuracy", "token accuracy"), ("val/mean_token_accuracy", "validation token accuracy"),
          ("grad_norm", "grad norm"), ("lr", "learning rate"), ("tokens_per_s", "supervised tokens / s"),
          ("step_time_s", "step time (s)"))


def token_loss(module, micro, device) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Mean cross-entropy over the micro-batch's supervised tokens, weighted by their count (the engine then
    divides by the count of the whole global batch): ``(loss, weight, {"mean_token_accuracy": ...})``; logits are
    computed in chunks (``loss.py``)."""
    layout, mask = micro.layout.to(device), micro.mask.to(device)
    per_token, hits = per_token_losses(module, layout)  # logits exist one chunk of positions at a time
    count = mask.sum()
    denominator = count.clamp(min=1.0)
    loss = (per_token * mask).sum() / denominator
    correct = (hits.float() * mask).sum() / denominator
    return loss, count.detach(), {"mean_token_accuracy": correct}


class SFTTrainer:
    def __init__(self, config: SFTConfig, run_dir: Path, resume: bool) -> None:
        self.config = config
        self.run_dir = run_dir
        self.backend = accel_backends.get_backend()
        timeout = float(config.engine.get("dist_timeout_s", 1800.0))
        self.world_size = self.backend.init_distributed(timeout=timeout).world_size
        runtime.stop_at_safe_point(config.run.save_on_interrupt)
        self.tokenizer = load_tokenizer(config.model.path)
        self.data = build_data(config.data, config.train.loss_on, self.tokenizer, config.train.seed)
        t = config.train
        self.batches = schedule([len(item.ids) for item in self.data.train], batch_size=t.batch_size,
                                batch_tokens=t.batch_tokens, epochs=t.epochs, steps=t.steps, seed=t.seed)
        self.engine = FSDPEngine(config.model.path, engine_config(config, len(self.batches)), self.backend)
        self.rank = self.engine.rank
        self.packed = t.padding_free and self.engine.packed_input_supported()
        self.start_step = 0
        if resume:
            loaded = checkpoint.load_latest(self.engine, run_dir / "checkpoints", config.run.resume_fallback)
            self.start_step = checkpoint.step_of(loaded)

    def derived(self) -> dict:
        return {"world_size": self.world_size, "total_steps": len(self.batches), "format": self.data.format,
                "loss_on": self.data.loss_on, "train_examples": len(self.data.train),
                "val_examples": len(self.data.val), "packed": self.packed}

    def micro_batches(self, items):
        t = self.config.train
        return rank_micro_batches(items, self.rank, self.world_size, micro_batch_tokens=t.micro_batch_tokens,
                                  micro_batch_size=t.micro_batch_size, packed=self.packed)

    def _step_fn(self, module, micro):
        return token_loss(module, micro, self.backend.device())

    def train_step(self, step: int) -> dict:
        started = time.perf_counter()
        items = [self.data.train[i] for i in self.batches[step].indices]
        micro_batches, figures = self.micro_batches(items)
        with self.engine.train_mode():
            result = self.engine.forward_backward_batch(micro_batches, self._step_fn)
            grad_norm = self.engine.optimizer_step()
        elapsed = time.perf_counter() - started
        pads = sum_over_ranks({"pad_tokens": figures["pad_tokens"]}, self.backend.metrics_device())
        return {"step": step + 1, "epoch": self.batches[step].epoch, "loss": result["loss"],
                "mean_token_accuracy": result["mean_token_accuracy"], "num_tokens": result["weight"],
                "tokens_per_s": result["weight"] / elapsed, "step_time_s": elapsed, "grad_norm": grad_norm,
                "lr": self.engine.last_step_metrics["lr"], "sequences": float(len(items)),
                "micro_batches": figures["micro_batches"], "token_imbalance": figures["token_imbalance"],
                "pad_tokens": pads["pad_tokens"], "total_tokens": float(sum(len(i.ids) for i in items)),
                "skipped_updates": float(self.engine.last_step_metrics["skipped"]),
                "peak_memory_gib": self.engine.last_step_metrics["peak_memory_gib"]}

    def validate(self) -> dict:
        """Loss and token accuracy over the whole validation set: summed over its supervised tokens, over ranks."""
        if not self.data.val:
            return {}
        micro_batches, _ = self.micro_batches(self.data.val)
        with self.engine.eval_mode(), torch.no_grad():
            result = self.engine.forward_backward_batch(micro_batches, self._step_fn, forward_only=True)
        return {"val/loss": result["loss"], "val/mean_token_accuracy": result["mean_token_accuracy"],
                "val/num_tokens": result["weight"]}

    def _validates_after(self, step: int) -> bool:
        every = self.config.run.val_every
        return bool(self.data.val) and (step + 1 == len(self.batches) or bool(every and (step + 1) % every == 0))

    def train(self) -> dict:
        cfg = self.config
        total = len(self.batches)
        loggers = progress = None
        if self.rank == 0:
            loggers = Loggers(cfg.run.loggers, self.run_dir, self.start_step, resolved(cfg, self.derived()),
                              project="accel-sft")
            if cfg.run.progress:
                progress = progress_bar(total, self.start_step, "sft")
        last: dict = {}
        for step in range(self.start_step, total):
            last = self.train_step(step)
            if self._validates_after(step):
                last.update(self.validate())
            stopping = sum_over_ranks({"stop": float(runtime.stop_requested() > 0)},
                                      self.backend.metrics_device())["stop"] > 0
            if loggers is not None:
                loggers.write(last)
            shown = {"loss": f"{last['loss']:.3f}", "acc": f"{last['mean_token_accuracy']:.3f}"}
            if "val/loss" in last:
                shown["val_loss"] = f"{last['val/loss']:.3f}"
            advance(progress, shown)
            save_if_due(self.engine, self.run_dir, cfg.run, step, total, stopping=stopping, rank=self.rank,
                        progress=progress, tool="accel-sft")
            if stopping:
                break
        finish(progress, loggers, lambda: plot_curves(self.run_dir / "metrics.jsonl", self.run_dir / "curves.png",
                                                      CURVES))
        return last
