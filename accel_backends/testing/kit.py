"""Run the rules against one backend and report one result per rule.

The rules are the device layer's own (``rules.py``) followed by those that plugins register through the
``register_conformance_rules`` hook (the engine's ``engine-fsdp2``/``engine-fsdp1`` arrive that way, from the
``accel_backends.conformance`` entry-point group, loaded only here).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterable, Union

from ..base import DeviceBackend
from ..registry import CONFORMANCE_GROUP, registry, safe_reason
from ..spawn import LocalJob
from .rules import DEVICE_RULES, Rule, RuleSkipped

BackendRef = Union[str, DeviceBackend]  # a registered name (looked up in every process) or an instance
DEFAULT_TIMEOUT_S = 300.0


@dataclasses.dataclass(frozen=True)
class RuleResult:
    rule: str
    status: str  # "passed", "failed" or "skipped"
    detail: str  # what held, what broke, or why the rule does not apply

    def line(self) -> str:
        return f"{self.status.upper():<8}{self.rule}: {self.detail}"


def all_rules() -> tuple[Rule, ...]:
    """The device rules, then every rule the plugins registered (loading the conformance entry points first)."""
    current = registry()
    current.load_group(CONFORMANCE_GROUP)
    extra: list[Rule] = []

    def register(rule: Rule) -> None:
        if not isinstance(rule, Rule):
            raise TypeError(f"register_conformance_rules registered {rule!r}, not an accel_backends.testing.Rule")
        if rule.name in {r.name for r in (*DEVICE_RULES, *extra)}:
            raise ValueError(f"conformance rule {rule.name!r} is registered twice")
        extra.append(rule)

    current.plugin_manager.hook.register_conformance_rules(register=register)
    return (*DEVICE_RULES, *extra)


def rule_names() -> tuple[str, ...]:
    return tuple(rule.name for rule in all_rules())


def rule_named(name: str) -> Rule:
    rules = all_rules()
    for rule in rules:
        if rule.name == name:
            return rule
    names = [rule.name for rule in rules]
    raise KeyError(f"no conformance rule {name!r}; the rules are {', '.join(names)}")


def resolve(backend: BackendRef) -> DeviceBackend:
    """The backend instance for a name (registered, available or not) or the instance itself."""
    return registry().get(backend).backend if isinstance(backend, str) else backend


def run_rule(backend: DeviceBackend, rule: Rule, *args) -> RuleResult:
    try:
        note = rule.check(backend, *args)
    except RuleSkipped as skip:
        return RuleResult(rule.name, "skipped", str(skip))
    except AssertionError as exc:
        return RuleResult(rule.name, "failed", f"{exc} [contract: {rule.summary}]")
    except Exception as exc:  # noqa: BLE001 - a backend that raises breaks the rule; say where
        return RuleResult(rule.name, "failed", f"{type(exc).__name__}: {exc} [contract: {rule.summary}]")
    return RuleResult(rule.name, "passed", note)


def _rank_job(backend_ref: BackendRef, names: tuple[str, ...], nproc: int) -> list[RuleResult]:
    """What each rank of the multi-process job runs: ``distributed`` first, the other rules only after it holds."""
    import torch

    backend = resolve(backend_ref)
    if backend.device_type == "cpu":
        torch.set_num_threads(1)  # the ranks share the host's cores
    results = [run_rule(backend, rule_named("distributed"), nproc)]
    for name in names:
        if name == "distributed":
            continue
        if results[0].status != "passed":
            results.append(RuleResult(name, "skipped", "needs the 'distributed' rule to hold"))
        else:
            results.append(run_rule(backend, rule_named(name), nproc))
    return [r for r in results if r.rule in names]


def _merge(name: str, per_rank: list[RuleResult]) -> RuleResult:
    failed: dict[str, list[int]] = {}  # detail -> the ranks that failed with it
    for rank, result in enumerate(per_rank):
        if result.status == "failed":
            failed.setdefault(result.detail, []).append(rank)
    if failed:
        return RuleResult(name, "failed", "; ".join(
            f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}: {detail}"
            for detail, ranks in failed.items()))
    if all(r.status == "skipped" for r in per_rank):
        return RuleResult(name, "skipped", per_rank[0].detail)
    return next(r for r in per_rank if r.status == "passed")  # what rank 0 (or the first that ran it) saw


def run_multi_process(backend_ref: BackendRef, names: tuple[str, ...], nproc: int,
                      timeout: float = DEFAULT_TIMEOUT_S) -> list[RuleResult]:
    backend = resolve(backend_ref)
    reason = safe_reason(backend)
    if reason is not None:
        return [RuleResult(n, "skipped", f"the backend is not available here: {reason}") for n in names]
    if backend.device_type != "cpu" and backend.device_count() < nproc:
        return [RuleResult(n, "skipped", f"needs {nproc} devices, {backend.device_count()} visible: run with "
                                         f"--nproc {backend.device_count()}") for n in names]
    with LocalJob(_rank_job, (backend_ref, names, nproc), nproc) as job:
        ended = job.wait(timeout=timeout, stop_on_failure=False)
    errors = [f"rank {o.rank}: {_why(o, ended, timeout)}" for o in job.outcomes if not o.returned]
    if errors:
        return [RuleResult(n, "failed", f"the {nproc}-process job failed: {'; '.join(errors)}") for n in names]
    by_rank = [{r.rule: r for r in o.result} for o in job.outcomes]
    return [_merge(n, [ranks[n] for ranks in by_rank]) for n in names]


def _why(outcome, ended: str, timeout: float) -> str:
    if outcome.error is not None:
        return outcome.traceback.strip().splitlines()[-1] if outcome.traceback else outcome.error
    if outcome.exitcode is None and ended == "timeout":
        return f"did not finish within {timeout:.0f} s (a hang in a collective or a device call?)"
    return f"died with exit code {outcome.exitcode} before reporting"


def run_conformance(backend: BackendRef, nproc: int = 2, rules: Iterable[str] | None = None,
                    timeout: float = DEFAULT_TIMEOUT_S,
                    on_result: Callable[[RuleResult], None] | None = None) -> list[RuleResult]:
    """Check ``backend`` (a registered name, or an instance) against the contract; one result per rule, in order.

    ``rules`` selects by name (default: all). A name is looked up in the registry of every process, as a user's
    job would find it; an instance is pickled to the ranks (its class must be importable there). ``on_result``
    sees each result as soon as it is known (the command line prints it).
    """
    every = all_rules()
    names = tuple(rule.name for rule in every) if rules is None else tuple(rules)
    for name in names:
        rule_named(name)  # an unknown name is an error before any work
    if nproc < 1:
        raise ValueError(f"nproc must be at least 1, got {nproc}")
    instance = resolve(backend)
    results = []
    for rule in every:
        if rule.name in names and not rule.multi_process:
            results.append(run_rule(instance, rule))
            if on_result is not None:
                on_result(results[-1])
    multi = tuple(rule.name for rule in every if rule.name in names and rule.multi_process)
    for result in run_multi_process(backend, multi, nproc, timeout) if multi else ():
        results.append(result)
        if on_result is not None:
            on_result(result)
    return results
