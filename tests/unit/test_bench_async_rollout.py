"""accel-bench's async_rollout scenario without vLLM: its figures from metrics rows, and its options."""

import pytest

from engine.bench import async_rollout
from engine.bench.cli import build_parser


def _row(step_s, wait_s, busy_frac, tokens, staleness=0.0):
    return {"step_time_s": step_s, "time/trainer_wait_s": wait_s, "rollout/sampler_busy_frac": busy_frac,
            "rollout_tokens_produced": tokens, "rollout/staleness_max": staleness, "response_length": 100.0}


def test_a_synchronous_step_overlaps_nothing_and_an_overlapped_one_is_bound_by_its_slower_side():
    synchronous = async_rollout.figures([_row(10.0, 4.0, 0.4, 1000)] * 3)  # 4 s sampling, then 6 s training
    assert synchronous["overlap"] == pytest.approx(1.0)
    assert synchronous["step_over_slower_side"] == pytest.approx(10 / 6)
    assert synchronous["tokens_per_s"] == pytest.approx(100.0)
    ahead = async_rollout.figures([_row(6.0, 0.0, 4 / 6, 1000, 1.0), _row(6.0, 0.0, 4 / 6, 1000, 1.0)])
    assert ahead["overlap"] == pytest.approx(10 / 6)  # 4 s sampling during 6 s training
    assert ahead["step_over_slower_side"] == pytest.approx(1.0)
    assert ahead["staleness_max"] == 1.0 and ahead["steps"] == 2


def test_its_options_are_checked_and_it_is_not_part_of_all():
    parser = build_parser()
    args = parser.parse_args(["--scenarios", "async_rollout", "--async-steps", "3", "--async-bindings", "split",
                              "--async-variants", "server_k0,server_k1"])
    assert args.scenarios == ["async_rollout"] and args.async_bindings == ["split"]
    assert args.async_variants == ["server_k0", "server_k1"]
    assert "async_rollout" not in parser.parse_args(["--scenarios", "all"]).scenarios
    for bad in (["--async-bindings", "pinned"], ["--async-variants", "server_k9"]):
        with pytest.raises(SystemExit):
            parser.parse_args(bad)


def test_too_few_steps_are_refused_before_anything_starts(capsys):
    from engine.bench.cli import main

    with pytest.raises(SystemExit) as ended:
        main(["--scenarios", "async_rollout", "--async-steps", "3", "--async-warmup", "2"])
    assert ended.value.code == 2
    assert "--async-steps 3 leaves no timed step after --async-warmup 2" in capsys.readouterr().err


def test_the_defaults_run_with_nothing_set_but_the_three_keys(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv(async_rollout.BINDING_ENV, "split")
    args = build_parser().parse_args(["--scenarios", "async_rollout", "--async-bindings", "auto,auto-split,lend",
                                      "--async-variants", "server_k1,colocated_2_ranks"])
    assert args.async_bindings == ["auto", "auto-split", "lend"]
    options = {"async_partial": False}
    nproc, overrides, env = async_rollout.launch("server_k1", "auto", None, options, 1, 0)
    assert (nproc, overrides) == (1, ["rollout.vllm.mode=server", "rollout.vllm.servers=1", "rollout.max_staleness=1"])
    assert "OMP_NUM_THREADS" not in env and async_rollout.BINDING_ENV not in env  # the library's own choices
    assert async_rollout.launch("server_k1", "auto-split", None, options, 1, 0)[2][async_rollout.BINDING_ENV] == \
        "split"
    assert async_rollout.launch("colocated_2_ranks", "auto", None, options, 1, 0)[:2] == (
        2, ["rollout.vllm.mode=colocate"])
    nproc, overrides, env = async_rollout.launch("server_k2", "lend", "http://127.0.0.1:9", options, 1, 1)
    assert overrides == ["rollout.vllm.mode=server", "rollout.vllm.server_urls=[http://127.0.0.1:9]",
                         "rollout.max_staleness=2", "rollout.vllm.borrow_threads=1"] and env["OMP_NUM_THREADS"] == "1"
