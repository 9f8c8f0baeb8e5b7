"""Where rank 0 sends each step's metrics (``run.loggers``): ``jsonl`` (always) and ``tensorboard``."""

from __future__ import annotations

from pathlib import Path

from .report import MetricsLog

LOGGERS = ("jsonl", "tensorboard")


def require_tensorboard() -> None:
    """Fail before any worker starts when ``tensorboard`` is asked for but not installed."""
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        raise ValueError("run.loggers includes tensorboard, which is not installed: pip install "
                         "'accel-backends[tensorboard]' (or tensorboard), or use run.loggers=[jsonl]") from None


class TensorBoardLogger:
    """Event files under ``<run dir>/tensorboard``; every number in a step's metrics becomes a scalar."""

    def __init__(self, directory: Path, resume_step: int) -> None:
        require_tensorboard()
        from torch.utils.tensorboard import SummaryWriter

        # purge_step drops events after the checkpoint's step, as metrics.jsonl drops its lines.
        self.writer = SummaryWriter(log_dir=str(directory), purge_step=resume_step + 1 if resume_step else None)

    def write(self, metrics: dict) -> None:
        step = int(metrics["step"])
        for key, value in metrics.items():
            if key != "step" and isinstance(value, (int, float)):
                self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def write_samples(self, records: list[dict]) -> None:
        """A step's sampled responses as one text entry (tag ``samples``): a table per prompt."""
        if not records:
            return
        lines, prompt = [], None
        for record in records:
            if record["prompt"] != prompt:
                prompt = record["prompt"]
                lines += ["", f"**prompt:** `{_cell(prompt)}`", "", "| reward | advantage | response |",
                          "|---|---|---|"]
            response = _cell(record["response"])
            lines.append(f"| {record['reward']:.4g} | {record['advantage']:.4g} | `{response}` |")
        self.writer.add_text("samples", "\n".join(lines).strip(), int(records[0]["step"]))
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def _cell(text: str) -> str:
    """Text that stays inside one Markdown table cell."""
    return text.replace("|", "\\|").replace("`", "'").replace("\n", " ")


class Loggers:
    """All configured loggers behind one ``write``."""

    def __init__(self, names: list[str], run_dir: Path, resume_step: int) -> None:
        self.loggers = [MetricsLog(run_dir / "metrics.jsonl", resume_step)]
        self.samples = MetricsLog(run_dir / "samples.jsonl", resume_step)  # run.log_samples prompts per step
        if "tensorboard" in names:
            self.loggers.append(TensorBoardLogger(run_dir / "tensorboard", resume_step))

    def write(self, metrics: dict) -> None:
        for logger in self.loggers:
            logger.write(metrics)

    def write_samples(self, records: list[dict]) -> None:
        for record in records:
            self.samples.write(record)
        for logger in self.loggers:
            getattr(logger, "write_samples", lambda _: None)(records)

    def close(self) -> None:
        for logger in self.loggers:
            getattr(logger, "close", lambda: None)()
