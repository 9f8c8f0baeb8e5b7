"""accel-sft end to end on 2 CPU processes under the strict stand-in device: one LoRA run on conversation data (a
system message, a tool turn) with validation, gradient checkpointing and checkpoints; a resume from its middle
checkpoint that repeats its last steps exactly; eval of the run giving the run's own validation loss; export
(merged), whose model then trains further with accel-grpo (the SFT -> RL pipeline), and the adapters alone; bad input
refused in one line before any worker starts. (Full fine-tuning: tests/test_sft_ranks.py and test_sft_models.py.)"""

import json
import shutil

import pytest
from conftest import REPO, run_python
from grpo_data import write_jsonl
from pool_commands import run_command

from engine.offline.objectives.sft.cli import main

pytestmark = pytest.mark.slow

# The strict stand-in device (accel_backends/testing/strict.py): a device's rules on the CPU.
ENV = {"PYTHONPATH": str(REPO / "tests"), "ACCEL_BACKEND": "strict", "OMP_NUM_THREADS": "1"}
LORA = ("engine.lora_rank=4", "engine.lr=1e-2")
COMPARED = ("loss", "mean_token_accuracy", "num_tokens", "grad_norm", "lr")
WORDS = "apples books pencils dollars minutes hours friends cookies marbles trees garden school".split()


def _conversation(index):
    words = [WORDS[(index * 7 + k) % len(WORDS)] for k in range(1 + index % 4)]
    messages = [{"role": "system", "content": "Answer briefly."},
                {"role": "user", "content": "reverse: " + " ".join(words)},
                {"role": "assistant", "content": " ".join(reversed(words))}]
    if index % 4 == 0:
        messages += [{"role": "user", "content": "count them"}, {"role": "assistant", "content": "lookup"},
                     {"role": "tool", "content": str(len(words))}, {"role": "assistant", "content": str(len(words))}]
    return {"messages": messages}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    from engine.demo_model import make_tiny_model

    root = tmp_path_factory.mktemp("sft-run")
    model = make_tiny_model(root / "model", vocab_size=512, single_eos=True)
    train = write_jsonl(root / "train.jsonl", [_conversation(i) for i in range(40)])
    val = write_jsonl(root / "val.jsonl", [_conversation(i) for i in range(40, 48)])
    return {"root": root, "model": model, "train": train, "val": val}


def sft(files, *args):
    """A training run on the test's data."""
    return command("engine.offline.objectives.sft.cli", f"model.path={files['model']}", f"data.path={files['train']}",
                   "train.batch_size=8", "train.micro_batch_tokens=128", "data.max_length=128", "run.progress=false",
                   f"run.output_dir={files['root'] / 'runs'}", *args)


def command(module, *args):
    """A fresh process: the straight run's checks are about one (its exit leaks no semaphore)."""
    return run_python(["-m", module, *args], env=ENV, timeout=300)


def pooled(name, *args, world_size=2):
    """``accel-<name> *args`` on the warm rank pool under the strict device (no new interpreter): the resume, eval,
    export and follow-up runs, whose checks are about what they read and write."""
    return run_command(name, list(args), env={"ACCEL_BACKEND": "strict"}, world_size=world_size)


def metrics(files, name):
    path = files["root"] / "runs" / name / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def straight(files):
    result = sft(files, "train.steps=4", "run.save_every=2", "run.name=straight", f"data.val_path={files['val']}",
                 "engine.gradient_checkpointing=true", "run.progress=true",  # the bar once: no leaked semaphore
                 *LORA)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_run_writes_metrics_checkpoints_and_curves(files, straight):
    assert "data: 40 training examples, 8 validation, format messages, loss on assistant" in straight.stderr
    assert "(data.format=auto chose it)" in straight.stderr
    assert "leaked semaphore" not in straight.stderr
    rows = metrics(files, "straight")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for row in rows:
        for key in (*COMPARED, "tokens_per_s", "step_time_s"):
            assert isinstance(row[key], float) and row[key] == row[key], key
        assert row["sequences"] == 8.0 and row["num_tokens"] > 8
        assert 0.0 < row["perf/mfu"] == row["perf/mfu/update"] < 1.0 and row["perf/tflops/update"] > 0.0  # LoRA: 3x
    assert "val/loss" in rows[-1] and rows[-1]["val/loss"] > 0
    run = files["root"] / "runs" / "straight"
    assert (run / "curves.png").stat().st_size > 10_000
    assert not (run / "samples.jsonl").exists()  # SFT logs no samples: no empty file
    # Not on a terminal: one progress line every few steps, no bar redrawn with carriage returns.
    assert "\r" not in straight.stderr and "sft: step 4/4 (100%" in straight.stderr
    assert json.loads((run / "config.json").read_text())["derived"]["total_steps"] == 4
    for step in (2, 4):
        assert (run / "checkpoints" / f"step_{step:06d}" / "engine_meta.json").exists()


def test_resume_repeats_the_same_steps_exactly(files, straight, capsys):
    runs = files["root"] / "runs"
    shutil.copytree(runs / "straight", runs / "resumed")
    shutil.rmtree(runs / "resumed" / "checkpoints" / "step_000004")
    before = (runs / "resumed" / "config.json").read_bytes()
    # A change to what the run means is refused in one line naming the recorded value; the record stays as it was.
    code = main(["--resume", "run.name=resumed", f"run.output_dir={runs}", "data.max_length=64"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "data.max_length=64 would change the run's data (the run recorded " \
        "data.max_length=128)" in err, err
    assert (runs / "resumed" / "config.json").read_bytes() == before
    # The README's form: the run's own record (the user's model directory, data, LoRA), nothing else given.
    result = pooled("sft", "--resume", "run.name=resumed", f"run.output_dir={runs}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "resuming from step 2 (step_000002) with the run's recorded config" in result.stdout, result.stdout
    recorded, now = json.loads(before), json.loads((runs / "resumed" / "config.json").read_bytes())
    assert now["run"].pop("name") == "resumed" and recorded["run"].pop("name") == "straight" and now == recorded
    want, got = metrics(files, "straight"), metrics(files, "resumed")
    assert [r["step"] for r in got] == [1, 2, 3, 4]
    for a, b in zip(got[2:], want[2:], strict=True):
        for key in (*COMPARED, "val/loss"):
            if key in b:
                assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-7), (a["step"], key)


def test_eval_export_and_grpo_continues_from_the_sft_model(files, straight, capsys, monkeypatch):
    # One process reads the checkpoint two ranks wrote: the same weights, the same loss. The frame's eval: the
    # results' JSON on stdout and in results.json (--json: also there); no samples, no samples.jsonl.
    run = files["root"] / "runs" / "straight"
    monkeypatch.setenv("ACCEL_BACKEND", "strict")  # one rank in this process (eval refuses a checkpoint under torchrun)
    capsys.readouterr()
    assert main(["eval", str(run), "--nproc", "1", "--json", str(files["root"] / "v.json")]) == 0
    evaluated = capsys.readouterr().out
    figures = json.loads(evaluated[evaluated.index("{"):])
    assert figures["val/loss"] == pytest.approx(metrics(files, "straight")[-1]["val/loss"], rel=1e-5)
    assert figures["checkpoint"].endswith("step_000004") and figures["examples"] == 8
    assert json.loads((run / "eval" / "step_000004" / "results.json").read_text()) == figures
    assert json.loads((files["root"] / "v.json").read_text()) == figures
    assert not (run / "eval" / "step_000004" / "samples.jsonl").exists() and not (run / "samples.jsonl").exists()

    out = files["root"] / "exported"
    exported = pooled("sft", "export", str(run), str(out), world_size=1)
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    wrong = pooled("grpo", "export", str(run), str(files["root"] / "x"), world_size=1)
    assert wrong.returncode == 2 and "is an accel-sft run: use accel-sft export" in wrong.stderr
    # The export remembers how the run prompted the model: the system message of every training conversation as
    # the chat template's default, the longest trained response as max_new_tokens (transformers honours both).
    from transformers import AutoTokenizer, GenerationConfig

    remembered = json.loads((out / "accel_prompting.json").read_text())
    assert remembered["system_prompt"] == "Answer briefly." and 4 <= remembered["max_new_tokens"] < 128
    assert GenerationConfig.from_pretrained(out).max_new_tokens == remembered["max_new_tokens"]
    chat = AutoTokenizer.from_pretrained(out).apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert "Answer briefly." in chat and "Answer briefly." not in AutoTokenizer.from_pretrained(
        files["model"]).apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)

    prompts = write_jsonl(files["root"] / "gsm8k.jsonl", [{"question": f"what is {a} + 1", "answer": f"#### {a + 1}"}
                                                          for a in range(8)])
    grpo = pooled("grpo", f"model.path={out}", f"data.path={prompts}", "data.task=gsm8k",
                   "train.steps=1", "train.prompts_per_step=2", "rollout.n=2", "rollout.max_new_tokens=4",
                   "run.progress=false", f"run.output_dir={files['root'] / 'grpo-runs'}", "run.name=rl", "--nproc", "1",
                   world_size=1)
    assert grpo.returncode == 0, grpo.stderr[-3000:]
    rl = files["root"] / "grpo-runs" / "rl"
    config = json.loads((rl / "config.json").read_text())
    assert config["model"]["path"] == str(out)
    assert (rl / "checkpoints" / "step_000001" / "engine_meta.json").exists()
    # GRPO after SFT prompts as SFT trained (max_new_tokens given here wins over the remembered one).
    assert config["data"]["system_prompt"] == "Answer briefly." and config["rollout"]["max_new_tokens"] == 4
    assert "remembers how it was trained to be prompted" in grpo.stderr
    sample = json.loads((rl / "samples.jsonl").read_text().splitlines()[0])
    assert "Answer briefly." in sample["prompt"]


def test_lora_run_exports_its_adapter_alone(files, straight):
    out = files["root"] / "adapter"
    exported = pooled("sft", "export", str(files["root"] / "runs" / "straight"), str(out), "--lora", "adapter",
                      world_size=1)
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert (out / "adapter_config.json").is_file() and (out / "adapter_model.safetensors").is_file()
    assert not (out / "model.safetensors").exists()


def _refused(capsys, files, rows, *args):
    data = write_jsonl(files["root"] / "bad.jsonl", rows)
    code = main([f"model.path={files['model']}", f"data.path={data}", f"run.output_dir={files['root'] / 'bad'}",
                 *args])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("accel-sft: error: ") and "\n" not in err, err
    assert not (files["root"] / "bad").exists()  # before any run directory or worker
    return err


def test_bad_input_is_one_line_before_any_worker(files, capsys):
    good = _conversation(1)
    err = _refused(capsys, files, [good, {"messages": [{"role": "user", "content": "hi"}]}])
    assert f"{files['root'] / 'bad.jsonl'}:2: the conversation has no assistant turn" in err
    err = _refused(capsys, files, [good, {"text": "plain"}], "data.format=messages")
    assert f"{files['root'] / 'bad.jsonl'}:2: no column 'messages' (columns: text): set data.messages_key=" in err
    err = _refused(capsys, files, [good], "data.max_length=8", "data.truncation=error")
    assert "bad.jsonl:1: " in err and "above data.max_length=8" in err
    err = _refused(capsys, files, [good], "data.max_length=8")  # keep_start leaves no assistant token
    assert "bad.jsonl:1: no token gets the loss after data.max_length cut it" in err and "data.empty_mask=drop" in err
    err = _refused(capsys, files, [good], "train.micro_batch_tokens=64", "data.max_length=128")
    assert "train.micro_batch_tokens=64 is below data.max_length=128" in err
    err = _refused(capsys, files, [good], "train.loss_on=assistnt")
    assert "train.loss_on must be one of auto, assistant, completion, all, got 'assistnt'" in err


def test_print_config_is_the_resolved_config_as_json(files, capsys):
    code = main([f"model.path={files['model']}", f"data.path={files['train']}", "train.batch_size=8",
                 "train.epochs=2", "--print-config"])
    printed = json.loads(capsys.readouterr().out)
    assert code == 0 and printed["trainer"] == "sft"
    assert printed["derived"] == {"world_size": 2, "total_steps": 10, "format": "messages", "loss_on": "assistant",
                                  "train_examples": 40, "val_examples": 0}
    assert printed["engine"]["total_steps"] == 10 and printed["engine"]["lr_schedule"] == "cosine"
