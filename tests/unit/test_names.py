"""accel_backends/names.py: the one "did you mean" helper."""

from accel_backends.names import did_you_mean


def test_the_closest_name_is_suggested_with_its_prefix():
    assert did_you_mean("stepz", ["steps", "seed"], "train.") == " (did you mean train.steps?)"
    assert did_you_mean("zzz", ["steps", "seed"]) == ""
