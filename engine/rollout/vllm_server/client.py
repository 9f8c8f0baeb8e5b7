"""One vLLM server over HTTP: token ids in, token ids and sampled tokens' log-probs out, and the RL verbs.

Routes used (vLLM 0.32; the RL ones exist with ``VLLM_SERVER_DEV_MODE=1``): ``/health``, ``/v1/models``,
``/inference/v1/generate`` (``--enable-scale-out``: token ids and sampling parameters in, token ids, log-probs and
the weight version of each token out), ``/pause`` (``keep`` / ``abort`` / ``wait``), ``/resume``,
``/init_weight_transfer_engine``, ``/start_weight_update``, ``/update_weights``, ``/finish_weight_update`` (with
the version the weights get) and ``/weight_info`` (the version the server reports); with LoRA served
(``--enable-lora``, ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1``) ``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter``.
Standard library only; every failure is a ``ServerError`` whose one line names the server and what to do.

Every request carries the server's key (``Authorization: Bearer``): the key of the run that started it, or for a
server the user started (``rollout.vllm.server_urls``, ``teacher.server_url``) the trainer's ``VLLM_API_KEY``, if
set (the variable vLLM's server reads its key from).
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from ...runtime import OneLineError
from .access import KEY_ENV, auth_headers

PAUSE_MODES = ("keep", "abort", "wait")


class ServerError(OneLineError, RuntimeError):
    """A vLLM server that cannot be reached or refused a request."""


class ServerClient:
    """Calls to the vLLM server at ``url`` (``http://host:port``); ``timeout_s`` bounds each call; ``api_key``: the
    server's key (None: ``VLLM_API_KEY`` from this process's environment, if set)."""

    def __init__(self, url: str, timeout_s: float = 600.0, api_key: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.api_key = api_key if api_key is not None else os.environ.get(KEY_ENV)

    def call(self, method: str, path: str, body: dict | None = None, query: dict | None = None,
             timeout_s: float | None = None) -> Any:
        """The route's JSON answer (``None`` for an empty one, the text for one that is not JSON)."""
        address = self.url + path + ("?" + urllib.parse.urlencode(query) if query else "")
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(address, data=data, method=method, headers=auth_headers(self.api_key))
        try:
            with urllib.request.urlopen(request, timeout=timeout_s or self.timeout_s) as answer:
                text = answer.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace").strip().replace("\n", " ")[:300]
            hint = ""
            if exc.code == 404 and "lora_adapter" in path:
                hint = " (adapters need --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 on the server)"
            elif exc.code == 401:
                hint = (" (the server wants an API key: set VLLM_API_KEY to the key it was started with)"
                        if self.api_key is None else " (the server refused this key)")
            elif exc.code == 404:
                hint = " (the RL routes need VLLM_SERVER_DEV_MODE=1 on the server)"
            raise ServerError(f"vLLM server {self.url}: {method} {path} answered {exc.code}{hint}: {detail}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ServerError(f"vLLM server {self.url} is unreachable ({method} {path}: {reason}): check the URL "
                              "and that the server is running") from None
        if not text.strip():
            return None
        try:
            return json.loads(text)
        except json.JSONDecodeError:  # the adapter routes answer in plain text ("Success: ...")
            return text.decode(errors="replace")

    # -- state --------------------------------------------------------------------------------------------------

    def healthy(self) -> bool:
        try:
            self.call("GET", "/health", timeout_s=5)
        except ServerError:
            return False
        return True

    def models(self) -> list[dict]:
        """``/v1/models``' entries: ``id``, ``root`` (the model's path) and ``max_model_len``."""
        return self.call("GET", "/v1/models")["data"]

    def weight_version(self) -> str | None:
        return self.call("GET", "/weight_info")["weight_version"]

    # -- sampling -----------------------------------------------------------------------------------------------

    def generate(self, token_ids: list[int], sampling_params: dict, model: str | None = None) -> list[dict]:
        """The choices (``index``, ``token_ids``, ``logprobs``, ``weight_versions``) for one prompt; ``model``: the
        LoRA adapter to sample with (its name), or the base model."""
        body = {"token_ids": list(token_ids), "sampling_params": sampling_params, "output_mode": "tokens",
                "stream": False, **({"model": model} if model else {})}
        answer = self.call("POST", "/inference/v1/generate", body)
        return sorted(answer["choices"], key=lambda choice: choice["index"])

    def pause(self, mode: str = "keep", clear_cache: bool = True) -> None:
        if mode not in PAUSE_MODES:
            raise ValueError(f"pause mode must be one of {', '.join(PAUSE_MODES)}, got {mode!r}")
        self.call("POST", "/pause", query={"mode": mode, "clear_cache": str(clear_cache).lower()})

    def resume(self) -> None:
        self.call("POST", "/resume")

    # -- weights (vLLM's weight-transfer verbs) -----------------------------------------------------------------

    def init_weight_transfer_engine(self, init_info: dict) -> None:
        self.call("POST", "/init_weight_transfer_engine", {"init_info": init_info})

    def start_weight_update(self) -> None:
        self.call("POST", "/start_weight_update")

    def update_weights(self, update_info: dict) -> None:
        self.call("POST", "/update_weights", {"update_info": update_info})

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self.call("POST", "/finish_weight_update", {"weight_version": weight_version})

    # -- LoRA adapters (rollout.vllm.lora_sync=adapter) ------------------------------------------------------------

    def load_lora_adapter(self, name: str, path: str) -> None:
        self.call("POST", "/v1/load_lora_adapter", {"lora_name": name, "lora_path": path})

    def unload_lora_adapter(self, name: str) -> None:
        self.call("POST", "/v1/unload_lora_adapter", {"lora_name": name})
