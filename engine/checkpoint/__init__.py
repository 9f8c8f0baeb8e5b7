"""Checkpoints: sharded save/load of the training state, a run's step directories, and Hugging Face export.

``store.py`` writes and reads one checkpoint (atomically, every file checked), ``safe_reader.py`` reads without
unpickling arbitrary objects (``metadata_unpickler.py``: DCP metadata by an exact allow-list; ``errors.py``: damaged
versus refused), ``model_files.py`` checks a model directory's pickled weights before any worker,
``run_checkpoints.py`` finds a run's complete ``step_<N>`` checkpoints and loads the newest every rank can load,
``engine_set.py`` makes one checkpoint of several trained engines (a policy and a critic), ``hf_export.py`` writes
full weights as a Hugging Face model directory, ``model_state.py`` reads a checkpoint's full weights in one process
(no process group) for an export after training.
"""

from .engine_set import load_engines, policy_checkpoint, save_engines
from .errors import CorruptCheckpoint, UnsafeCheckpoint
from .hf_export import export_hf, merge_lora_weights
from .model_files import pickled_weights_problems
from .model_state import checkpoint_meta, read_model_state
from .run_checkpoints import (
    STEP_DIRECTORY,
    complete_checkpoints,
    directory_size,
    latest_complete,
    load_latest,
    prune,
    refuse_unsafe,
    step_of,
)
from .store import FORMAT, META_FILE, load, resolve, save

__all__ = ["pickled_weights_problems",
           "FORMAT", "META_FILE", "STEP_DIRECTORY", "CorruptCheckpoint", "UnsafeCheckpoint", "checkpoint_meta",
           "complete_checkpoints", "directory_size", "export_hf", "latest_complete", "load", "load_engines",
           "load_latest", "merge_lora_weights", "policy_checkpoint", "prune", "read_model_state", "refuse_unsafe",
           "resolve", "save", "save_engines", "step_of"]
