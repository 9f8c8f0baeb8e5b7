"""The rollout card (``accel-backends certify cpu --rollout ENGINE``, issue 48) for vLLM's engines in the vLLM leg
(vLLM's CPU build): colocated in the card's process, and a server the card starts. Both hold every property that
applies; the CPU build has no sleep mode, so memory-release is not applicable, and only the server serves requests
apart from the trainer (weight-version)."""

import importlib.util
import os

import pytest

from accel_backends.testing.certify import run_card

pytestmark = [pytest.mark.vllm, pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None and not os.environ.get("ACCEL_EXPECT_VLLM"),
                                 reason="needs vLLM (the vLLM leg: bash ci/test-vllm.sh)")]


@pytest.mark.parametrize("engine", ["vllm", "vllm-server"])
def test_vllms_engines_hold_the_rollout_card(engine, monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    verdicts = {v.name: v for v in run_card("cpu", nproc=1, rollout=engine, timeout=600)}
    assert not [v for v in verdicts.values() if v.status == "fails"], verdicts
    assert verdicts["sleep-wake"].status == "holds" and verdicts["sleep-wake"].figure == 0.0
    for name in ("prefix-cache", "rollout-logprob-gap"):
        assert verdicts[name].status == "holds" and verdicts[name].figure <= 1e-3, verdicts[name]
    assert verdicts["memory-release"].status == "not applicable"  # the CPU build has no sleep mode
    served_apart = engine == "vllm-server"
    assert verdicts["weight-version"].status == ("holds" if served_apart else "not applicable")
    if served_apart:
        assert verdicts["weight-version"].figure == 0.0
