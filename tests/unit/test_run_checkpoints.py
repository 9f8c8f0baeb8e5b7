"""engine/checkpoint/run_checkpoints.py: keeping the newest complete checkpoints of a run (run.keep_checkpoints)."""

import pytest

from engine.checkpoint import META_FILE, directory_size, latest_complete, prune


def make(directory, name, complete=True, size=10):
    path = directory / name
    path.mkdir()
    (path / "__0_0.distcp").write_bytes(b"x" * size)
    if complete:
        (path / META_FILE).write_text("{}")
    return path


def names(directory):
    return sorted(p.name for p in directory.iterdir())


def test_keeps_the_newest_complete_checkpoints_and_never_a_partial_save(tmp_path):
    for step in (1, 2, 3):
        make(tmp_path, f"step_{step:06d}")
    make(tmp_path, "step_000004", complete=False)  # a save interrupted half-way: no metadata file yet
    make(tmp_path, "step_000005.partial")  # a save in progress (or one a crash cut short)
    removed = prune(tmp_path, keep=2)
    assert [p.name for p in removed] == ["step_000001"]
    assert names(tmp_path) == ["step_000002", "step_000003", "step_000004", "step_000005.partial"]
    assert [p.name for p in prune(tmp_path, keep=1)] == ["step_000002"]
    assert latest_complete(tmp_path).name == "step_000003", "the newest complete one always stays"
    assert prune(tmp_path, keep=1) == []


def test_a_step_kept_only_as_old_counts_and_goes_with_its_twin(tmp_path):
    make(tmp_path, "step_000001")
    make(tmp_path, "step_000001.old")  # leftover of a save of the same step
    make(tmp_path, "step_000002.old")  # a save died between its two renames: this is step 2's checkpoint
    assert prune(tmp_path, keep=1) == [tmp_path / "step_000001", tmp_path / "step_000001.old"]
    assert names(tmp_path) == ["step_000002.old"]


@pytest.mark.parametrize("keep", [0, -1, True, 1.5])
def test_keep_must_be_a_positive_integer_and_nothing_is_deleted(tmp_path, keep):
    make(tmp_path, "step_000001")
    with pytest.raises(ValueError, match="keep must be a positive integer"):
        prune(tmp_path, keep)
    assert names(tmp_path) == ["step_000001"]


def test_directory_size_counts_every_file(tmp_path):
    path = make(tmp_path, "step_000001", size=1000)
    assert directory_size(path) == 1000 + len("{}")
