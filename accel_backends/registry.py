"""The plugin host: loads the plugins (built-in backends, entry points, named modules) into one pluggy manager, keeps
those that failed, and serves the process-wide registry; picking a backend among what they registered is
``selection.py``'s job.

Third-party entry points (group ``accel_backends``) load unless ``ACCEL_BACKENDS_AUTOLOAD=0``; one that fails to
import is skipped with a warning naming it, and ``accel-backends list`` shows it. Modules named in
``ACCEL_BACKENDS_PLUGINS`` (comma-separated, like ``PYTEST_PLUGINS``) load always: the way to add a plugin to a
checkout that is not installed (``PYTHONPATH=.``), and to every rank of a job, which inherits the variable.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import inspect
import os
import threading
import warnings

import pluggy

from . import hookspecs
from .backends import BUILTIN_PLUGIN_MODULES
from .base import DeviceBackend
from .selection import (  # noqa: F401  (public names, importable from here as before)
    AUTOLOAD_ENV,
    BACKEND_ENV,
    BUILTIN_LABEL,
    BackendInfo,
    BackendRecord,
    BackendSelection,
    safe_reason,
)

ENTRY_POINT_GROUP = "accel_backends"
CONFORMANCE_GROUP = "accel_backends.conformance"  # loaded only by the conformance kit (``load_group``)
PLUGINS_ENV = "ACCEL_BACKENDS_PLUGINS"


class PluginLoadWarning(UserWarning):
    """A third-party plugin could not be loaded; the other backends still work."""


@dataclasses.dataclass(frozen=True)
class PluginFailure:
    plugin: str  # entry-point name
    distribution: str | None  # "name version" of the distribution that declared it
    error: str


def autoload_enabled(environ=None) -> bool:
    value = (environ if environ is not None else os.environ).get(AUTOLOAD_ENV, "1")
    return value.strip().lower() not in ("0", "false", "no", "off")


class Registry(BackendSelection):
    """The plugin host: a pluggy ``PluginManager``, the plugins it loaded and those that failed; the backends they
    registered and the choice among them come from ``BackendSelection``."""

    def __init__(self, autoload: bool | None = None) -> None:
        self.plugin_manager = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self.plugin_manager.add_hookspecs(hookspecs)
        self._spec_modules: list = []
        self._add_new_hookspecs()
        self.failures: list[PluginFailure] = []
        self._labels: dict[str, str] = {}  # plugin name -> who provided it, for messages
        self._records: dict[str, BackendRecord] | None = None
        self.autoload = autoload_enabled() if autoload is None else autoload
        self._groups_loaded: set[str] = set()
        for module_name in BUILTIN_PLUGIN_MODULES:
            module = importlib.import_module(module_name)
            self.register_plugin(module, name="builtin." + module_name.rsplit(".", 1)[1], label=BUILTIN_LABEL)
        self._load_named_modules()
        self.load_group(ENTRY_POINT_GROUP)

    # -- plugins ------------------------------------------------------------------------------------------------

    def register_plugin(self, plugin, name: str | None = None, label: str | None = None) -> str:
        """Register a plugin object or module at run time (tests, observers); returns its plugin name."""
        self._add_new_hookspecs()  # an entry point's import may just have added some (engine/hookspecs.py)
        registered = self.plugin_manager.register(plugin, name=name)
        try:
            self.plugin_manager.check_pending()  # a misspelled hook name is an error, not a silent no-op
        except pluggy.PluginValidationError:
            self.plugin_manager.unregister(name=registered)
            raise
        self._labels[registered] = label or registered
        self._records = None
        _plugins_changed()
        return registered

    def unregister_plugin(self, plugin) -> None:
        self.plugin_manager.unregister(plugin)
        self._records = None
        _plugins_changed()

    def _add_new_hookspecs(self) -> None:
        for module in list(_extra_hookspecs):
            if module not in self._spec_modules:
                self._drop_plugins_that_do_not_fit(module)
                self.plugin_manager.add_hookspecs(module)
                self._spec_modules.append(module)

    def _drop_plugins_that_do_not_fit(self, module) -> None:
        """Unregister (with a warning) plugins whose optional hooks take arguments ``module``'s specs do not pass.

        Without this, pluggy would raise inside ``add_hookspecs``: one bad observer would make ``import engine``
        fail in every job.
        """
        for name in dir(module):
            caller = getattr(self.plugin_manager.hook, name, None)
            if caller is None or self.plugin_manager.parse_hookspec_opts(module, name) is None:
                continue
            passed = set(inspect.signature(getattr(module, name)).parameters)
            for impl in caller.get_hookimpls():
                unknown = sorted(set(impl.argnames) - passed)
                if unknown:
                    self.plugin_manager.unregister(name=impl.plugin_name)
                    label = self._labels.get(impl.plugin_name, impl.plugin_name)
                    self._record_failure(impl.plugin_name, label, TypeError(
                        f"its hook {name}() asks for {', '.join(unknown)}, which the hook does not pass "
                        f"(it passes {', '.join(sorted(passed))})"))

    def _load_named_modules(self) -> None:
        """The modules in ``ACCEL_BACKENDS_PLUGINS``, registered whatever ``ACCEL_BACKENDS_AUTOLOAD`` says."""
        for module_name in filter(None, (name.strip() for name in os.environ.get(PLUGINS_ENV, "").split(","))):
            try:
                module = importlib.import_module(module_name)
                if not self.plugin_manager.is_registered(module):
                    self.register_plugin(module, name=module_name, label=f"{module_name} (from {PLUGINS_ENV})")
            except Exception as exc:  # noqa: BLE001 - reported like a broken entry point
                self._record_failure(module_name, f"from {PLUGINS_ENV}", exc)

    def load_group(self, group: str) -> None:
        """Register the plugins of entry-point group ``group`` (once; nothing when autoload is off)."""
        if group in self._groups_loaded or not self.autoload:
            return
        self._groups_loaded.add(group)
        seen = set()
        for entry_point in importlib.metadata.entry_points(group=group):
            dist = getattr(entry_point, "dist", None)
            label = f"{dist.name} {dist.version}" if dist is not None else entry_point.value
            if (entry_point.name, label) in seen:
                continue  # the same distribution seen twice on sys.path
            seen.add((entry_point.name, label))
            name = entry_point.name if group == ENTRY_POINT_GROUP else f"{group}:{entry_point.name}"
            try:
                plugin = entry_point.load()
                if not self.plugin_manager.is_registered(plugin):  # also named in ACCEL_BACKENDS_PLUGINS
                    self.register_plugin(plugin, name=name, label=label)
            except Exception as exc:  # noqa: BLE001 - a broken plugin must not break the others
                self._record_failure(name, label, exc)

    def _record_failure(self, plugin: str, distribution: str | None, exc: BaseException) -> None:
        error = f"{type(exc).__name__}: {exc}"
        self.failures.append(PluginFailure(plugin=plugin, distribution=distribution, error=error))
        warnings.warn(
            f"accel_backends plugin '{plugin}' ({distribution}) failed to load and is skipped: {error}. "
            f"Fix or uninstall it, or set {AUTOLOAD_ENV}=0 to load built-in backends only.",
            PluginLoadWarning,
            stacklevel=3,
        )

_lock = threading.Lock()
_registry: Registry | None = None
_extra_hookspecs: list = []  # hook-spec modules of the layers above (the engine's events), in order added
_plugins_version = 0  # changes whenever the set of plugins (or hook specs) may have changed


def _plugins_changed() -> None:
    global _plugins_version
    _plugins_version += 1


def plugins_version() -> int:
    """A number that changes whenever plugins are added or removed or the registry is reset.

    Callers that cache per-hook lookups (``engine/events.py`` caches whether anybody listens) compare it to
    know when to look again.
    """
    return _plugins_version


def add_hookspecs(module) -> None:
    """Add a module of ``@accel_backends.hookspec`` functions to the plugin manager, now and after every reset.

    This is how the layers above specify their own hooks without this package knowing them: ``engine`` adds
    its observer events when it is imported. Plugins implementing those hooks must import that module first
    (or the registry refuses them as implementing an unknown hook). Adding the same module twice is a no-op.
    """
    if module in _extra_hookspecs:
        return
    _extra_hookspecs.append(module)
    current = _registry  # read without the lock: this runs while an entry point is imported under it
    if current is not None:
        current._add_new_hookspecs()
    _plugins_changed()


def registry() -> Registry:
    """The process-wide registry, built on first use."""
    global _registry
    with _lock:
        if _registry is None:
            _registry = Registry()
        return _registry


def reset_registry() -> None:
    """Forget the registry so the next call rebuilds it (after installing a plugin or changing the environment)."""
    global _registry
    with _lock:
        _registry = None
        _plugins_changed()


def get_backend(name: str | None = None) -> DeviceBackend:
    """The backend to use: ``name``, else ``$ACCEL_BACKEND``, else the best available one (CPU last)."""
    return registry().select(name)


def list_backends() -> list[BackendInfo]:
    """Every registered backend, whether it can run here and why not, best first."""
    return registry().infos()


def plugin_failures() -> list[PluginFailure]:
    """Third-party plugins that failed to load, with their errors."""
    registry().records()
    return list(registry().failures)


def register_plugin(plugin, name: str | None = None) -> str:
    """Add a plugin (an observer of the ``on_*`` events, or extra backends) to the process-wide registry."""
    return registry().register_plugin(plugin, name=name)


def unregister_plugin(plugin) -> None:
    registry().unregister_plugin(plugin)


def hook():
    """The plugin manager's hook relay (``hook().register_backends``, and the hooks other layers added)."""
    return registry().plugin_manager.hook
