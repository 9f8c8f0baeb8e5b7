"""A vLLM general plugin (entry-point group ``vllm.general_plugins``): makes this package's weight-transfer engine
(``worker_engine.py``) known inside every process of a vLLM server started from a Python where this package is
installed, on any device. Registered by module path under ``accel`` and under ``gloo`` (its name while it was the
CPU's only): vLLM imports the engine only when a server is started with
``--weight-transfer-config '{"backend": "accel"}'``."""

from __future__ import annotations

ENGINE_NAMES = ("accel", "gloo")


def register() -> None:
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    for name in ENGINE_NAMES:
        try:
            WeightTransferEngineFactory.register_engine(name, "engine.rollout.vllm_server.worker_engine",
                                                        "AccelWeightTransferEngine")
        except ValueError:  # already registered in this process (vLLM loads general plugins more than once)
            pass
