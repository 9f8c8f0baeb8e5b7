"""FSDP mechanics: sharding, gradient sync, offload, rank-0 loading, the optimizer, model preparation, and the one
module that touches FSDP's private state (``private_state.py``)."""
