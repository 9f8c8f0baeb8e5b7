"""A run directory has one run (issue 45, item 3). Bug: a run started again under an existing run.name without
--resume cut metrics.jsonl, rewrote config.json and kept the old run's later checkpoints (a later --resume continued
from the old step, export exported the old model, run.keep_checkpoints deleted the new run's checkpoints). Now every
trainer refuses it in one line before any worker starts, leaving the old run byte-identical; run.overwrite=true
moves the old run aside (never deletes it)."""
from __future__ import annotations

import hashlib
import os

import pytest

from engine.train import cli
from engine.train.registry import get_recipe, recipe_names


def fake_run(directory):
    """A finished run's files as the loop leaves them (no worker needed to refuse in front of them)."""
    (directory / "checkpoints" / "step_000007").mkdir(parents=True)
    (directory / "checkpoints" / "step_000007" / "engine_meta.json").write_text('{"step": 7}')
    (directory / "config.json").write_text('{"trainer": "grpo"}\n')
    (directory / "metrics.jsonl").write_text("".join(f'{{"step": {s}, "loss": 0.5}}\n' for s in range(1, 8)))
    return directory


def hashes(root):
    return {str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(root.rglob("*")) if path.is_file()}


@pytest.fixture
def no_workers(monkeypatch):
    """Record the start of workers instead of training (the refusal must come before it)."""
    started = []
    monkeypatch.setattr(cli, "run_workers", lambda *args, **kwargs: started.append(args[4]) or 3)
    return started


def _start(trainer, tmp_path, *overrides):
    argv = [f"run.output_dir={tmp_path}", "run.name=mine", "run.progress=false", *overrides]
    if trainer == "accel-train":  # the generic command reaches the same frame
        return cli.generic_main(["grpo", *argv])
    return cli.main(get_recipe(trainer), argv)


@pytest.mark.parametrize("trainer", [*recipe_names(), "accel-train"])
def test_a_second_run_under_an_existing_name_is_refused_before_any_worker(trainer, tmp_path, capsys, no_workers):
    run = fake_run(tmp_path / "mine")
    before = hashes(run)
    assert _start(trainer, tmp_path) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.endswith(": error: run directory " + str(run) + " already holds a run: continue "
                                            "it with --resume run.name=mine, start a new one under another run.name, "
                                            "or pass run.overwrite=true to move the old run aside (it is never "
                                            "deleted)"), err
    assert no_workers == [] and hashes(run) == before and sorted(p.name for p in tmp_path.iterdir()) == ["mine"]


def test_overwrite_moves_the_old_run_aside_and_starts_in_an_empty_directory(tmp_path, capsys, monkeypatch):
    seen = []

    def workers(*args, **kwargs):  # what the new run's workers find, and a first line of theirs
        seen.append(sorted(p.name for p in args[4].iterdir()))
        (args[4] / "metrics.jsonl").write_text('{"step": 1}\n')
        return 3

    monkeypatch.setattr(cli, "run_workers", workers)
    run = fake_run(tmp_path / "mine")
    before = hashes(run)
    assert _start("grpo", tmp_path, "run.overwrite=true") == 3  # the workers' status
    (aside,) = [p for p in tmp_path.iterdir() if p.name != "mine"]
    assert aside.name.startswith("mine.old-") and hashes(aside) == before
    assert seen == [[]] and (run / "metrics.jsonl").read_text() == '{"step": 1}\n'
    assert f"notice: run.overwrite=true: moved the earlier run {run} to {aside}" in capsys.readouterr().err


def test_an_empty_directory_or_a_new_name_starts_and_a_file_is_refused(tmp_path, capsys, no_workers):
    (tmp_path / "mine").mkdir()
    assert _start("grpo", tmp_path) == 3 and no_workers == [tmp_path / "mine"]
    (tmp_path / "taken").write_text("x")
    assert cli.main(get_recipe("sft"), [f"run.output_dir={tmp_path}", "run.name=taken"]) == 2
    assert "run directory " + str(tmp_path / "taken") + " is a file" in capsys.readouterr().err
    assert cli.main(get_recipe("sft"), [f"run.output_dir={tmp_path}", "run.overwrite=3"]) == 2
    assert "run.overwrite must be true or false" in capsys.readouterr().err


def test_a_generated_name_taken_in_the_same_second_gets_a_suffix_and_resume_skips_runs_moved_aside(tmp_path):
    from engine.train.run_dir import claim, run_dir

    config = get_recipe("grpo").schema.from_dict({"run": {"output_dir": str(tmp_path)}})
    first = run_dir(config, False, "grpo")
    fake_run(first)
    second = run_dir(config, False, "grpo")
    assert second != first and second.name.startswith(first.name)  # -2 when within the same second
    moved = fake_run(tmp_path / "grpo-default-x")
    os.utime(moved, (2e9, 2e9))
    claim(moved, True)
    assert [p.name.startswith("grpo-default-x.old-") for p in tmp_path.iterdir()].count(True) == 1
    assert run_dir(config, True, "grpo") == first  # not the run moved aside, though it is newer


def _export(source, out, *flags):
    """``export`` with a run loader that needs no model: the refusals come before any weight is read."""
    from engine import EngineConfig
    from engine.train import export

    def load_run(run_dir):
        return export.RunModel(model_path=None, engine=EngineConfig(), build=lambda: pytest.fail("built a model"))

    return export.main([str(source), str(out), *flags], load_run)


def test_export_force_never_replaces_a_run_a_folder_of_runs_or_other_files(tmp_path, capsys):
    """Bug: `export RUN runs --force` deleted every run under runs/; `export RUN RUN --force` replaced the run with
    its export. --force now replaces only a directory an export wrote (its .accel-export marker)."""
    runs = tmp_path / "runs"
    run, other = fake_run(runs / "mine"), fake_run(runs / "other")
    fake_run(tmp_path / "elsewhere" / "a-run")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("keep")
    before = hashes(tmp_path)
    for out, said in ((runs, "holds the checkpoint being exported"), (run, "holds the checkpoint being exported"),
                      (tmp_path, "holds the checkpoint being exported"),
                      (other, "is a run directory and is not an earlier export"),
                      (tmp_path / "elsewhere", "holds runs and is not an earlier export"),
                      (tmp_path / "notes", "is not empty and is not an earlier export")):
        assert _export(run, out, "--force") == 2, out
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and f"error: output directory {out} {said}" in err, err
    assert err.endswith("choose another OUT (--force replaces only a directory an export wrote, which holds "
                        ".accel-export)")
    assert hashes(tmp_path) == before  # nothing written, nothing deleted
    (tmp_path / "notes" / ".accel-export").write_text("{}")  # an earlier export: --force goes on to read weights
    assert _export(run, tmp_path / "notes") == 2
    assert "holds an earlier export: choose another OUT or pass --force" in capsys.readouterr().err


def test_eval_never_replaces_an_earlier_evaluation(tmp_path):
    """Bug: `eval MODEL_DIR` silently replaced an earlier eval's runs/eval-NAME/ (its samples.jsonl lost)."""
    from engine.train.evaluate import output_directory
    from engine.train.export import ExportError

    out = tmp_path / "eval-model"
    assert output_directory(out, named=False) == out  # new
    out.mkdir()
    assert output_directory(out, named=True) == out  # empty: nothing to lose
    (out / "samples.jsonl").write_text("{}\n")
    assert output_directory(out, named=False) == tmp_path / "eval-model-2"
    (tmp_path / "eval-model-2").mkdir()
    (tmp_path / "eval-model-2" / "results.json").write_text("{}")
    assert output_directory(out, named=False) == tmp_path / "eval-model-3"
    with pytest.raises(ExportError, match="eval never replaces them; choose another --out"):
        output_directory(out, named=True)


def test_retention_never_deletes_the_checkpoint_just_saved(tmp_path, capsys):
    """Bug: with an earlier run's step_000007 left in checkpoints/, run.keep_checkpoints=2 deleted the new run's own
    step_000001 and step_000002 right after saving them (the run still exited 0)."""
    from engine.checkpoint import META_FILE
    from engine.train.retention import after_save

    for step in (1, 2, 7):
        (tmp_path / f"step_{step:06d}").mkdir()
        (tmp_path / f"step_{step:06d}" / META_FILE).write_text("{}")
    assert after_save(tmp_path / "step_000002", 1) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_000001", "step_000002", "step_000007"]
    assert "kept every checkpoint (run.keep_checkpoints=1): step_000007 is newer than this save" in \
        capsys.readouterr().out
    assert [p.name for p in after_save(tmp_path / "step_000007", 2)] == ["step_000001"]  # the usual pruning


def test_the_hint_after_an_early_end_says_how_to_start_again_where_files_are(tmp_path):
    """A run that ended before its first checkpoint but wrote files: starting it again under its name is refused
    now, so the hint names run.overwrite=true."""
    from engine.train.run_dir import resume_hint

    assert resume_hint(tmp_path / "new") == "no checkpoint was written yet: start the run again"
    (tmp_path / "begun").mkdir()
    (tmp_path / "begun" / "metrics.jsonl").write_text('{"step": 1}\n')
    assert resume_hint(tmp_path / "begun") == (
        "no checkpoint was written yet: start the run again with run.overwrite=true (the files in "
        f"{tmp_path / 'begun'} are moved aside) or under another run.name")
