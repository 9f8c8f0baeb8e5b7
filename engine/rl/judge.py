"""An LLM judge behind an OpenAI-compatible chat endpoint (``reward_model.judge_url``): each response becomes one
chat request (``reward_model.judge_prompt`` with ``{prompt}``, ``{response}``, ``{answer}`` filled in), its reply
one score. Every failed call (an HTTP status, no connection, a reply that is not HTTP, cut short, too big, slower
than ``reward_model.timeout_s`` in all, or holding no usable number: ``judge_http.py``) is retried
``reward_model.retries`` times, then counted as a failure with reward 0 and its cause kept: a flaky judge costs a
few rewards, but a step where more than ``reward_model.max_failure_frac`` of the responses failed stops the run
(``reward_model.failure_stop``), and a judge that does not answer at all is refused before any worker starts
(``reachability_problem``)."""

from __future__ import annotations

import json
import math
import os
import re
from concurrent.futures import ThreadPoolExecutor

from ..rollout.vllm_server.access import auth_headers
from .judge_http import JudgeFailure, call
from .rewards import FLOAT32_MAX
from .scorers import ModelReward, prompt_text

_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)"
_LABELLED = re.compile(rf"score\W{{0,3}}({_NUMBER})", re.IGNORECASE)


def parse_score(reply: str) -> float | None:
    """The score in a judge's reply: JSON ``{"score": x}``, a number after the word "score", else the first
    number; None when there is none (garbage) or it is not a number a float32 reward holds (1e300, inf, nan)."""
    text = reply.strip()
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if isinstance(value, dict):
        value = value.get("score")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return _usable(float(value))
    found = _LABELLED.search(text) or re.search(_NUMBER, text)
    if found is None:
        return None
    return _usable(float(found.group(1) if found.re is _LABELLED else found.group(0)))


def _usable(number: float) -> float | None:
    return number if math.isfinite(number) and abs(number) <= FLOAT32_MAX else None


def fill(template: str, prompt: str, response: str, answer: str | None) -> str:
    """The template with its three fields filled (other braces, a JSON example say, are left as they are)."""
    return (template.replace("{prompt}", prompt).replace("{response}", response)
            .replace("{answer}", "" if answer is None else str(answer)))


def env_api_key(section) -> str | None:
    """``judge_url``'s key, read from the environment variable ``reward_model.judge_api_key_env`` names (the key
    itself never sits in the config, the run's config.json or a command line, where ``ps`` shows it)."""
    name = getattr(section, "judge_api_key_env", None)
    return os.environ.get(name) or None if name else None


def api_key_env_problem(section) -> str | None:
    """One line when ``reward_model.judge_api_key_env`` is set but cannot give ``judge_url`` a key."""
    name = getattr(section, "judge_api_key_env", None)
    if not name:
        return None
    if not section.judge_url:
        return "reward_model.judge_api_key_env is the key of reward_model.judge_url: set it only with judge_url"
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(name)):  # not echoed: it may be a key pasted by mistake
        return ("reward_model.judge_api_key_env must be the NAME of an environment variable that holds the key "
                "(e.g. JUDGE_API_KEY), not the key itself")
    if not os.environ.get(name):
        return (f"reward_model.judge_api_key_env={name}: the environment variable {name} is not set (or empty): "
                f"export {name}=<the judge's API key> before starting the run")
    return None


class JudgeReward(ModelReward):
    """Scores through ``reward_model.judge_url`` (or ``judge_model``'s server), ``max_parallel`` calls at once; with
    ``judge_constrained``, each call asks for a reply of ``judge_answer_regex``'s form."""

    def __init__(self, section, url: str | None = None, api_key: str | None = None) -> None:
        """``section``: ``RewardModelConfig``; ``url`` and ``api_key``: ``judge_model``'s server and its key."""
        super().__init__()
        self.auth = auth_headers(api_key if api_key is not None else env_api_key(section))
        self.section = section
        self.last_failure = ""
        base = (url or section.judge_url).rstrip("/")
        constrained = section.judge_constrained
        # vLLM's structured outputs: the reply can only take the score's form (judge_model: always a vLLM server)
        self.constraint = ({"structured_outputs": {"regex": section.judge_answer_regex}}
                           if (bool(section.judge_model) if constrained is None else constrained) else {})
        self.base = base.removesuffix("/chat/completions")
        self.name = section.judge_name

    @property
    def where(self) -> str:
        """What the run's stop line names: the endpoint."""
        return self.base

    def headers(self) -> dict:
        """Every judge request's headers (the one place they are made)."""
        return {"Content-Type": "application/json", **self.auth}

    def _post(self, path: str, body: dict | None, timeout_s: float | None = None) -> dict:
        """One bounded call (``judge_http.call``); ``JudgeFailure`` names why it failed."""
        return call(self.base + path, body, self.headers(), timeout_s or self.section.timeout_s)

    def model_name(self) -> str:
        """``reward_model.judge_name``, else the first model the endpoint lists (asked once), else ``default``."""
        if self.name is None:
            try:
                self.name = str(self._post("/models", None)["data"][0]["id"])
            except (JudgeFailure, LookupError, TypeError):
                return "default"  # asked again next time: the endpoint may not be up yet
        return self.name

    def ask(self, text: str) -> float | None:
        """One judged response: its score, or None when every attempt failed (the last cause kept in
        ``last_failure``)."""
        for _ in range(self.section.retries + 1):
            try:
                reply = self._post("/chat/completions", {
                    "model": self.model_name(), "messages": [{"role": "user", "content": text}],
                    "temperature": 0.0, "max_tokens": self.section.judge_max_tokens, **self.constraint})
                content = reply["choices"][0]["message"]["content"]
            except JudgeFailure as exc:
                self.last_failure = str(exc)
                continue
            except (LookupError, TypeError):
                self.last_failure = "a reply without choices[0].message.content"
                continue
            score = parse_score(str(content))
            if score is not None:
                return score
            self.last_failure = f"a reply holding no usable score ({' '.join(str(content).split())[:80]!r})"
        return None

    def reachability_problem(self, timeout_s: float = 30.0) -> str | None:
        """One sentence when the endpoint gives no HTTP answer at all (or refuses us: 401/403), else None: asked
        before any worker starts, as a served teacher is."""
        try:
            self._post("/models", None, min(self.section.timeout_s, timeout_s))
        except JudgeFailure as exc:
            cause = str(exc)
            if cause.startswith("answered HTTP") and not cause.startswith(("answered HTTP 401", "answered HTTP 403")):
                return None  # it answers: a judge need not list its models
            refused = cause.startswith(("answered HTTP 401", "answered HTTP 403"))
            todo = ("give it its API key: reward_model.judge_api_key_env=VAR, VAR an environment variable holding it"
                    if refused else "start the judge, or correct the URL")
            return f"reward_model.judge_url {self.base}: {cause}: {todo} (checked before any worker starts)"
        return None

    def _score(self, samples, responses, completions):
        texts = [fill(self.section.judge_prompt, prompt_text(s), r, s.answer)
                 for s, r in zip(samples, responses, strict=True)]
        with ThreadPoolExecutor(max_workers=min(self.section.max_parallel, max(len(texts), 1))) as pool:
            found = list(pool.map(self.ask, texts))
        return [0.0 if score is None else score for score in found], [score is None for score in found]
