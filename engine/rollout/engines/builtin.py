"""The built-in rollout engines, registered through the same hook as a third-party plugin's (``vllm`` by name:
its module, and vLLM, are imported only when it is chosen)."""

from accel_backends import hookimpl

from . import hookspecs  # noqa: F401 - the hook below must be specified before this module is registered
from .hf import HFRolloutEngine
from .hf_continuous import ContinuousRolloutEngine


@hookimpl
def register_rollout_engines(register):
    register("hf", HFRolloutEngine)
    register("hf-continuous", ContinuousRolloutEngine)
    register("vllm", "engine.rollout.vllm_server.mode:create_vllm_engine")  # imported only when chosen
