"""A frozen model served by vLLM (a distillation teacher at ``teacher.server_url``): its log-probs of the step's
tokens are the server's prompt log-probs of each whole sequence (prompt + response sent as token ids to
``/v1/completions`` with ``prompt_logprobs``; one token generated and dropped). No weights of it live in the
trainer's processes, which is what pays for a teacher larger than the student's devices hold.

vLLM computes prompt log-probs from the model's own distribution (temperature 1, no top-k / top-p), so this path
is for rollouts sampled that way (``server_problems`` refuses other settings), and the tokenizer the server uses is
compared with the student's on probe texts before any worker starts."""

from __future__ import annotations

from pathlib import Path

import torch

from ..rollout.vllm_server.client import ServerClient, ServerError

REQUEST_SEQUENCES = 64  # sequences per request: the server batches them; bounded to keep each answer small
PROBE_TEXTS = ("The quick brown fox jumps over 13 lazy dogs.", "a x3: aaa", "#### 42\n")


class ServerFrozenModel:
    """A frozen model by ``name`` whose log-probs come from the vLLM server at ``url`` (``FrozenModel``'s
    interface: ``log_probs(data, rollout)``; no engine of ours)."""

    engine = None

    def __init__(self, name: str, url: str, model: str | None = None, timeout_s: float = 600.0) -> None:
        self.name, self.client = name, ServerClient(url, timeout_s)
        self.model = model or self.client.models()[0]["id"]

    def log_probs(self, data, rollout) -> torch.Tensor:
        """``[N, R]`` log-probs of this rank's share of ``data`` (a ``StepData``); other ranks' rows are 0."""
        sequences = data.sequences
        out = torch.zeros(len(sequences), data.width)
        rows = data.own_rows()
        for begin in range(0, len(rows), REQUEST_SEQUENCES):
            chunk = rows[begin:begin + REQUEST_SEQUENCES]
            ids = [sequences.tokens[i, :int(sequences.lengths[i])].tolist() for i in chunk]
            answer = self.client.call("POST", "/v1/completions", {
                "model": self.model, "prompt": ids, "max_tokens": 1, "prompt_logprobs": 0, "temperature": 1.0})
            choices = sorted(answer["choices"], key=lambda choice: choice["index"])
            if len(choices) != len(chunk):
                raise ServerError(f"vLLM server {self.client.url} answered {len(choices)} choices for {len(chunk)} "
                                  "sequences")
            for row, tokens, choice in zip(chunk, ids, choices, strict=True):
                values = scored_log_probs(choice["prompt_logprobs"], tokens, int(sequences.starts[row]))
                out[row, :len(values)] = torch.tensor(values)
        return out


def scored_log_probs(prompt_logprobs: list, tokens: list[int], start: int) -> list[float]:
    """The log-probs of ``tokens[start:]`` (the response) from vLLM's ``prompt_logprobs`` of the whole sequence:
    one entry per position (None for the first), each ``{token id: {"logprob": ...}, ...}`` holding at least the
    token at that position."""
    if len(prompt_logprobs) != len(tokens):
        raise ServerError(f"the teacher's server returned {len(prompt_logprobs)} prompt log-probs for a sequence of "
                          f"{len(tokens)} tokens")
    values = []
    for position in range(start, len(tokens)):
        entry = prompt_logprobs[position] or {}
        found = entry.get(str(tokens[position]), entry.get(tokens[position]))
        if found is None:
            raise ServerError(f"the teacher's server gave no log-prob for token {tokens[position]} at position "
                              f"{position}")
        values.append(float(found["logprob"] if isinstance(found, dict) else found))
    return values


def server_problems(teacher, rollout, tokenizer) -> list[str]:
    """What stops a served teacher, one sentence each, before any worker: sampling its prompt log-probs do not
    follow, an unreachable server or model, a tokenizer that differs from the student's: the served model's
    directory's when this machine has it (``/v1/models``' ``root``: every token compared), else the server's
    ``/tokenize`` of probe texts."""
    if rollout.temperature != 1.0 or rollout.top_k or rollout.top_p != 1.0:
        return [f"teacher.server_url gives the teacher's log-probs at temperature 1 without top-k / top-p (vLLM's "
                f"prompt log-probs), but the rollout samples at rollout.temperature={rollout.temperature}, "
                f"top_k={rollout.top_k}, top_p={rollout.top_p}: sample with rollout.temperature=1.0 rollout.top_k=0 "
                "rollout.top_p=1.0, or run the teacher in our engine (teacher.path=MODEL_DIR)"]
    client = ServerClient(teacher.server_url, min(teacher.timeout_s, 30.0))
    try:
        served = {entry["id"]: entry for entry in client.models()}
        if teacher.server_model and teacher.server_model not in served:
            return [f"teacher.server_model={teacher.server_model!r} is not served at {teacher.server_url} (it serves "
                    f"{', '.join(served)})"]
        model = teacher.server_model or next(iter(served))
        root = served[model].get("root")
        if root and (Path(root) / "tokenizer_config.json").is_file():
            from .teacher import load_tokenizer, tokenizer_problem

            problem = tokenizer_problem(tokenizer, load_tokenizer(root), f"{root}, served at {teacher.server_url}")
            return [problem] if problem else []
        return probe_problems(client, model, teacher.server_url, tokenizer)
    except ServerError as exc:
        return [f"teacher.server_url: {exc}"]


def probe_problems(client: ServerClient, model: str, url: str, tokenizer) -> list[str]:
    """The server's tokenizer against the student's on the probe texts (``/tokenize``)."""
    for text in PROBE_TEXTS:
        try:
            theirs = client.call("POST", "/tokenize", {"model": model, "prompt": text, "add_special_tokens": False})
        except ServerError as exc:
            return [f"the teacher's tokenizer cannot be checked against the student's: the served model's directory "
                    f"is not on this machine and {exc}; serve the teacher with its tokenizer (vLLM's default), or "
                    "run it in our engine (teacher.path=MODEL_DIR)"]
        mine = tokenizer(text, add_special_tokens=False)["input_ids"]
        if list(theirs["tokens"]) != list(mine):
            return [f"the teacher's tokenizer (served at {url}) differs from the student's: {text!r} is "
                    f"{theirs['tokens'][:8]}... there and {mine[:8]}... here; distillation compares the log-probs of "
                    "the same token ids, so serve a teacher sharing the student's tokenizer"]
    return []
