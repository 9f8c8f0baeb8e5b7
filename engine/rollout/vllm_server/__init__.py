"""vLLM in separate servers (``rollout.engine=vllm``, ``rollout.vllm.mode=server``): the server manager, the HTTP
client, the weight pushes over the device's weight-transfer engine and the ``gloo`` engine this package registers
inside vLLM (``plugin.py``, entry-point group ``vllm.general_plugins``). See docs/grpo.md, "vLLM servers"."""
