"""accel-grpo end to end: 2 CPU processes, metrics, checkpoints, resume parity, worker failures."""

import json
import shutil
import time

import pytest
from conftest import REPO, run_python, without_module
from pool_commands import run_command

pytestmark = pytest.mark.slow

SMALL = ["train.prompts_per_step=4", "rollout.n=4", "train.prompts_per_update=4", "train.micro_batch_size=4",
         "run.progress=false"]
COMPARED = ("reward_mean", "reward_std", "loss", "pg_loss", "kl", "clip_frac", "grad_norm", "response_length", "lr")


def grpo(tmp_path, *args, timeout=300, backend="cpu", path=()):
    env = {"PYTHONPATH": ":".join([*path, str(REPO / "tests")]), "ACCEL_BACKEND": backend, "OMP_NUM_THREADS": "1"}
    return run_python(["-m", "engine.rl.algorithms.grpo.cli", *SMALL, f"run.output_dir={tmp_path}", *args], env=env,
                      timeout=timeout)


def grpo_on_pool(tmp_path, *args, backend="cpu"):
    """The same command on the warm rank pool's 2 ranks (torchrun's path: no new interpreter), for the runs whose
    checks are about the run itself; the launcher, the start without matplotlib, torchrun and the failures keep their
    own processes (``grpo``)."""
    return run_command("grpo", [*SMALL, f"run.output_dir={tmp_path}", *args], env={"ACCEL_BACKEND": backend})


def metrics(tmp_path, name):
    return [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]


TWO_UPDATES = "train.prompts_per_update=2"  # 2 of the 4 prompts (8 sequences) per update: two optimizer steps


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """A 4-step fsdp2 run saving every 2 steps, under the strict stand-in device (a device's rules: host copies
    landing at synchronize(), no float64 reductions) and without matplotlib (as on a GPU image): its output
    directory, the finished process and its metrics rows."""
    tmp_path = tmp_path_factory.mktemp("grpo-run")
    hidden = without_module(tmp_path / "no-matplotlib", "matplotlib")
    result = grpo(tmp_path, "train.steps=4", "run.save_every=2", "run.name=straight", TWO_UPDATES, backend="strict",
                  path=[hidden])
    assert result.returncode == 0, result.stderr[-3000:]
    return tmp_path, result, metrics(tmp_path, "straight")


@pytest.fixture(scope="module")
def resumed(straight):
    """The same run resumed from its step-2 checkpoint (a copy of it without step 4) to 4, on the warm rank pool: its
    metrics rows."""
    tmp_path = straight[0]
    shutil.copytree(tmp_path / "straight", tmp_path / "resumed")
    checkpoints = tmp_path / "resumed" / "checkpoints"
    shutil.rmtree(checkpoints / "step_000004")
    kept = (checkpoints / "step_000002" / "engine_meta.json").stat().st_mtime_ns
    second = grpo_on_pool(tmp_path, "train.steps=4", "run.name=resumed", "--resume", TWO_UPDATES, backend="strict")
    assert second.returncode == 0, second.stderr[-3000:]
    # It went on from step 2 (a run from scratch would have written step 2's checkpoint again).
    assert (checkpoints / "step_000002" / "engine_meta.json").stat().st_mtime_ns == kept
    assert (checkpoints / "step_000004" / "engine_meta.json").exists()
    return metrics(tmp_path, "resumed")


def test_fsdp2_run_says_where_its_metrics_and_curves_are(straight):
    _, result, _ = straight
    assert "metrics:" in result.stdout and "curves:  not drawn (matplotlib is not installed)" in result.stdout


def test_fsdp2_run_writes_finite_metrics_every_step(straight):
    _, _, rows = straight
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all(row["updates"] == 2.0 for row in rows)
    for row in rows:
        for key in (*COMPARED, "tokens_per_s", "step_time_s", "peak_memory_gib"):
            assert isinstance(row[key], float) and row[key] == row[key] and abs(row[key]) != float("inf"), key


def test_fsdp2_run_without_matplotlib_notes_it_and_its_curves_draw_later(straight):
    """Plots are optional (ci/gpu-check.sh's image has no matplotlib): one line says so, the run succeeds, and the
    curves draw from its metrics where matplotlib is installed."""
    from engine.rl.algorithms.grpo.report import plot_curves

    tmp_path, result, _ = straight
    assert result.stderr.count("curves not drawn: matplotlib is not installed") == 1, result.stderr[-2000:]
    run = tmp_path / "straight"
    assert not (run / "curves.png").exists()
    assert plot_curves(run / "metrics.jsonl", run / "curves.png") and (run / "curves.png").stat().st_size > 10_000


def test_fsdp2_run_saves_checkpoints(straight):
    tmp_path, _, _ = straight
    for step in (2, 4):
        assert (tmp_path / "straight" / "checkpoints" / f"step_{step:06d}" / "engine_meta.json").exists()


def test_fsdp2_run_resumes_identically(straight, resumed):
    _, _, rows = straight
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]
    for got, want in zip(resumed, rows, strict=False):
        for key in COMPARED:
            assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-6), (got["step"], key)


@pytest.mark.parametrize("variant", [
    ["engine.fsdp_version=1"],
    ["engine.lora_rank=4"],  # PEFT's generate runs below the sharded root
    ["engine.fsdp_version=1", "engine.lora_rank=4", "engine.param_offload=true", "engine.optimizer_offload=true"],
], ids=["fsdp1", "lora-fsdp2", "lora-fsdp1-offload"])
def test_engine_variants_run(tmp_path, variant):
    result = grpo_on_pool(tmp_path, "train.steps=2", "run.name=variant", *variant)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = metrics(tmp_path, "variant")
    assert [r["step"] for r in rows] == [1, 2] and all(0.0 <= r["reward_mean"] <= 1.0 for r in rows)
    assert all(r["grad_norm"] == r["grad_norm"] for r in rows)
    assert (tmp_path / "variant" / "checkpoints" / "step_000002" / "engine_meta.json").exists()


@pytest.mark.parametrize("reward, expected", [
    ("explode_on_rank1", "rank 1 failed in phase reward: RuntimeError: reward function explode_on_rank1 raised "
                         "RuntimeError: reward service unreachable (prompt '"),
    ("die_on_rank1", "rank 1 failed"),
])
def test_a_failing_worker_stops_the_job(tmp_path, reward, expected):
    started = time.monotonic()
    result = grpo(tmp_path, "train.steps=3", f"data.reward=grpo_rewards:{reward}", "run.name=fail", timeout=240)
    elapsed = time.monotonic() - started
    assert result.returncode == 1, result.stderr[-3000:]
    assert elapsed < 120, f"the job took {elapsed:.0f} s to stop"
    # One line first: the output ends with one uncut line naming the rank, the phase and the cause; the tracebacks
    # (and the other rank's echo) are in a file in the run directory, named in that line.
    last = result.stderr.rstrip().splitlines()[-1]
    assert last.startswith("accel-grpo: error: ") and expected in last and " ..." not in last, result.stderr
    assert "then rank" not in last and "Traceback (most recent call last)" not in result.stderr, result.stderr
    if reward == "explode_on_rank1":
        tracebacks = tmp_path / "fail" / "tracebacks.txt"
        assert f"(tracebacks: {tracebacks}; --traceback prints them)" in last
        assert "Traceback (most recent call last)" in tracebacks.read_text()


def test_non_finite_reward_is_named(tmp_path):
    result = grpo(tmp_path, "train.steps=1", "data.reward=grpo_rewards:not_a_number", "run.name=nan")
    assert result.returncode == 1
    assert "reward function not_a_number returned nan" in result.stderr and "must be finite" in result.stderr


def test_joins_an_existing_torchrun_job(tmp_path):
    env = {"PYTHONPATH": str(REPO / "tests"), "ACCEL_BACKEND": "cpu", "OMP_NUM_THREADS": "1"}
    result = run_python(["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m",
                         "engine.rl.algorithms.grpo.cli", *SMALL, f"run.output_dir={tmp_path}", "train.steps=2",
                         "run.name=torchrun"], env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("accel-grpo: preset") == 1, "only rank 0 reports"
    assert [r["step"] for r in metrics(tmp_path, "torchrun")] == [1, 2]


def test_the_cpu_demo_learns(tmp_path):
    """The README's main command, stopped after 100 of its 200 steps: the reward must clearly rise. Its learning
    rate is constant and its seeds fixed, so these are the full run's first 100 steps, bit for bit (checked on
    2 December: reward 0.044 over steps 1-10, 0.782 over 91-100; the whole run reaches 0.858, ci/demo-figures.sh)."""
    result = run_command("grpo", [f"run.output_dir={tmp_path}", "run.name=demo", "run.progress=false",
                                  "train.steps=100"], timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    rewards = [row["reward_mean"] for row in metrics(tmp_path, "demo")]
    first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    print(f"cpu-demo reward: first 10 steps {first:.3f}, steps 91-100 {last:.3f}")
    assert len(rewards) == 100 and last >= 2 * first and last >= 0.6
    assert "reward mean over the first 10 steps" in result.stdout
    config = json.loads((tmp_path / "demo" / "config.json").read_text())
    # What makes a shorter run the full run's beginning: no schedule over train.steps.
    assert config["preset"] == "cpu-demo" and (config["engine"]["lr_schedule"], config["engine"]["warmup_steps"]) == (
        "constant", 0)


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    """The fixture Qwen2.5-like model, verl parquet files, a verl-style reward, validation, both loggers, resume:
    2 steps, then resumed to 3. Its run directory and metrics rows."""
    from grpo_data import QUESTIONS, fixture_model, verl_rows, write_parquet

    tmp_path = tmp_path_factory.mktemp("grpo-real")
    model = fixture_model(tmp_path / "tiny-qwen")
    train = write_parquet(tmp_path / "train.parquet", verl_rows(QUESTIONS[:8]))
    val = write_parquet(tmp_path / "test.parquet", verl_rows(QUESTIONS[8:], split="test"))
    args = ["--preset", "cpu-demo", f"model.path={model}", f"data.path={train}", f"data.val_path={val}",
            # A verl-style reward, plus a TRL-style one with a weight (the sum is the reward).
            "data.reward=[grpo_rewards:compute_score,grpo_rewards:length_penalty]", "data.reward_weights=[1,0.5]",
            # Sampled validation: the fixture's most likely token is an EOS, so greedy responses are empty.
            "rollout.val_n=2", "rollout.val_temperature=1.0", "run.val_every=2", "run.loggers=[jsonl,tensorboard]",
            "rollout.max_new_tokens=12", "engine.lr=1e-4", "run.save_every=1", "run.name=real"]
    first = grpo_on_pool(tmp_path, "train.steps=2", *args)
    assert first.returncode == 0, first.stderr[-3000:]
    recorded = json.loads((tmp_path / "real" / "config.json").read_text())
    # The README's form: the run's recorded config (its model, data, rewards), and only train.steps changed.
    second = grpo_on_pool(tmp_path, "--resume", "run.name=real", "train.steps=3")
    assert second.returncode == 0, second.stderr[-3000:]
    assert ("resuming from step 2 (step_000002) with the run's recorded config, changed: train.steps 2 -> 3"
            in second.stdout), second.stdout
    resumed = json.loads((tmp_path / "real" / "config.json").read_text())
    assert resumed["model"] == recorded["model"] and resumed["data"] == recorded["data"]
    assert resumed["train"]["steps"] == 3 and resumed["engine"]["total_steps"] == 3
    previous = json.loads((tmp_path / "real" / "config.previous.json").read_text())
    assert previous == recorded  # the record it replaced, kept beside it
    return tmp_path / "real", metrics(tmp_path, "real")


def test_a_refused_resume_leaves_the_record_and_the_run_exports_and_evaluates(real_run, tmp_path, capsys,
                                                                              monkeypatch):
    """A resume that would change what the checkpoint holds (another model, of another size) or what the run means
    (the group size) is refused in one line naming the recorded value; config.json is unchanged, byte for byte, and
    the run still exports and evaluates."""
    from engine.demo_model import make_tiny_model
    from engine.rl.algorithms.grpo.cli import main

    run_dir, _ = real_run
    before = (run_dir / "config.json").read_bytes()
    recorded = json.loads(before)
    other = make_tiny_model(tmp_path / "bigger", hidden_size=128)
    monkeypatch.setenv("ACCEL_BACKEND", "cpu")
    capsys.readouterr()
    where = [f"run.output_dir={run_dir.parent}", "run.name=real"]
    for change, recorded_value in ((f"model.path={other}", f"model.path={recorded['model']['path']}"),
                                   ("rollout.n=2", "rollout.n=4"), ("engine.lora_rank=8", "engine.lora_rank=0")):
        assert main(["--resume", *where, change, "train.steps=9"]) == 2, change
        err = capsys.readouterr().err.strip()
        assert err.startswith("accel-grpo: error: --resume ") and "\n" not in err, err
        assert f"{change} would change" in err and f"(the run recorded {recorded_value})" in err, err
        assert (run_dir / "config.json").read_bytes() == before
    # A resume that fails loading the checkpoint (damaged, no fallback) leaves the record as it was: config.json is
    # written only once the checkpoint loaded.
    damaged = tmp_path / "damaged"
    shutil.copytree(run_dir, damaged, ignore=shutil.ignore_patterns("tensorboard", "eval", "config.previous.json"))
    (shard,) = (damaged / "checkpoints" / "step_000003").glob("__0_0.distcp")
    shard.write_bytes(shard.read_bytes()[:100])
    record = (damaged / "config.json").read_bytes()
    assert main(["--resume", f"run.output_dir={tmp_path}", "run.name=damaged", "train.steps=4",
                 "run.resume_fallback=false", "--nproc", "1"]) == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "failed in phase checkpoint load: CorruptCheckpoint" in last and "(tracebacks: " in last, last
    assert (damaged / "config.json").read_bytes() == record
    assert not (damaged / "config.previous.json").exists()
    out = tmp_path / "exported"
    assert main(["export", str(run_dir), str(out)]) == 0
    assert (out / "model.safetensors").is_file() and "wrote" in capsys.readouterr().out
    val = run_dir.parent / "test.parquet"
    assert main(["eval", str(run_dir), "--nproc", "1", f"--out={tmp_path / 'eval'}"]) == 0
    results = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert results["step"] == 3 and results["prompts"] == len(pd_rows(val)) and results["val_path"] == str(val)
    assert json.loads(capsys.readouterr().out) == results  # stdout is the results' JSON
    # Issue 45: eval never replaces an earlier evaluation: a named --out that holds one is refused, a default
    # output directory taken gets a new one beside it (-2).
    first = {p.name: p.read_bytes() for p in (tmp_path / "eval").iterdir()}
    assert "samples.jsonl" in first
    assert main(["eval", str(run_dir), "--nproc", "1", f"--out={tmp_path / 'eval'}"]) == 2
    assert "eval never replaces them" in capsys.readouterr().err
    (run_dir / "eval" / "step_000003").mkdir(parents=True)
    shutil.copytree(tmp_path / "eval", run_dir / "eval" / "step_000003", dirs_exist_ok=True)
    assert main(["eval", str(run_dir), "--nproc", "1"]) == 0
    second = json.loads((run_dir / "eval" / "step_000003-2" / "results.json").read_text())
    assert second["step"] == 3 and (run_dir / "eval" / "step_000003-2" / "samples.jsonl").is_file()
    assert {p.name: p.read_bytes() for p in (run_dir / "eval" / "step_000003").iterdir()} == first
    assert {p.name: p.read_bytes() for p in (tmp_path / "eval").iterdir()} == first


def test_a_planted_checkpoint_runs_nothing_on_resume_export_or_eval(real_run, tmp_path, capsys, monkeypatch):
    """The issue's planted ``.metadata`` (a pickle that would run ``touch MARKER``), at the size the save recorded, in
    every checkpoint of a copy of the run: --resume, export and eval each refuse it in one line naming the file,
    exit non-zero, and the marker never appears."""
    from planted_pickles import plant

    from engine.rl.algorithms.grpo.cli import main

    run_dir, _ = real_run
    planted, marker = tmp_path / "planted", tmp_path / "marker"
    shutil.copytree(run_dir, planted, ignore=shutil.ignore_patterns("tensorboard", "eval", "config.previous.json"))
    for metadata in (planted / "checkpoints").glob("step_*/.metadata"):
        plant(metadata, marker)
    monkeypatch.setenv("ACCEL_BACKEND", "cpu")
    capsys.readouterr()
    newest = planted / "checkpoints" / "step_000003" / ".metadata"
    for command in (["--resume", f"run.output_dir={tmp_path}", "run.name=planted", "train.steps=4", "--nproc", "1"],
                    ["export", str(planted), str(tmp_path / "out")],
                    ["eval", str(planted), "--nproc", "1", f"--out={tmp_path / 'eval'}"]):
        assert main(command) != 0, command
        err = capsys.readouterr().err.strip()
        assert not marker.exists(), f"{command[0]}: the planted pickle ran"
        assert "\n" not in err and f"{newest} was refused: it asks to load" in err, err
        assert "nothing in it was run" in err, err
    assert not (tmp_path / "out").exists()


def pd_rows(path):
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()


def test_real_model_run_validates_before_every_2_steps_and_at_the_end(real_run):
    _, rows = real_run
    assert [r["step"] for r in rows] == [0, 1, 2, 3]  # step 0: the baseline validation (run.val_before_train)
    assert [("val/accuracy" in r) for r in rows] == [True, False, True, True]  # before, every 2 steps, at the end


def test_real_model_run_scores_its_validation_responses(real_run):
    _, rows = real_run
    # Random responses earn no accuracy and a length penalty: the validation responses were really scored.
    validated = [r for r in rows if "val/accuracy" in r]
    assert all(r["val/accuracy"] == 0.0 and -0.5 < r["val/reward_mean"] < 0.0 for r in validated), rows


def test_real_model_run_step_metrics(real_run):
    _, rows = real_run
    for row in rows[1:]:
        assert 0 < row["response_length"] <= row["response_length_max"] <= 12
        assert 0.0 <= row["response_clip_frac"] < 1.0 and row["entropy"] > 0.0
        # each reward function's own mean: compute_score is 0 (no right answers), length_penalty in (-0.5, 0)
        assert row["reward/compute_score"] == 0.0 and -0.5 < row["reward/length_penalty"] < 0.0
        assert row["reward_mean"] == pytest.approx(0.5 * row["reward/length_penalty"], abs=1e-6)
    shown = [{k: round(r[k], 4) for k in ("reward_mean", "entropy", "response_length")} for r in rows[1:]]
    print(f"fixture run: {shown}")


def test_real_model_run_logs_samples(real_run):
    run_dir, _ = real_run
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert [s["step"] for s in samples] == [1] * 4 + [2] * 4 + [3] * 4  # run.log_samples=1: a prompt's 4 responses
    assert len({s["prompt"] for s in samples[:4]}) == 1 and set(samples[0]["rewards"]) == {"compute_score",
                                                                                       "length_penalty"}
    for sample in samples:
        assert sample["prompt"].startswith("<|im_start|>system\n") and "<|im_start|>user\nTom has" in sample["prompt"]
        assert sample["prompt"].endswith("<|im_start|>assistant\n") and "<|im_end|>" not in sample["response"]
        assert sample["response_tokens"] < 12 or not sample["ended_by_eos"]


def test_real_model_run_logs_to_tensorboard(real_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir, _ = real_run
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    assert {"reward_mean", "entropy", "val/accuracy", "response_clip_frac"} <= set(events.Tags()["scalars"])
    assert [e.step for e in events.Scalars("reward_mean")] == [1, 2, 3]
    assert [e.step for e in events.Scalars("val/accuracy")] == [0, 2, 3]
    assert "samples/text_summary" in events.Tags()["tensors"]
