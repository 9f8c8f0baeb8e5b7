"""accel-distill (engine/rl/algorithms/distill) for real: a 2-rank run whose teacher is the student itself gets exactly
0 for every token's advantage and leaves the weights bitwise unchanged (a checkpoint equal to the model directory);
a 1-rank run in this process lowers its reverse KL to a sharper teacher (the gradient points the right way); a
teacher with another tokenizer is refused in one line before any worker starts."""

import json

import pytest
from distill_models import char_model_dir
from pool_commands import run_command


def _run(tmp_path, name, argv, nproc, pool=False):
    """The command in this process (one rank runs here; 2 would be spawned), or with ``pool`` on the warm rank pool's
    2 ranks (torchrun's path: no new interpreter)."""
    from engine.train import cli
    from engine.train.registry import get_recipe

    argv = ["--preset", "cpu-demo", "--nproc", str(nproc), "run.progress=false", f"run.output_dir={tmp_path}",
            f"run.name={name}", *argv]
    code = run_command("distill", argv).returncode if pool else cli.main(get_recipe("distill"), argv)
    rows = []
    if (tmp_path / name / "metrics.jsonl").exists():
        rows = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    return code, rows


SMALL = ["rollout.n=4", "train.prompts_per_step=4", "rollout.engine=hf"]


def test_a_teacher_equal_to_the_student_gives_zero_advantages_and_leaves_the_weights_unchanged(tmp_path, monkeypatch):
    import torch
    from safetensors.torch import load_file

    from engine.checkpoint.model_state import read_model_state

    monkeypatch.setenv("ACCEL_BACKEND", "cpu")
    student = char_model_dir(tmp_path / "student", sharpness=4.0)
    code, rows = _run(tmp_path, "same", [f"model.path={student}", f"teacher.path={student}", "train.steps=2",
                                         "engine.lr=0.05", *SMALL], nproc=2, pool=True)
    assert code == 0
    assert [row["step"] for row in rows] == [1, 2]
    for row in rows:
        assert row["distill/reverse_kl"] == 0.0 and row["distill/advantage_abs"] == 0.0  # every token's, exactly
        assert row["pg_loss"] == 0.0 and row["grad_norm"] == 0.0
        assert row["distill/teacher_s"] > 0.0 and row["response_length"] > 0
        assert row["frozen/teacher_s"] == row["distill/teacher_s"]  # the step times every frozen model's forward
    trained = read_model_state(tmp_path / "same" / "checkpoints" / "step_000002")
    initial = load_file(f"{student}/model.safetensors")
    assert sorted(trained) == sorted(initial)
    assert all(torch.equal(trained[name], initial[name]) for name in initial)


def test_a_student_moves_towards_a_sharper_teacher(tmp_path, monkeypatch):
    monkeypatch.setenv("ACCEL_BACKEND", "cpu")
    student = char_model_dir(tmp_path / "student", seed=0)
    teacher = char_model_dir(tmp_path / "teacher", hidden=48, layers=2, seed=5, sharpness=20.0)  # another size
    code, rows = _run(tmp_path, "learn", [f"model.path={student}", f"teacher.path={teacher}", "train.steps=12",
                                          "engine.lr=0.03", *SMALL, "rollout.n=8"], nproc=1)
    assert code == 0 and len(rows) == 12
    kl = [row["distill/reverse_kl"] for row in rows]
    assert all(value > 0 for value in kl)
    assert all(row["perf/mfu"] > 0.0 and row["perf/mfu/teacher_log_probs"] > 0.0 for row in rows)  # its own shape
    assert sum(kl[-4:]) / 4 < 0.7 * sum(kl[:4]) / 4, kl


def test_a_teacher_with_another_tokenizer_is_refused_before_any_worker(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ACCEL_BACKEND", "cpu")
    student = char_model_dir(tmp_path / "student")
    teacher = char_model_dir(tmp_path / "teacher", alphabet="zyxwabcdefgh 0123456789:")
    code, rows = _run(tmp_path, "refused", [f"model.path={student}", f"teacher.path={teacher}"], nproc=2)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and rows == [] and not (tmp_path / "refused").exists()
    assert len(err) == 1 and "the teacher's tokenizer" in err[0] and "differs from the student's" in err[0], err


@pytest.mark.parametrize("keys, expected", [
    (["teacher.path=null"], "exactly one of them"),
    (["teacher.server_url=localhost:8000"], "http:// or https://"),
])
def test_teacher_settings_are_checked(tmp_path, monkeypatch, capsys, keys, expected):
    monkeypatch.setenv("ACCEL_BACKEND", "cpu")
    student = char_model_dir(tmp_path / "student")
    server = [] if "null" in keys[0] else ["teacher.path=null"]
    code, _ = _run(tmp_path, "refused", [f"model.path={student}", *server, *keys], nproc=1)
    assert code == 2 and expected in capsys.readouterr().err
