"""A vLLM general plugin (entry-point group ``vllm.general_plugins``): makes the ``gloo`` weight-transfer engine
(``worker_engine.py``) known inside every process of a vLLM server started from a Python where this package is
installed. Registered by module path: vLLM imports the engine only when a server is started with
``--weight-transfer-config '{"backend": "gloo"}'``."""

from __future__ import annotations

ENGINE_NAME = "gloo"


def register() -> None:
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    try:
        WeightTransferEngineFactory.register_engine(ENGINE_NAME, "engine.rollout.vllm_server.worker_engine",
                                                    "GlooWeightTransferEngine")
    except ValueError:  # already registered in this process (vLLM loads general plugins more than once)
        pass
