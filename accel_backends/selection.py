"""Backend selection: the backends the plugins registered (each checked as it is registered), and the one a job
uses: an explicit name, else ``ACCEL_BACKEND``, else the available backend with the highest priority.

``Registry`` (``registry.py``, the plugin host) inherits ``BackendSelection``: the host loads plugins and keeps
their failures; this module asks the loaded plugins' ``register_backends`` hooks, once, and picks among what they
registered. The names stay importable from ``accel_backends.registry`` (and ``accel_backends``).
"""

from __future__ import annotations

import dataclasses
import os

from .base import DeviceBackend
from .errors import BackendNotFoundError, BackendRegistrationError, BackendUnavailableError

BACKEND_ENV = "ACCEL_BACKEND"
AUTOLOAD_ENV = "ACCEL_BACKENDS_AUTOLOAD"  # named in messages here; read by the plugin host
BUILTIN_LABEL = "accel-backends (built-in)"


@dataclasses.dataclass(frozen=True)
class BackendRecord:
    backend: DeviceBackend
    plugin: str  # who registered it: BUILTIN_LABEL, "dist version", or the plugin's name
    replaced: str | None = None  # the plugin whose backend of the same name this one replaced


@dataclasses.dataclass(frozen=True)
class BackendInfo:
    """One row of ``list_backends()``."""

    name: str
    available: bool
    reason: str | None
    priority: int
    device_type: str
    device_count: int
    dist_backend: str
    plugin: str
    replaced: str | None
    visible_devices_env: str | None


class BackendSelection:
    """The backend half of ``Registry``: needs the host's ``plugin_manager``, ``_labels`` (plugin name -> who
    provided it), ``failures``, ``_records`` (``None``: collect again) and ``_record_failure``."""

    def records(self) -> dict[str, BackendRecord]:
        """Backends by name, collected once from every plugin's ``register_backends``."""
        if self._records is None:
            self._records = self._collect()
        return self._records

    def _collect(self) -> dict[str, BackendRecord]:
        records: dict[str, BackendRecord] = {}
        builtin_first = sorted(
            self.plugin_manager.hook.register_backends.get_hookimpls(),
            key=lambda impl: self._labels.get(impl.plugin_name) != BUILTIN_LABEL,
        )
        for impl in builtin_first:
            label = self._labels.get(impl.plugin_name, impl.plugin_name)

            def register(backend, replace=False, _label=label):
                add_record(records, backend, _label, replace)

            try:
                impl.function(register=register)
            except BackendRegistrationError:
                raise
            except Exception as exc:  # noqa: BLE001
                self._record_failure(impl.plugin_name, label, exc)
        return records

    def get(self, name: str) -> BackendRecord:
        records = self.records()
        wanted = name.strip().lower()
        for key, record in records.items():
            if key.lower() == wanted:
                return record
        raise BackendNotFoundError(
            f"unknown backend '{name}': registered backends are {', '.join(sorted(records))}."
            f"{self._failures_sentence()} Pick one of those, or install the plugin that provides '{name}'."
        )

    def _failures_sentence(self) -> str:
        if not self.failures:
            return ""
        failed = "; ".join(f"'{f.plugin}' ({f.distribution}): {f.error}" for f in self.failures)
        return f" Plugins that failed to load: {failed}."

    def select(self, name: str | None = None) -> DeviceBackend:
        requested = name if name is not None else os.environ.get(BACKEND_ENV, "")
        source = "" if name is not None else f" (from {BACKEND_ENV})"
        if requested.strip() and requested.strip().lower() != "auto":
            backend = self.get(requested).backend
            reason = safe_reason(backend)
            if reason is not None:
                raise BackendUnavailableError(f"backend '{backend.name}'{source} is not available here: {reason}")
            return backend
        ranked = sorted(self.records().values(), key=lambda r: (-r.backend.priority, r.backend.name))
        for record in ranked:
            if safe_reason(record.backend) is None:
                return record.backend
        reasons = "; ".join(f"{r.backend.name}: {safe_reason(r.backend)}" for r in ranked)
        raise BackendUnavailableError(f"no registered backend is available here ({reasons})")

    def infos(self) -> list[BackendInfo]:
        rows = []
        for name, record in sorted(self.records().items(), key=lambda kv: (-kv[1].backend.priority, kv[0])):
            backend = record.backend
            reason = safe_reason(backend)
            count = 0
            if reason is None:
                try:
                    count = backend.device_count()
                except Exception as exc:  # noqa: BLE001 - a faulty plugin must not break the listing
                    reason = f"device_count() failed: {type(exc).__name__}: {exc}"
            rows.append(
                BackendInfo(
                    name=name,
                    available=reason is None,
                    reason=reason,
                    priority=backend.priority,
                    device_type=backend.device_type,
                    device_count=count,
                    dist_backend=backend.dist_backend,
                    plugin=record.plugin,
                    replaced=record.replaced,
                    visible_devices_env=backend.visible_devices_env,
                )
            )
        return rows


def safe_reason(backend: DeviceBackend) -> str | None:
    """``unavailable_reason()``, with a plugin that raises (against the contract) reported, not propagated."""
    try:
        return backend.unavailable_reason()
    except Exception as exc:  # noqa: BLE001
        return f"its availability probe raised {type(exc).__name__}: {exc}"


def add_record(records: dict[str, BackendRecord], backend, label: str, replace: bool) -> None:
    if not isinstance(backend, DeviceBackend):
        raise BackendRegistrationError(
            f"plugin {label} registered {backend!r}, which is not a DeviceBackend: register an instance of a "
            "subclass of accel_backends.DeviceBackend"
        )
    if not backend.name or not backend.device_type:
        raise BackendRegistrationError(
            f"plugin {label} registered {type(backend).__name__} without a name or device_type: set both class "
            "attributes"
        )
    existing = records.get(backend.name)
    if existing is not None:
        if replace and existing.plugin == BUILTIN_LABEL:
            records[backend.name] = BackendRecord(backend, label, replaced=existing.plugin)
            return
        raise BackendRegistrationError(
            f"backend name '{backend.name}' is registered twice: by {existing.plugin} and by {label}. A plugin may "
            "replace a built-in backend only by calling register(backend, replace=True); otherwise uninstall one "
            f"of the two, or set {AUTOLOAD_ENV}=0 to load built-in backends only."
        )
    records[backend.name] = BackendRecord(backend, label)
