"""vLLM in separate servers (``rollout.engine=vllm``, ``rollout.vllm.mode=server``): the server manager, the HTTP
client, the weight pushes over the device backend's weight group and the ``accel`` engine this package registers
inside vLLM on every device (``plugin.py``, entry-point group ``vllm.general_plugins``). See docs/grpo.md, "vLLM
servers"."""
