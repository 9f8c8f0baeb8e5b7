"""The device-specific names that only backend modules may spell (shared by the layer and conformance tests)."""

import re

DEVICE_NAMES = re.compile(r"""["'](cuda|npu|nccl|hccl)["']|torch\.cuda|torch_npu|torch\.npu""")
