"""``phase_timings``: CPU seconds per phase beside wall seconds (what the scaling benchmark compares on a loaded
machine), and collectors open at once told apart (a trainer's own collector inside a benchmark's)."""

from __future__ import annotations

from engine.runtime import phase, phase_timings


def _spin(count: int) -> int:
    return sum(i * i for i in range(count))


def test_a_phase_records_the_process_cpu_seconds_it_used():
    with phase_timings() as timer:
        with phase("work"):
            _spin(200_000)
    assert timer.calls == {"work": 1}
    assert timer.cpu_seconds["work"] > 0.0 and timer.seconds["work"] > 0.0


def test_a_collector_opened_and_closed_inside_another_leaves_the_outer_one_collecting():
    with phase_timings() as outer:
        with phase_timings() as inner:  # the same figures as the outer one: equal by value, not the same collector
            with phase("a"):
                pass
        with phase("b"):
            pass
    assert set(outer.calls) == {"a", "b"} and set(inner.calls) == {"a"}
