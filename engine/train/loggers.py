"""Where rank 0 sends each step's metrics (``run.loggers``): ``metrics.jsonl`` always, and optionally TensorBoard,
Weights & Biases and MLflow.

The trackers are optional extras: a missing package is named before any worker starts (``require_loggers``).
Each one receives every number of every step's metrics and, where it has parameters, the resolved configuration.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .report import MetricsLog
from .resume import flatten

LOGGERS = ("jsonl", "tensorboard", "wandb", "mlflow")
# logger -> (the module it needs, the extra that installs it)
_PACKAGES = {"tensorboard": ("tensorboard", "tensorboard"), "wandb": ("wandb", "wandb"),
             "mlflow": ("mlflow", "mlflow")}
MLFLOW_DATABASE = "mlflow.db"  # the default local store, in the run directory


def require_logger(name: str) -> None:
    """Fail before any worker starts when logger ``name`` needs a package that is not installed."""
    if name not in _PACKAGES:
        return
    module, extra = _PACKAGES[name]
    try:
        __import__(module)
    except ImportError:
        raise ValueError(f"run.loggers includes {name}, which is not installed: pip install "
                         f"'accel-backends[{extra}]' (or {module}), or remove {name} from run.loggers") from None
    if name == "mlflow" and not os.environ.get("MLFLOW_TRACKING_URI"):
        try:
            import alembic  # noqa: F401
            import sqlalchemy  # noqa: F401
        except ImportError as exc:
            raise ValueError(f"run.loggers includes mlflow, whose default local store (a SQLite file in the run "
                             f"directory) needs {exc.name}: pip install 'accel-backends[mlflow]', or set "
                             "MLFLOW_TRACKING_URI to your tracking server") from None


def require_loggers(names) -> None:
    """Everything the loggers in ``names`` need, checked in the launching process (before any worker starts)."""
    for name in names:
        require_logger(name)
    if "wandb" in names and os.environ.get("WANDB_MODE", "").lower() not in ("offline", "disabled", "dryrun"):
        import wandb

        try:
            wandb.login(verify=False)  # finds a key (WANDB_API_KEY, ~/.netrc) or asks on a terminal; no network
        except wandb.errors.UsageError as exc:
            raise ValueError(f"run.loggers includes wandb, but wandb has no API key here ({exc}): run wandb login "
                             "or set WANDB_API_KEY, or set WANDB_MODE=offline to log into the run directory without "
                             "an account (wandb sync uploads it later)") from None


def require_tensorboard() -> None:
    require_logger("tensorboard")


def numbers(metrics: dict) -> dict[str, float]:
    """The numeric entries of a step's metrics, without the step itself."""
    return {key: float(value) for key, value in metrics.items()
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool)}


def flat_params(config: dict) -> dict[str, str]:
    """A nested configuration as tracker parameters: ``section.key`` -> its value as JSON text (``"2"``, ``"null"``)."""
    return {name: value if isinstance(value, str) else json.dumps(value) for name, value in flatten(config).items()}


class TensorBoardLogger:
    """Event files under ``<run dir>/tensorboard``; every number in a step's metrics becomes a scalar."""

    def __init__(self, directory: Path, resume_step: int) -> None:
        require_logger("tensorboard")
        from torch.utils.tensorboard import SummaryWriter

        # purge_step drops events after the checkpoint's step, as metrics.jsonl drops its lines.
        self.writer = SummaryWriter(log_dir=str(directory), purge_step=resume_step + 1 if resume_step else None)

    def write(self, metrics: dict) -> None:
        step = int(metrics["step"])
        for key, value in numbers(metrics).items():
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


class WandbLogger:
    """A Weights & Biases run named after the run directory, its files under ``<run dir>/wandb`` unless the user
    set ``WANDB_DIR`` (a variable the tool itself defines wins over our default).

    ``WANDB_MODE=offline`` needs no account (``wandb sync`` uploads later); ``WANDB_PROJECT`` (default
    ``accel-grpo``), ``WANDB_ENTITY``, ``WANDB_RUN_ID`` with ``WANDB_RESUME`` and the other ``WANDB_*`` variables
    are read by wandb itself.
    """

    def __init__(self, run_dir: Path, config: dict, project: str = "accel-grpo") -> None:
        require_logger("wandb")
        import wandb

        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", project), name=run_dir.name,
                              dir=os.environ.get("WANDB_DIR") or str(run_dir), config=config,
                              settings=wandb.Settings(quiet=True))

    def write(self, metrics: dict) -> None:
        self.run.log(numbers(metrics), step=int(metrics["step"]))

    def close(self) -> None:
        self.run.finish()


class MLflowLogger:
    """An MLflow run named after the run directory, with the resolved config as its parameters.

    The store is ``MLFLOW_TRACKING_URI`` when set, else a SQLite file in the run directory (``mlflow.db``;
    ``mlflow ui --backend-store-uri sqlite:///<run dir>/mlflow.db`` shows it). ``MLFLOW_EXPERIMENT_NAME``
    (default ``accel-grpo``) and ``MLFLOW_RUN_ID`` (to continue a run) are honoured.
    """

    def __init__(self, run_dir: Path, config: dict, project: str = "accel-grpo") -> None:
        require_logger("mlflow")
        import mlflow

        self.mlflow = mlflow
        if not os.environ.get("MLFLOW_TRACKING_URI"):
            mlflow.set_tracking_uri(f"sqlite:///{(run_dir / MLFLOW_DATABASE).resolve()}")
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME", project)
        if mlflow.get_experiment_by_name(name) is None:
            # Artifacts (none are logged today) would otherwise go to ./mlruns of whatever directory this ran in.
            where = None if os.environ.get("MLFLOW_TRACKING_URI") else (run_dir / "mlflow-artifacts").resolve()
            mlflow.create_experiment(name, artifact_location=where.as_uri() if where else None)
        mlflow.set_experiment(name)
        self.run = mlflow.start_run(run_name=run_dir.name)
        params = list(flat_params(config).items())
        for start in range(0, len(params), 100):  # a tracking server takes at most 100 per request
            mlflow.log_params(dict(params[start:start + 100]))

    def write(self, metrics: dict) -> None:
        self.mlflow.log_metrics(numbers(metrics), step=int(metrics["step"]))

    def close(self) -> None:
        self.mlflow.end_run()


class Loggers:
    """All configured loggers behind one ``write``. ``config``: the resolved configuration (tracker parameters);
    ``project``: the default wandb project / MLflow experiment (the command's name)."""

    def __init__(self, names: list[str], run_dir: Path, resume_step: int, config: dict | None = None,
                 project: str = "accel-grpo") -> None:
        self.loggers = [MetricsLog(run_dir / "metrics.jsonl", resume_step)]
        # run.log_samples prompts per step; no file for a run that logs none (SFT)
        self.samples = MetricsLog(run_dir / "samples.jsonl", resume_step, create=False)
        config = config or {}
        if "tensorboard" in names:
            self.loggers.append(TensorBoardLogger(run_dir / "tensorboard", resume_step))
        if "wandb" in names:
            self.loggers.append(WandbLogger(run_dir, config, project))
        if "mlflow" in names:
            self.loggers.append(MLflowLogger(run_dir, config, project))

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
