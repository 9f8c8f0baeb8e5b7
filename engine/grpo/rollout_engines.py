"""Compatibility for plugins written before the rollout layer left GRPO (issue 28): ``engine.grpo.rollout_engines``
and its submodules are the modules of ``engine.rollout.engines`` under their old names (the same objects, so a
hook or an engine class imported either way is one and the same). New code imports ``engine.rollout``."""

import sys

from ..rollout import engines
from ..rollout.engines import *  # noqa: F403 - the old package's names
from ..rollout.engines import base, builtin, hf, hf_continuous, hookspecs, registry, vllm, vllm_settings

for _module in (base, builtin, hf, hf_continuous, hookspecs, registry, vllm, vllm_settings):
    sys.modules[f"{__name__}.{_module.__name__.rpartition('.')[2]}"] = _module

__all__ = engines.__all__
