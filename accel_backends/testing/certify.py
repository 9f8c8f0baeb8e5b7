"""``accel-backends certify NAME``: the report card for on-policy RL on a device.

On-policy RL is right on a device when what the trainer reduces, keeps, moves, saves and hands the rollout engine
is what the math says; a reward curve cannot show it (a wrong gradient still learns, slower). Each property of the
card is measured on the backend in a multi-process job (``nproc`` ranks, 2 by default): its figure (the worst over
ranks), the bound it must stay within and the verdict. The properties come from the layers above through the
``register_certify_properties`` hook (the engine's, ``engine/certify.py``, load from the
``accel_backends.conformance`` entry point, or ``ACCEL_BACKENDS_PLUGINS=engine.conformance`` in a checkout): this
package runs and reports them and knows nothing of engines. Markdown on stdout, JSON with ``--json``; exit 0 only
when every applicable property holds.

``--precision bf16`` runs the card in the precision every GPU/NPU run trains in (the property's ``bf16_bound``
then applies). With ``--nproc 1`` (one device) a property's ``fake_rank_check`` also runs as rank 1 of 2 on torch's
fake process group (collectives that move nothing) in a process of its own: what one rank does alone with the
shards a second rank would leave it (e.g. the uneven-shard offload round trip) is measured without a second device.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Iterable
from pathlib import Path

from ..base import DeviceBackend
from ..errors import AccelBackendError
from ..names import did_you_mean
from ..registry import CONFORMANCE_GROUP, registry, safe_reason
from ..spawn import LocalJob
from . import card_context
from .kit import BackendRef, resolve
from .rules import RuleSkipped

DEFAULT_TIMEOUT_S = 600.0
GROUP_TIMEOUT_S = 300.0


@dataclasses.dataclass(frozen=True)
class Measurement:
    """What one rank measured: ``figure`` (``None`` for a property without a number), its ``unit``, whether the
    property holds on this rank, and a short ``detail``."""

    figure: float | None
    unit: str
    holds: bool
    detail: str = ""


@dataclasses.dataclass(frozen=True)
class Property:
    """One line of the card: ``check(backend, nproc)`` runs in every rank of the job and returns a ``Measurement``
    (raises ``RuleSkipped`` when it does not apply here). ``bound`` says in words what the figure must be."""

    name: str
    summary: str
    bound: str
    check: Callable[[DeviceBackend, int], Measurement]
    bf16_bound: str | None = None  # the bound in bf16 where it differs from ``bound``
    fake_rank_check: Callable[[DeviceBackend, int], Measurement] | None = None  # rank 1 of 2 on a fake group
    kind: str = "trainer"  # "trainer", or "rollout": a property of the rollout card (certify NAME --rollout ENGINE)
    engines: tuple[str, ...] = ()  # a rollout property: the rollout engines it knows how to build

    def bound_in(self, precision: str) -> str:
        return self.bf16_bound if precision == "bf16" and self.bf16_bound else self.bound


@dataclasses.dataclass(frozen=True)
class Verdict:
    name: str
    summary: str
    bound: str
    status: str  # "holds", "fails" or "not applicable"
    figure: float | None = None
    unit: str = ""
    detail: str = ""


def all_properties() -> tuple[Property, ...]:
    """Every property the plugins registered (loading the conformance entry points first), in their order."""
    current = registry()
    current.load_group(CONFORMANCE_GROUP)
    found: list[Property] = []

    def register(prop: Property) -> None:
        if not isinstance(prop, Property):
            raise TypeError(f"register_certify_properties registered {prop!r}, not an accel_backends.testing."
                            "certify.Property")
        if prop.name in {p.name for p in found}:
            raise ValueError(f"certify property {prop.name!r} is registered twice")
        found.append(prop)

    current.plugin_manager.hook.register_certify_properties(register=register)
    return tuple(found)


def _measure(backend: DeviceBackend, prop: Property, nproc: int, precision: str = "fp32",
             check: Callable | None = None, name: str | None = None) -> Verdict:
    name, bound = name or prop.name, prop.bound_in(precision)
    try:
        got = (check or prop.check)(backend, nproc)
    except RuleSkipped as skip:
        return Verdict(name, prop.summary, bound, "not applicable", detail=str(skip))
    except Exception as exc:  # noqa: BLE001 - a property that raises does not hold; say what raised
        return Verdict(name, prop.summary, bound, "fails", detail=f"{type(exc).__name__}: {exc}")
    return Verdict(name, prop.summary, bound, "holds" if got.holds else "fails", got.figure, got.unit, got.detail)


def _rank_job(backend_ref: BackendRef, names: tuple[str, ...], nproc: int, precision: str = "fp32",
              rollout: str | None = None) -> list[Verdict]:
    import torch

    backend = resolve(backend_ref)
    if backend.device_type == "cpu":
        torch.set_num_threads(1)  # the ranks share the host's cores
    backend.init_distributed(timeout=GROUP_TIMEOUT_S)
    chosen = {p.name: p for p in all_properties()}
    with card_context.precision(precision), card_context.rollout_engine(rollout):
        return [_measure(backend, chosen[name], nproc, precision) for name in names]


FAKE_RANK, FAKE_WORLD = 1, 2


def fake_rank_name(name: str) -> str:
    return f"{name} (rank {FAKE_RANK} of {FAKE_WORLD}, fake group)"


def _fake_rank_job(backend_ref: BackendRef, names: tuple[str, ...], precision: str) -> list[Verdict]:
    """The ``fake_rank_check`` of each property, as rank 1 of 2 on torch's fake process group, on this process's
    one device (its own process: a fake group must not meet a real one)."""
    import torch

    backend = card_context.join_fake_group(resolve(backend_ref), FAKE_RANK, FAKE_WORLD)
    if backend.device_type == "cpu":
        torch.set_num_threads(1)
    chosen = {p.name: p for p in all_properties()}
    with card_context.precision(precision):
        return [_measure(backend, chosen[n], FAKE_WORLD, precision, chosen[n].fake_rank_check, fake_rank_name(n))
                for n in names]


def _merge(per_rank: list[Verdict]) -> Verdict:
    """Fails where any rank failed (its detail), else the rank with the worst figure (the last of equals: it holds
    the shortest shards)."""
    failed = [(rank, v) for rank, v in enumerate(per_rank) if v.status == "fails"]
    if failed:
        rank, verdict = failed[0]
        return dataclasses.replace(verdict, detail=f"rank {rank}: {verdict.detail}")
    return max(reversed(per_rank), key=lambda v: -math.inf if v.figure is None else v.figure)


def run_card(backend: BackendRef, nproc: int = 2, names: Iterable[str] | None = None,
             timeout: float = DEFAULT_TIMEOUT_S, precision: str = "fp32", rollout: str | None = None) -> list[Verdict]:
    """The card's verdicts for ``backend`` (a registered name, or an instance importable in the ranks); with one
    process, followed by the fake-group verdicts (``fake_rank_name``) of the chosen properties that have them.
    ``rollout``: the rollout card of that engine (the ``rollout`` properties) instead of the trainer's."""
    if precision not in card_context.PRECISIONS:
        raise CardCannotRun(f"precision {precision!r}: choose from {', '.join(card_context.PRECISIONS)}")
    properties = card_properties(rollout)
    chosen = tuple(p.name for p in properties) if names is None else tuple(names)
    unknown = [n for n in chosen if n not in {p.name for p in properties}]
    if unknown:
        raise CardCannotRun(f"no certify property {unknown[0]!r}; the properties are "
                       f"{', '.join(p.name for p in properties) or 'none (no plugin registered any)'}")
    instance = resolve(backend)
    by_name = {p.name: p for p in properties}
    verdicts = _job(_rank_job, (backend, chosen, nproc, precision, rollout), nproc, timeout, instance.name,
                    [(n, by_name[n]) for n in chosen], precision)
    faked = tuple(n for n in chosen if by_name[n].fake_rank_check is not None) if nproc == 1 else ()
    if faked:
        verdicts += _job(_fake_rank_job, (backend, faked, precision), 1, timeout, instance.name,
                         [(fake_rank_name(n), by_name[n]) for n in faked], precision)
    return verdicts


def card_properties(rollout: str | None = None) -> tuple[Property, ...]:
    """The trainer card's properties, or with ``rollout`` (an engine's name) the rollout card's; an engine no
    rollout property knows is refused with the ones they do."""
    kind = "rollout" if rollout else "trainer"
    chosen = tuple(p for p in all_properties() if p.kind == kind)
    known = sorted({engine for p in chosen for engine in p.engines})
    if rollout and rollout not in known:
        choices = ", ".join(known) or ("none (no plugin registered a rollout property: install the project, or in a "
                                       "checkout set ACCEL_BACKENDS_PLUGINS=engine.conformance,engine.rl."
                                       "certify_rollout)")
        raise CardCannotRun(f"unknown rollout engine {rollout!r}{did_you_mean(rollout, known, '--rollout ')}: the "
                            f"rollout card knows {choices}")
    return chosen


def _job(fn, args, nproc: int, timeout: float, where: str, named: list, precision: str) -> list[Verdict]:
    """Run ``fn`` in ``nproc`` processes and merge its per-rank verdicts (all failing, with why, if a rank broke)."""
    with LocalJob(fn, args, nproc) as job:
        ended = job.wait(timeout=timeout, stop_on_failure=False)
    broken = [o for o in job.outcomes if not o.returned]
    if broken:
        why = "; ".join(f"rank {o.rank}: " + (o.error or ("did not finish within "
                        f"{timeout:.0f} s" if ended == "timeout" else f"exit code {o.exitcode}")) for o in broken)
        return [Verdict(name, prop.summary, prop.bound_in(precision), "fails", detail=f"the {nproc}-process job "
                        f"on '{where}' failed: {why}") for name, prop in named]
    per_rank = [o.result for o in job.outcomes]
    return [_merge([ranks[i] for ranks in per_rank]) for i in range(len(named))]


def _figure(verdict: Verdict) -> str:
    if verdict.figure is None:
        return "-"
    value = verdict.figure
    text = f"{value:.3g}" if value and (abs(value) < 1e-3 or abs(value) >= 1e4) else f"{value:g}"
    return f"{text} {verdict.unit}".strip()


def markdown(backend: DeviceBackend, nproc: int, verdicts: list[Verdict], precision: str = "fp32",
             rollout: str | None = None) -> str:
    """The card as a Markdown table, with the environment it ran in and the count of each verdict."""
    describe = {k: v for k, v in backend.describe().items() if isinstance(v, (str, int, float))}
    what = f"the rollout engine `{rollout}`" if rollout else "on-policy RL"
    lines = [f"### Report card: {what} on backend `{backend.name}` ({nproc} processes, {precision})", "",
             "environment: " + ", ".join(f"{k} {v}" for k, v in describe.items()), "",
             "| property | what RL depends on | figure | bound | verdict |", "|---|---|---|---|---|"]
    for v in verdicts:
        verdict = v.status if not v.detail or v.status == "holds" else f"{v.status}: {v.detail}"
        cells = (v.name, v.summary, _figure(v), v.bound, verdict)
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    counts = {s: sum(v.status == s for v in verdicts) for s in ("holds", "fails", "not applicable")}
    lines += ["", f"{counts['holds']} hold, {counts['fails']} fail, {counts['not applicable']} not applicable"]
    return "\n".join(lines)


def as_json(backend: DeviceBackend, nproc: int, verdicts: list[Verdict], precision: str = "fp32",
            rollout: str | None = None) -> dict:
    return {"backend": backend.name, "nproc": nproc, "precision": precision, "rollout": rollout,
            "environment": backend.describe(),
            "properties": [dataclasses.asdict(v) for v in verdicts],
            "all_hold": all(v.status != "fails" for v in verdicts) and any(v.status == "holds" for v in verdicts)}


class CardCannotRun(AccelBackendError):
    """The card cannot be made here (the backend is unavailable, too few devices, no property registered)."""


def main(args) -> int:
    """``accel-backends certify``: print the card, write its JSON, exit 0 only when every applicable property
    holds (1 when one fails; ``CardCannotRun``, exit 2, when the card cannot run)."""
    backend = registry().get(args.name).backend
    reason = safe_reason(backend)
    if reason is not None:
        raise CardCannotRun(f"backend '{backend.name}' is not available here: {reason}")
    if backend.device_type != "cpu" and backend.device_count() < args.nproc:
        raise CardCannotRun(f"the card needs {args.nproc} devices, {backend.device_count()} visible: run with "
                            f"--nproc {backend.device_count()}")
    if not all_properties():
        raise CardCannotRun("no certify property is registered: install the project (its accel_backends."
                            "conformance entry point) or set ACCEL_BACKENDS_PLUGINS=engine.conformance")
    precision, rollout = getattr(args, "precision", "fp32"), getattr(args, "rollout", None)
    card_properties(rollout)  # an unknown engine is refused before any process starts
    verdicts = run_card(args.name, nproc=args.nproc, timeout=args.timeout, precision=precision, rollout=rollout)
    print(markdown(backend, args.nproc, verdicts, precision, rollout), flush=True)
    doc = as_json(backend, args.nproc, verdicts, precision, rollout)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(doc, indent=2))
        print(f"card written to {args.json}")
    return 0 if doc["all_hold"] else 1
