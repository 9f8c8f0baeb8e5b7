"""Registry and selection rules, in-process, with backends registered by test plugins."""

import warnings

import pytest

import accel_backends
from accel_backends import (
    BackendNotFoundError,
    BackendRegistrationError,
    BackendUnavailableError,
    DeviceBackend,
    hookimpl,
)
from accel_backends.backends.cpu import CPUBackend
from accel_backends.backends.npu import NPUBackend
from accel_backends.registry import BUILTIN_LABEL, PluginLoadWarning, Registry


class FakeBackend(CPUBackend):
    """A host-run backend whose availability and priority the test sets."""

    def __init__(self, name, priority, reason=None):
        super().__init__()
        self.name, self.priority, self._reason = name, priority, reason

    def unavailable_reason(self):
        return self._reason


class Provides:
    """A plugin object that registers the given backends."""

    def __init__(self, *backends, replace=False):
        self.backends, self.replace = backends, replace

    @hookimpl
    def register_backends(self, register):
        for backend in self.backends:
            register(backend, replace=self.replace) if self.replace else register(backend)


def registry_with(*plugins):
    reg = Registry(autoload=False)
    for i, plugin in enumerate(plugins):
        reg.register_plugin(plugin, name=f"test-plugin-{i}")
    return reg


def test_builtins_are_registered_through_the_hook():
    infos = {i.name: i for i in accel_backends.list_backends()}
    assert {"cpu", "cuda", "npu"} <= set(infos)
    assert all(infos[n].plugin == BUILTIN_LABEL for n in ("cpu", "cuda", "npu"))
    assert infos["cpu"].available and infos["cpu"].dist_backend == "gloo"
    assert (infos["cuda"].dist_backend, infos["npu"].dist_backend) == ("nccl", "hccl")
    assert infos["npu"].visible_devices_env == "ASCEND_RT_VISIBLE_DEVICES"
    impls = Registry(autoload=False).plugin_manager.hook.register_backends.get_hookimpls()
    assert {impl.plugin_name for impl in impls} == {"builtin.cpu", "builtin.cuda", "builtin.npu"}


def test_default_is_the_best_available_backend():
    ranked = [i for i in accel_backends.list_backends() if i.available]
    best = max(ranked, key=lambda i: i.priority)
    assert accel_backends.get_backend().name == best.name
    if not any(i.available for i in accel_backends.list_backends() if i.name != "cpu"):
        assert accel_backends.get_backend().name == "cpu"


def test_priority_picks_highest_available_and_skips_unavailable():
    reg = registry_with(
        Provides(FakeBackend("fast", 500, reason="no fast device here"), FakeBackend("medium", 200))
    )
    assert reg.select().name == "medium"
    assert reg.select("cpu").name == "cpu"


def test_environment_variable_selects(monkeypatch):
    reg = registry_with(Provides(FakeBackend("medium", 200)))
    monkeypatch.setenv("ACCEL_BACKEND", "cpu")
    assert reg.select().name == "cpu"
    monkeypatch.setenv("ACCEL_BACKEND", " CPU ")
    assert reg.select().name == "cpu"
    monkeypatch.setenv("ACCEL_BACKEND", "auto")
    assert reg.select().name == "medium"
    monkeypatch.setenv("ACCEL_BACKEND", "medium")
    assert reg.select("cpu").name == "cpu", "an explicit name wins over the environment"


def test_process_wide_selection_follows_environment(monkeypatch):
    monkeypatch.setenv("ACCEL_BACKEND", "cpu")
    backend = accel_backends.get_backend()
    assert isinstance(backend, CPUBackend) and backend.name == "cpu"
    assert accel_backends.get_backend() is backend, "backends are registered once and shared"


def test_unknown_name_lists_registered_backends(monkeypatch):
    monkeypatch.setenv("ACCEL_BACKEND", "tpu9000")
    with pytest.raises(BackendNotFoundError) as err:
        accel_backends.get_backend()
    message = str(err.value)
    assert "tpu9000" in message and "cpu" in message and "npu" in message


@pytest.mark.skipif(NPUBackend().is_available(), reason="an NPU is usable here")
def test_unavailable_backend_gives_its_reason(monkeypatch):
    monkeypatch.setenv("ACCEL_BACKEND", "npu")
    with pytest.raises(BackendUnavailableError) as err:
        accel_backends.get_backend()
    assert "torch_npu" in str(err.value) and "ACCEL_BACKEND" in str(err.value)


def test_unavailable_reason_reaches_the_user_verbatim():
    reg = registry_with(Provides(FakeBackend("gone", 5, reason="driver 1.2.3 is too old: upgrade it")))
    with pytest.raises(BackendUnavailableError, match="driver 1.2.3 is too old: upgrade it"):
        reg.select("gone")


def test_registering_something_that_is_not_a_backend_names_the_plugin():
    reg = Registry(autoload=False)
    reg.register_plugin(Provides(object()), name="odd", label="odd-dist 1.0")
    with pytest.raises(BackendRegistrationError, match="odd-dist 1.0.*not a DeviceBackend"):
        reg.records()


def test_backend_without_name_is_rejected():
    reg = Registry(autoload=False)
    reg.register_plugin(Provides(DeviceBackend()), name="nameless", label="nameless-dist 1.0")
    with pytest.raises(BackendRegistrationError, match="nameless-dist 1.0.*without a name"):
        reg.records()


def test_duplicate_names_name_both_plugins():
    reg = Registry(autoload=False)
    reg.register_plugin(Provides(FakeBackend("twin", 1)), name="a", label="first-dist 1.0")
    reg.register_plugin(Provides(FakeBackend("twin", 1)), name="b", label="second-dist 2.0")
    with pytest.raises(BackendRegistrationError) as err:
        reg.records()
    assert "first-dist 1.0" in str(err.value) and "second-dist 2.0" in str(err.value)


def test_clash_with_a_builtin_is_an_error_unless_replacing_explicitly():
    reg = Registry(autoload=False)
    reg.register_plugin(Provides(FakeBackend("cpu", 0)), name="shadow", label="shadow-dist 1.0")
    with pytest.raises(BackendRegistrationError, match=r"accel-backends \(built-in\).*shadow-dist 1.0"):
        reg.records()

    reg = Registry(autoload=False)
    replacement = FakeBackend("cpu", 0)
    reg.register_plugin(Provides(replacement, replace=True), name="better", label="better-cpu 1.0")
    assert reg.select("cpu") is replacement
    row = next(i for i in reg.infos() if i.name == "cpu")
    assert (row.plugin, row.replaced) == ("better-cpu 1.0", BUILTIN_LABEL)


def test_replace_cannot_override_another_third_party_plugin():
    reg = Registry(autoload=False)
    reg.register_plugin(Provides(FakeBackend("vendor", 1)), name="a", label="vendor-a 1.0")
    reg.register_plugin(Provides(FakeBackend("vendor", 1), replace=True), name="b", label="vendor-b 1.0")
    with pytest.raises(BackendRegistrationError, match="vendor-a 1.0.*vendor-b 1.0"):
        reg.records()


def test_plugin_whose_hook_raises_is_skipped_with_a_warning():
    class Broken:
        @hookimpl
        def register_backends(self, register):
            raise RuntimeError("vendor runtime missing")

    reg = Registry(autoload=False)
    reg.register_plugin(Broken(), name="broken", label="broken-dist 0.1")
    with pytest.warns(PluginLoadWarning, match="broken.*vendor runtime missing"):
        assert reg.select().name in {i.name for i in reg.infos()}
    assert [f.plugin for f in reg.failures] == ["broken"]
    assert reg.select("cpu").name == "cpu"


def test_misspelled_hook_is_refused_at_registration():
    class Typo:
        @hookimpl
        def register_backend(self, register):  # missing "s"
            pass

    with pytest.raises(Exception, match="register_backend"):
        Registry(autoload=False).register_plugin(Typo(), name="typo")


def test_no_warning_for_a_clean_registry():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        accel_backends.list_backends()


def test_a_probe_that_raises_makes_the_backend_unavailable_not_the_registry():
    class Faulty(FakeBackend):
        def unavailable_reason(self):
            raise OSError("driver exploded")

    reg = registry_with(Provides(Faulty("faulty", 999)))
    assert reg.select().name == "cpu"
    row = next(i for i in reg.infos() if i.name == "faulty")
    assert not row.available and "driver exploded" in row.reason
    with pytest.raises(BackendUnavailableError, match="driver exploded"):
        reg.select("faulty")
