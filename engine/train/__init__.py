"""The training frame: what every trainer's run shares, whatever it trains. The one loop (``loop.py``), the one
config pipeline (``config.py``, ``cli.load``; shared sections in ``settings.py``), the commands (``cli.py``: train,
export, ``--print-config``, ``--resume`` (``resume.py``); ``evaluate.py``: one eval for every recipe that scores;
``accel-train TRAINER``), the ``Recipe`` interface a trainer
implements (``recipe.py``) and the ``register_recipes`` hook that registers it (``hookspecs.py``, ``registry.py``).
Around them: the run directory and resume, worker counts, checkpoint retention, loggers, the metrics file and
curves, the progress bar, and the export of a checkpoint as a Hugging Face model. It imports no recipe.
"""

from .config import ConfigRoot, engine_options
from .recipe import Evaluation, Plan, Recipe, StepResult
from .settings import ModelConfig, RunConfig, TrainerConfig

__all__ = ["ConfigRoot", "Evaluation", "ModelConfig", "Plan", "Recipe", "RunConfig", "StepResult", "TrainerConfig",
           "engine_options"]
