"""Run the rules against one backend and report one result per rule."""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterable, Union

from ..base import DeviceBackend
from ..registry import registry, safe_reason
from .launcher import run_job
from .rules import RULE_NAMES, RULES, Rule, RuleSkipped, rule_named

BackendRef = Union[str, DeviceBackend]  # a registered name (looked up in every process) or an instance
DEFAULT_TIMEOUT_S = 300.0


@dataclasses.dataclass(frozen=True)
class RuleResult:
    rule: str
    status: str  # "passed", "failed" or "skipped"
    detail: str  # what held, what broke, or why the rule does not apply

    def line(self) -> str:
        return f"{self.status.upper():<8}{self.rule}: {self.detail}"


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
    """What each rank of the multi-process job runs: ``distributed`` first, the engine rules only after it holds."""
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
    outcomes = run_job(_rank_job, (backend_ref, names, nproc), nproc, timeout)
    errors = [f"rank {rank}: {o['error'].strip().splitlines()[-1]}" for rank, o in enumerate(outcomes) if "error" in o]
    if errors:
        return [RuleResult(n, "failed", f"the {nproc}-process job failed: {'; '.join(errors)}") for n in names]
    by_rank = [{r.rule: r for r in o["result"]} for o in outcomes]
    return [_merge(n, [ranks[n] for ranks in by_rank]) for n in names]


def run_conformance(backend: BackendRef, nproc: int = 2, rules: Iterable[str] | None = None,
                    timeout: float = DEFAULT_TIMEOUT_S,
                    on_result: Callable[[RuleResult], None] | None = None) -> list[RuleResult]:
    """Check ``backend`` (a registered name, or an instance) against the contract; one result per rule, in order.

    ``rules`` selects by name (default: all). A name is looked up in the registry of every process, as a user's
    job would find it; an instance is pickled to the ranks (its class must be importable there). ``on_result``
    sees each result as soon as it is known (the command line prints it).
    """
    names = tuple(RULE_NAMES if rules is None else rules)
    for name in names:
        rule_named(name)  # an unknown name is an error before any work
    if nproc < 1:
        raise ValueError(f"nproc must be at least 1, got {nproc}")
    instance = resolve(backend)
    results = []
    for rule in RULES:
        if rule.name in names and not rule.multi_process:
            results.append(run_rule(instance, rule))
            if on_result is not None:
                on_result(results[-1])
    multi = tuple(rule.name for rule in RULES if rule.name in names and rule.multi_process)
    for result in run_multi_process(backend, multi, nproc, timeout) if multi else ():
        results.append(result)
        if on_result is not None:
            on_result(result)
    return results
