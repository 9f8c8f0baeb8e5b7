"""``accel-backends certify``: the report card for on-policy RL. The strict stand-in device's card on 2 ranks holds
every property from the command line (Markdown and JSON); verdicts, merging over ranks and bad input in-process."""

import json

import pytest
from conftest import run_python

from accel_backends.backends.cpu import CPUBackend
from accel_backends.cli import main
from accel_backends.testing import RuleSkipped
from accel_backends.testing.certify import Measurement, Property, Verdict, _measure, _merge, as_json, markdown

CARD = ("reductions", "offload", "gradients", "packing", "grad-sync", "checkpoint", "weight-push", "logprob-gap",
        "same-seed", "host-reads")


@pytest.mark.slow
def test_the_strict_devices_card_holds_every_property(tmp_path):
    out = tmp_path / "card.json"
    result = run_python(["-m", "accel_backends", "certify", "strict", "--nproc", "2", "--json", str(out)],
                        env={"ACCEL_BACKENDS_PLUGINS": "engine.conformance", "OMP_NUM_THREADS": "1"}, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    card = json.loads(out.read_text())
    assert card["backend"] == "strict" and card["nproc"] == 2 and card["all_hold"] is True
    verdicts = {p["name"]: p for p in card["properties"]}
    assert tuple(verdicts) == CARD and {p["status"] for p in verdicts.values()} == {"holds"}
    for bitwise in ("offload", "checkpoint", "weight-push"):
        assert verdicts[bitwise]["figure"] == 0.0, verdicts[bitwise]
    assert verdicts["same-seed"]["figure"] == 0.0
    assert 0 < verdicts["gradients"]["figure"] <= 1e-4 and verdicts["reductions"]["figure"] <= 1e-12
    assert "shards shorter than their padded size on rank 1" in verdicts["offload"]["detail"]
    assert "| logprob-gap |" in result.stdout and "10 hold, 0 fail, 0 not applicable" in result.stdout
    assert "max \\|log-prob gap\\|" in result.stdout  # a | in a cell would split the Markdown table


def _holds(backend, nproc):
    return Measurement(1e-7, "relative error", True)


def _raises(backend, nproc):
    raise RuntimeError("the device lost a tensor")


def _skips(backend, nproc):
    raise RuleSkipped("needs 2 devices")


def test_a_property_that_raises_fails_and_one_that_does_not_apply_is_said_so():
    backend = CPUBackend()
    prop = {name: Property(name, "what", "bound", check) for name, check in
            (("ok", _holds), ("boom", _raises), ("skip", _skips))}
    verdicts = [_measure(backend, prop[name], 2) for name in ("ok", "boom", "skip")]
    assert [v.status for v in verdicts] == ["holds", "fails", "not applicable"]
    assert verdicts[1].detail == "RuntimeError: the device lost a tensor" and verdicts[2].detail == "needs 2 devices"
    doc = as_json(backend, 2, verdicts)
    assert doc["all_hold"] is False
    assert as_json(backend, 2, [verdicts[0], verdicts[2]])["all_hold"] is True  # not applicable is no failure
    assert as_json(backend, 2, [verdicts[2]])["all_hold"] is False  # nothing held: nothing was shown
    text = markdown(backend, 2, verdicts)
    assert "| boom | what | - | bound | fails: RuntimeError: the device lost a tensor |" in text
    assert text.endswith("1 hold, 1 fail, 1 not applicable")


def test_ranks_merge_into_the_worst_figure_or_the_first_failure():
    def verdict(figure, status="holds", detail=""):
        return Verdict("p", "s", "b", status, figure, "u", detail)

    assert _merge([verdict(1.0, detail="r0"), verdict(3.0, detail="r1"), verdict(2.0)]).detail == "r1"
    assert _merge([verdict(0.0, detail="r0"), verdict(0.0, detail="r1")]).detail == "r1"  # equals: the last rank
    failed = _merge([verdict(0.0), verdict(None, "fails", "bad"), verdict(None, "fails", "worse")])
    assert failed.status == "fails" and failed.detail == "rank 1: bad"


@pytest.mark.parametrize("argv, message", [
    (["certify", "warp"], "warp"),
    (["certify", "cpu", "--nproc", "0"], "--nproc must be at least 1, got 0"),
    (["certify", "cpu", "--precision", "fp16"], "invalid choice: 'fp16'"),
])
def test_certify_bad_input_is_one_line(argv, message, capsys):
    try:
        code = main(argv)
    except SystemExit as exit_info:
        code = exit_info.code
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_a_property_states_its_bf16_bound_and_the_card_refuses_an_unknown_precision():
    from accel_backends.testing import card_context
    from accel_backends.testing.certify import CardCannotRun, run_card

    prop = Property("p", "what", "<= 1e-4", _holds, bf16_bound="<= 2e-2")
    assert prop.bound_in("fp32") == "<= 1e-4" and prop.bound_in("bf16") == "<= 2e-2"
    assert Property("q", "what", "bitwise", _holds).bound_in("bf16") == "bitwise"
    with card_context.precision("bf16"):
        assert card_context.current_precision() == "bf16"
        assert _measure(CPUBackend(), prop, 1, "bf16").bound == "<= 2e-2"
    assert card_context.current_precision() == "fp32"
    with pytest.raises(CardCannotRun, match="precision 'fp16': choose from fp32, bf16"):
        run_card("cpu", nproc=1, precision="fp16")
