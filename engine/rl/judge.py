"""An LLM judge behind an OpenAI-compatible chat endpoint (``reward_model.judge_url``): each response becomes one
chat request (``reward_model.judge_prompt`` with ``{prompt}``, ``{response}``, ``{answer}`` filled in), its reply
one score. A call that times out, fails or answers no number is retried ``reward_model.retries`` times, then
counted as a failure with reward 0: a flaky judge never stops the run."""

from __future__ import annotations

import json
import math
import re
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from ..rollout.vllm_server.access import auth_headers
from .scorers import ModelReward, prompt_text

_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)"
_LABELLED = re.compile(rf"score\W{{0,3}}({_NUMBER})", re.IGNORECASE)


def parse_score(reply: str) -> float | None:
    """The score in a judge's reply: JSON ``{"score": x}``, a number after the word "score", else the first
    number; None when there is none (garbage)."""
    text = reply.strip()
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if isinstance(value, dict):
        value = value.get("score")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    found = _LABELLED.search(text) or re.search(_NUMBER, text)
    if found is None:
        return None
    number = float(found.group(1) if found.re is _LABELLED else found.group(0))
    return number if math.isfinite(number) else None


def fill(template: str, prompt: str, response: str, answer: str | None) -> str:
    """The template with its three fields filled (other braces, a JSON example say, are left as they are)."""
    return (template.replace("{prompt}", prompt).replace("{response}", response)
            .replace("{answer}", "" if answer is None else str(answer)))


class JudgeReward(ModelReward):
    """Scores through ``reward_model.judge_url`` (or ``judge_model``'s server), ``max_parallel`` calls at once; with
    ``judge_constrained``, each call asks for a reply of ``judge_answer_regex``'s form."""

    def __init__(self, section, url: str | None = None, api_key: str | None = None) -> None:
        """``section``: ``RewardModelConfig``; ``url`` and ``api_key``: ``judge_model``'s server and its key."""
        super().__init__()
        self.headers = auth_headers(api_key)
        self.section = section
        base = (url or section.judge_url).rstrip("/")
        constrained = section.judge_constrained
        # vLLM's structured outputs: the reply can only take the score's form (judge_model: always a vLLM server)
        self.constraint = ({"structured_outputs": {"regex": section.judge_answer_regex}}
                           if (bool(section.judge_model) if constrained is None else constrained) else {})
        self.base = base.removesuffix("/chat/completions")
        self.name = section.judge_name

    def _post(self, path: str, body: dict | None) -> dict:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data, headers=self.headers)
        with urllib.request.urlopen(request, timeout=self.section.timeout_s) as reply:
            return json.loads(reply.read().decode())

    def model_name(self) -> str:
        """``reward_model.judge_name``, else the first model the endpoint lists (asked once), else ``default``."""
        if self.name is None:
            try:
                self.name = str(self._post("/models", None)["data"][0]["id"])
            except (OSError, ValueError, LookupError, TypeError):
                return "default"  # asked again next time: the endpoint may not be up yet
        return self.name

    def ask(self, text: str) -> float | None:
        """One judged response: its score, or None when every attempt failed."""
        for _ in range(self.section.retries + 1):
            try:
                reply = self._post("/chat/completions", {
                    "model": self.model_name(), "messages": [{"role": "user", "content": text}],
                    "temperature": 0.0, "max_tokens": self.section.judge_max_tokens, **self.constraint})
                score = parse_score(str(reply["choices"][0]["message"]["content"]))
            except (OSError, ValueError, LookupError, TypeError):  # timeouts, refused, HTTP errors, bad JSON
                score = None
            if score is not None:
                return score
        return None

    def _score(self, samples, responses, completions):
        texts = [fill(self.section.judge_prompt, prompt_text(s), r, s.answer)
                 for s, r in zip(samples, responses, strict=True)]
        with ThreadPoolExecutor(max_workers=min(self.section.max_parallel, max(len(texts), 1))) as pool:
            found = list(pool.map(self.ask, texts))
        return [0.0 if score is None else score for score in found], [score is None for score in found]
