"""``accel-backends certify NAME --rollout ENGINE`` (issue 48): the rollout side of the report card. The ``hf`` and
``hf-continuous`` engines hold every property that applies to them (they decode with the policy's own parameters:
no copy to sleep, no memory of their own, no weight version); an engine that keeps its prefix cache across a weight
push (``tests/stale_prefix_plugin.py``, a planted fault) fails the prefix-cache property; an unknown engine is
refused in one line before any process starts. vLLM's engines (colocated and a server) are the vLLM leg's
(``tests/test_vllm_rollout_card.py``)."""

import pytest

import accel_backends
from accel_backends.cli import main
from accel_backends.testing.certify import CardCannotRun, card_properties, markdown, run_card

ROLLOUT_CARD = ("sleep-wake", "memory-release", "prefix-cache", "weight-version", "rollout-logprob-gap")


def _by_name(verdicts):
    return {v.name: v for v in verdicts}


@pytest.mark.parametrize("engine", ["hf", "hf-continuous"])
def test_the_hf_engines_hold_what_applies(engine):
    verdicts = _by_name(run_card("cpu", nproc=1, rollout=engine))
    assert tuple(verdicts) == ROLLOUT_CARD
    for name in ("prefix-cache", "rollout-logprob-gap"):
        assert verdicts[name].status == "holds" and 0 <= verdicts[name].figure <= 1e-3, verdicts[name]
    assert "the update moved the prompts' log-probs by up to" in verdicts["prefix-cache"].detail
    for name in ("sleep-wake", "memory-release", "weight-version"):
        assert verdicts[name].status == "not applicable", verdicts[name]
        assert "decodes with the policy's own parameters" in verdicts[name].detail
    text = markdown(accel_backends.get_backend("cpu"), 1, list(verdicts.values()), rollout=engine)
    assert text.startswith(f"### Report card: the rollout engine `{engine}` on backend `cpu`")
    assert text.endswith("2 hold, 0 fail, 3 not applicable")


def test_an_engine_that_keeps_its_prefix_cache_across_a_push_fails(monkeypatch):
    monkeypatch.setenv("ACCEL_BACKENDS_PLUGINS", "stale_prefix_plugin")  # tests/ is on the path of the card's job
    accel_backends.reset_registry()
    verdicts = _by_name(run_card("cpu", nproc=1, rollout="test-stale-prefix"))
    stale = verdicts["prefix-cache"]
    assert stale.status == "fails" and stale.figure > 0.01, stale  # it served the old weights' keys and values
    assert verdicts["rollout-logprob-gap"].status == "holds"  # new prompts: no cache to be stale
    assert verdicts["sleep-wake"].status == "holds" and verdicts["sleep-wake"].figure == 0.0
    assert verdicts["memory-release"].status == "not applicable"  # no sleep mode
    assert "samples in this process after each push" in verdicts["weight-version"].detail


def test_an_unknown_rollout_engine_is_refused_before_any_process(capsys):
    assert main(["certify", "cpu", "--rollout", "hff"]) == 2
    err = capsys.readouterr().err
    assert "unknown rollout engine 'hff' (did you mean --rollout hf?): the rollout card knows" in err
    assert "hf-continuous" in err and "vllm-server" in err and "Traceback" not in err
    with pytest.raises(CardCannotRun, match="unknown rollout engine 'sglang'"):
        card_properties("sglang")
    trainer_card = {p.name for p in card_properties()}
    assert "prefix-cache" not in trainer_card and "weight-push" in trainer_card  # each card its own properties


def test_a_checkout_without_the_rollout_plugin_is_told_what_to_set(monkeypatch, capsys):
    """The GPU image runs a checkout that is not installed: no entry point, only ACCEL_BACKENDS_PLUGINS. Naming the
    engine's rules alone left the rollout card empty there (its first GPU run)."""
    monkeypatch.setenv("ACCEL_BACKENDS_AUTOLOAD", "0")
    monkeypatch.setenv("ACCEL_BACKENDS_PLUGINS", "engine.conformance")
    accel_backends.reset_registry()
    try:
        assert main(["certify", "cpu", "--rollout", "hf-continuous"]) == 2
    finally:
        monkeypatch.undo()
        accel_backends.reset_registry()
    err = capsys.readouterr().err
    assert "the rollout card knows none" in err
    assert "ACCEL_BACKENDS_PLUGINS=engine.conformance,engine.rl.certify_rollout" in err
