"""A distillation teacher: a frozen model of another size (or architecture) sharing the student's tokenizer, whose
log-probs of the student's own tokens the step uses. It is a model directory run in our engine (``teacher.path``:
sharded like the policy, its parameters in host memory between uses when offloaded, as the KL reference is), or a
vLLM server serving it (``teacher.server_url``: its prompt log-probs, ``server_logprobs.py``).

Distillation compares log-probs of the same token ids, so a teacher whose tokenizer maps any token differently is
refused before any worker starts (``tokenizer_problem``)."""

from __future__ import annotations

import dataclasses

from ...engine_settings import engine_config
from ...frozen import FrozenSpec


@dataclasses.dataclass
class TeacherConfig:
    path: str | None = None  # the teacher's model directory, run in our engine (frozen, sharded like the policy)
    server_url: str | None = None  # or a vLLM server serving the teacher (http://host:port): its prompt log-probs
    param_offload: bool = True  # teacher.path: keep the teacher's parameters in host memory between uses
    server_model: str | None = None  # teacher.server_url: the served model's name; null: the server's first model
    timeout_s: float = 600.0  # teacher.server_url: the longest wait for one request's log-probs


def source_problems(teacher: TeacherConfig) -> list[str]:
    """``teacher.*`` on its own: exactly one source, and the directory a model directory."""
    from ...model import check_model_dir

    if bool(teacher.path) == bool(teacher.server_url):
        return ["give the teacher as teacher.path=MODEL_DIR (run in our engine) or teacher.server_url=http://HOST:PORT "
                "(a vLLM server serving it), exactly one of them"]
    if teacher.path:
        return check_model_dir(teacher.path, "teacher.path")
    if not teacher.server_url.startswith(("http://", "https://")):
        return [f"teacher.server_url must be an http:// or https:// address, got {teacher.server_url!r}"]
    return [] if teacher.timeout_s > 0 else [f"teacher.timeout_s must be > 0, got {teacher.timeout_s}"]


def tokenizer_problem(student, teacher, where: str) -> str | None:
    """One sentence when ``teacher``'s tokenizer maps any token (or the pad/EOS tokens) differently from
    ``student``'s; None when they are the same."""
    mine, theirs = student.get_vocab(), teacher.get_vocab()
    if mine != theirs:
        differ = sorted(set(mine.items()) ^ set(theirs.items()), key=lambda item: item[1])
        example = ", ".join(f"{token!r}" for token, _ in differ[:3])
        return (f"the teacher's tokenizer ({where}) differs from the student's ({len(theirs)} tokens against "
                f"{len(mine)}; {len(differ)} differ, e.g. {example}): distillation compares the log-probs of the same "
                "token ids, so the teacher must share the student's tokenizer (a model of the same family)")
    for name in ("eos_token_id", "pad_token_id"):
        if getattr(student, name) != getattr(teacher, name):
            return (f"the teacher's tokenizer ({where}) has {name} {getattr(teacher, name)}, the student's "
                    f"{getattr(student, name)}: the teacher must share the student's tokenizer")
    return None


def load_tokenizer(directory: str):
    """A model directory's tokenizer, its pad token completed as the policy's is (``model.build_model``)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(directory)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def path_problems(config, student_tokenizer) -> list[str]:
    """``teacher.path``'s tokenizer against the student's (the teacher's directory read once, in the launcher)."""
    problem = tokenizer_problem(student_tokenizer, load_tokenizer(config.teacher.path), config.teacher.path)
    return [problem] if problem else []


def teacher_spec(config, world_size: int) -> FrozenSpec:
    """The frozen teacher in our engine: the policy's sharding and precision, no adapters of its own (it is another
    model), its layers found by its own architecture, offloaded between uses when ``teacher.param_offload``."""
    options = dataclasses.replace(engine_config(config, world_size, frozen_offload=config.teacher.param_offload),
                                  lora_rank=0, wrap_class_names=None)
    return FrozenSpec(options, source=config.teacher.path)
