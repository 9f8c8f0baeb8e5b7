"""The CPU demo's teacher (``teacher.path=builtin:echo-teacher``): the built-in character model at twice the
student's width, trained by ``accel-sft`` on the echo task's answers, written once under ``run.output_dir/.models``
and then used like any model directory. ``accel-sft`` runs as its own command (a recipe never imports another)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

TEACHER_HIDDEN, TEACHER_LAYERS = 128, 2
SFT_STEPS = 60  # batches of 32 examples: the teacher answers every echo prompt right after about 40


def echo_teacher(output_dir: str, verbose: bool = True) -> str:
    """The demo teacher's directory (made on first use, atomically: another launcher may make it at once)."""
    directory = Path(output_dir).resolve() / ".models" / f"echo-teacher-h{TEACHER_HIDDEN}-l{TEACHER_LAYERS}"
    if (directory / "model.safetensors").is_file():
        return str(directory)
    work = directory.with_name(f"{directory.name}.partial-{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    if verbose:
        print(f"accel-distill: making the demo teacher with accel-sft (once): {directory}", file=sys.stderr, flush=True)
    base = write_char_model(work / "base", TEACHER_HIDDEN, TEACHER_LAYERS)
    data = _write_echo_answers(work / "echo.jsonl")
    sft = [sys.executable, "-m", "engine.sft.cli"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [_repo_root(), os.environ.get("PYTHONPATH")]))}
    _run([*sft, "--nproc", "1", f"model.path={base}", f"data.path={data}", "data.format=prompt_completion",
          f"run.output_dir={work}", "run.name=sft", "run.progress=false", f"train.steps={SFT_STEPS}",
          "train.batch_size=32", "engine.lr=3e-3", "engine.max_grad_norm=1.0"], env)
    _run([*sft, "export", str(work / "sft"), str(work / "teacher")], env)
    try:
        (work / "teacher").rename(directory)
    except OSError:  # another launcher made it first
        pass
    shutil.rmtree(work, ignore_errors=True)
    return str(directory)


def _run(command: list[str], env: dict) -> None:
    done = subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False)
    if done.returncode:
        tail = done.stderr.strip().splitlines()[-1:] or ["(no output)"]
        raise ValueError(f"making the demo teacher failed ({' '.join(command[2:4])}...): {tail[0]}")


def _repo_root() -> str:
    return str(Path(__file__).resolve().parents[4])


def write_char_model(directory: Path, hidden: int, layers: int, seed: int = 1) -> Path:
    """The built-in character model and tokenizer at another size, random weights, as a model directory (the demo
    teacher's start; the bench's teacher)."""
    from ....tiny_model import tiny_qwen2
    from ...prompts import EchoTask
    from ...tokenizer import build_char_tokenizer

    tokenizer = build_char_tokenizer(EchoTask.alphabet)
    model = tiny_qwen2(seed=seed, vocab_size=len(tokenizer), hidden_size=hidden, layers=layers,
                       pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                       eos_token_id=tokenizer.eos_token_id)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def _write_echo_answers(path: Path, copies: int = 40) -> Path:
    """Every echo prompt with its answer (the task's whole space), ``copies`` times over."""
    from ...prompts import EchoTask

    task = EchoTask()
    rows = [{"prompt": f"{letter} x{count}:", "completion": letter * count}
            for letter in task.letters for count in range(1, task.max_repeat + 1)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows * copies))
    return path


def exact_echo(prompt: str, response: str, answer: str) -> float:
    """1.0 for exactly the answer, else 0: the echo task with a sparse reward (``data.reward`` of the demo's
    comparison with GRPO, where a random policy almost never earns anything)."""
    return float(response == answer)
