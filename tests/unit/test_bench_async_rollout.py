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
