"""Issue 45 (7a, 7b): a module a config names imports from the working directory, nothing else there does; an
output that cannot be written (read-only, full disk, a file in the way) ends in one line, never a traceback."""
from __future__ import annotations

import errno
import importlib
import sys

import pytest


def test_only_the_named_module_imports_from_the_working_directory(tmp_path, monkeypatch):
    """Bug: loading `data.reward=my_rewards:score` appended the working directory to sys.path, so a torch_npu.py
    lying there was imported by the backend probe in place of the (missing) vendor package."""
    from engine.object_loader import load_object

    marker = tmp_path / "imported.txt"
    (tmp_path / "torch_npu.py").write_text(f"open({str(marker)!r}, 'a').write('imported')\n")
    (tmp_path / "rewards_named_here.py").write_text("def score(prompt, response, answer):\n    return 1.0\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    before = list(sys.path)
    found = load_object("rewards_named_here:score", what="function", key="data.reward", accept=callable)
    assert found("p", "r", "a") == 1.0 and sys.path == before
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("torch_npu")
    assert not marker.exists()


def test_a_traceback_file_that_cannot_be_written_still_ends_in_one_line(tmp_path, capsys):
    """Bug: on a full disk the tracebacks file could not be written and every rank's traceback was printed instead
    (about 195 lines)."""
    from engine.runtime.launcher import WorkerFailed, report_early_end

    failure = WorkerFailed("rank 0 failed in phase checkpoint save: OSError: [Errno 28] No space left on device",
                           {0: "Traceback (most recent call last):\n  File x\nOSError: no space", 1: "Traceback\n"})
    (tmp_path / "a-file").write_text("x")
    traceback_file = tmp_path / "a-file" / "tracebacks.txt"  # cannot be written, as on a full disk
    assert report_early_end("accel-grpo", failure, traceback_file=traceback_file) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("accel-grpo: error: rank 0 failed in phase checkpoint save"), err
    assert err.endswith(f"(tracebacks not written to {traceback_file}: Not a directory; --traceback prints them)")


def test_a_read_only_or_full_output_directory_is_one_line(tmp_path, monkeypatch, capsys):
    """Bug: a read-only output directory ended `accel-grpo` in a raw PermissionError/EROFS traceback."""
    from pathlib import Path

    from engine.train import cli, export
    from engine.train.registry import get_recipe

    monkeypatch.setattr(cli, "run_workers", lambda *args, **kwargs: pytest.fail("a worker started"))

    def read_only(self, *args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(self))

    monkeypatch.setattr(Path, "mkdir", read_only)
    assert cli.main(get_recipe("grpo"), [f"run.output_dir={tmp_path}", "run.name=r"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"accel-grpo: error: cannot write {tmp_path / 'r'}: Read-only file system: choose a writable "
                   "run.output_dir (or free space)")
    monkeypatch.undo()

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "out" / "model.safetensors"))

    monkeypatch.setattr(export, "export", full)
    assert export.main([str(tmp_path), str(tmp_path / "out")], load_run=None) == 1
    err = capsys.readouterr().err.strip()
    assert err == (f"accel-grpo export: error: cannot write {tmp_path / 'out' / 'model.safetensors'}: No space left "
                   "on device: choose a writable OUT (or free space)")


def test_ctrl_c_while_starting_is_one_line_and_leaves_no_empty_run_directory(tmp_path, monkeypatch, capsys):
    """Bug: Ctrl-C during start-up printed 104 lines (a KeyboardInterrupt traceback) and left an empty run
    directory behind."""
    from engine.train import cli
    from engine.train.registry import get_recipe

    recipe = get_recipe("grpo")

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(type(recipe), "plan", interrupted)
    assert cli.main(recipe, [f"run.output_dir={tmp_path}", "run.name=r"]) == 130
    assert capsys.readouterr().err.strip() == "accel-grpo: stopped by SIGINT while starting"
    monkeypatch.undo()
    monkeypatch.setattr(cli, "run_workers", interrupted)  # the workers starting
    assert cli.main(recipe, [f"run.output_dir={tmp_path}", "run.name=r"]) == 130
    assert capsys.readouterr().err.strip().endswith("accel-grpo: stopped by SIGINT while starting")
    assert list(tmp_path.iterdir()) == []  # the run directory it made is gone
    monkeypatch.setattr(cli, "run_workers", lambda *args, **kwargs: (args[4] / "tracebacks.txt").write_text("x") and 1)
    assert cli.main(recipe, [f"run.output_dir={tmp_path}", "run.name=r"]) == 1
    assert [p.name for p in (tmp_path / "r").iterdir()] == ["tracebacks.txt"]  # written in: it stays


class _CheckpointFailed(BaseException):
    """As torch's CheckpointException: a BaseException whose message holds every rank's traceback."""

    def __init__(self):
        self.failures = {0: (OSError(errno.ENOSPC, "No space left on device"), None),
                         1: (OSError(errno.ENOSPC, "No space left on device"), None)}
        super().__init__("CheckpointException ranks:dict_keys([0, 1])\nTraceback (most recent call last): ...\n" * 40)


def _full_disk_save():
    raise _CheckpointFailed()


def test_a_full_disk_during_a_checkpoint_save_is_one_short_line():
    """Bug: a full disk during a save printed about 195 lines: torch's CheckpointException (a BaseException, not
    caught by the one-process launcher) carries every rank's traceback in its message."""
    from engine.runtime.launcher import WorkerFailed, run

    with pytest.raises(WorkerFailed) as failed:
        run(_full_disk_save, 1)
    assert str(failed.value) == ("rank 0 failed: _CheckpointFailed (ranks 0, 1): OSError: [Errno 28] No space left on "
                                 "device")
    assert "Traceback" in failed.value.details()  # the whole story, for the tracebacks file
