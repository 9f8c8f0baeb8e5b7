"""The checks of ``rollout.vllm.*``'s server-mode settings, in the launching process before any worker starts."""

from __future__ import annotations

from .access import LOOPBACK, host_problem, managed_argument_problems

MODES = ("colocate", "server")
OWN_ENGINE = "accel"  # the weight-transfer engine this package provides both halves of (vllm_server/worker_engine.py)
OWN_ENGINES = (OWN_ENGINE, "gloo")  # "gloo": its name while it ran on the CPU only (plugin.py registers both)


def transfer_engine(settings, facts) -> str:
    """The weight-transfer engine servers take weights through: ``rollout.vllm.weight_transfer``, else the
    device's (``inference_engine_facts().weight_transfer``: this package's own on every built-in device)."""
    return getattr(settings, "weight_transfer", None) or facts.weight_transfer


def is_own_engine(engine: str) -> bool:
    return engine in OWN_ENGINES


def local_servers(settings) -> int:
    """How many servers the run starts: ``servers``, or 1 without ``server_urls`` and 0 with them."""
    if settings.servers is not None:
        return settings.servers
    return 0 if settings.server_urls else 1


AUTO = "auto"  # rollout.vllm.borrow_threads: the servers' cores where they pay (cores.py)


def borrow_setting_problem(value) -> str | None:
    if value == AUTO or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
        return None
    return f"rollout.vllm.borrow_threads must be auto or an integer >= 0 (0: never borrow), got {value!r}"


def server_problems(settings, facts) -> list[str]:
    """Problems with the server-mode keys, as sentences (none in colocate mode but a bad ``mode``)."""
    if settings.mode not in MODES:
        return [f"rollout.vllm.mode must be one of {', '.join(MODES)}, got {settings.mode!r}"]
    borrow = settings.borrow_threads
    if borrow_setting_problem(borrow):
        return [borrow_setting_problem(borrow)]
    if settings.mode != "server":
        problems = [] if borrow in (0, AUTO) else [
            f"rollout.vllm.borrow_threads={borrow} borrows the cores of idle vLLM servers: it needs "
            f"rollout.vllm.mode=server (this run colocates); set it to auto or 0"]
        if settings.host != LOOPBACK:
            problems.append(f"rollout.vllm.host={settings.host} is where the vLLM servers this run starts listen: it "
                            "needs rollout.vllm.mode=server (this run colocates, nothing listens); remove it")
        return problems
    problems = []
    host = host_problem("rollout.vllm.host", settings.host)
    if host:
        problems.append(host)
    elif settings.host != LOOPBACK and not local_servers(settings):
        problems.append(f"rollout.vllm.host={settings.host} is where the servers this run starts listen, and it "
                        "starts none (rollout.vllm.server_urls): remove it")
    servers, urls = settings.servers, settings.server_urls
    if servers is not None and (not isinstance(servers, int) or isinstance(servers, bool) or servers < 0):
        problems.append(f"rollout.vllm.servers must be a non-negative integer or null, got {servers!r}")
    if not isinstance(urls, list) or not all(isinstance(u, str) and u.startswith(("http://", "https://"))
                                             for u in urls):
        problems.append(f"rollout.vllm.server_urls must be a list of base URLs (http://host:port), got {urls!r}")
    elif servers and urls:
        problems.append("rollout.vllm.servers and rollout.vllm.server_urls are both set: start servers here "
                        "(servers) or connect to running ones (server_urls), not both")
    elif servers == 0 and not urls:
        problems.append("rollout.vllm.mode=server with rollout.vllm.servers=0 needs rollout.vllm.server_urls")
    devices = settings.server_devices
    if devices and (not isinstance(devices, list) or len(devices) != local_servers(settings)):
        problems.append(f"rollout.vllm.server_devices must list one entry per local server "
                        f"({local_servers(settings)}), got {devices!r}")
    port = settings.server_port
    if not isinstance(port, int) or not 0 <= port < 65536:
        problems.append(f"rollout.vllm.server_port must be a port number (0: free ports), got {port!r}")
    if not isinstance(settings.server_args, dict):
        problems.append(f"rollout.vllm.server_args must be a mapping of api_server arguments, got "
                        f"{settings.server_args!r}")
    problems += managed_argument_problems("rollout.vllm.server_args", settings.server_args, {
        "host": "rollout.vllm.host", "port": "rollout.vllm.server_port"})
    engine = settings.weight_transfer
    if engine is not None and (not isinstance(engine, str) or not engine):
        problems.append(f"rollout.vllm.weight_transfer must be a weight-transfer engine's name or null (this "
                        f"package's own, {OWN_ENGINE!r}, over the device's weight group), got {engine!r}")
    else:
        problems += trainer_side_problems(transfer_engine(settings, facts))
    return problems


def trainer_side_problems(engine: str, factory=None) -> list[str]:
    """The weight-transfer engine needs a trainer side: this package's own wire, or one vLLM (or a vLLM platform
    package) registers under the engine's name, importable in the trainer's Python."""
    if is_own_engine(engine):
        return []
    from .client import ServerError
    from .vllm_wire import VLLMTrainerFactory

    try:
        (factory or VLLMTrainerFactory()).init_info_class(engine)
    except ServerError as exc:
        return [f"rollout.vllm.mode=server: {exc}"]
    return []


def unreachable_servers(urls: list[str]) -> list[str]:
    """A sentence for each server in ``urls`` that does not answer ``/health``."""
    from .client import ServerClient

    return [f"rollout.vllm.server_urls: the vLLM server at {url} is unreachable (no answer to /health): start it, "
            "or correct the URL" for url in urls if not ServerClient(url).healthy()]
