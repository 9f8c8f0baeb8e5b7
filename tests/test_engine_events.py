"""The engine's observer hooks: specified by engine/, added to the device plugins' manager, free when unheard."""

import types

import pytest
from conftest import run_python

import accel_backends
from accel_backends import hookimpl
from engine import events


class Observer:
    """Implements all three events; ``on_transfer`` takes the newer ``seconds`` argument."""

    def __init__(self):
        self.seen = []

    @hookimpl
    def on_transfer(self, engine, what, destination, num_bytes, seconds):
        self.seen.append(("transfer", what, destination, num_bytes, seconds))

    @hookimpl
    def on_mode_switch(self, engine, mode, entering):
        self.seen.append(("mode", mode, entering))

    @hookimpl
    def on_optimizer_step(self, engine, step, metrics):
        self.seen.append(("step", step, metrics["grad_norm"]))


class OlderObserver:
    """Written before ``seconds`` existed: pluggy passes only the arguments it names."""

    def __init__(self):
        self.seen = []

    @hookimpl
    def on_transfer(self, engine, what, destination, num_bytes):
        self.seen.append((what, num_bytes))


def test_events_reach_observers_old_and_new():
    new, old = Observer(), OlderObserver()
    accel_backends.register_plugin(new)
    accel_backends.register_plugin(old)
    events.transfer(None, "params", "cpu", 1024, seconds=0.5)
    events.transfer(None, "optimizer", "device", 8)
    events.mode_switch(None, "train", entering=True)
    events.optimizer_step(None, 3, {"grad_norm": 0.5})
    assert new.seen == [("transfer", "params", "cpu", 1024, 0.5), ("transfer", "optimizer", "device", 8, None),
                        ("mode", "train", True), ("step", 3, 0.5)]
    assert old.seen == [("params", 1024), ("optimizer", 8)]


def test_the_device_layer_specifies_no_engine_events():
    code = (
        "import sys, accel_backends\n"
        "hook = accel_backends.hook()\n"
        "print(sorted(n for n in vars(hook) if not n.startswith('_')), 'engine' in sys.modules)\n"
        "import engine\n"
        "print(accel_backends.hook().on_transfer.spec.argnames)\n"
    )
    before, after = run_python(code, check=True).stdout.splitlines()
    assert before == "['register_backends', 'register_certify_properties', 'register_conformance_rules'] False"
    assert after == "('engine', 'what', 'destination', 'num_bytes', 'seconds')"


def test_a_misspelled_engine_event_is_refused():
    class Listener:
        @hookimpl
        def on_tranfser(self, engine):  # misspelled: refused, not silently never called
            pass

    with pytest.raises(Exception, match="on_tranfser"):
        accel_backends.register_plugin(Listener())


class CountingRelay:
    """Stands in for ``accel_backends.hook()`` to count how often events look up the hook relay."""

    def __init__(self, relay):
        self.relay, self.lookups = relay, 0

    def __call__(self):
        self.lookups += 1
        return self.relay


def test_nobody_listening_costs_no_hook_call(monkeypatch):
    counting = CountingRelay(accel_backends.hook())
    monkeypatch.setattr(accel_backends, "hook", counting)
    called = []
    monkeypatch.setattr(type(counting.relay.on_transfer), "__call__", lambda *a, **k: called.append(a))
    for _ in range(1000):
        events.transfer(None, "params", "cpu", 1)
        events.mode_switch(None, "eval", entering=True)
        events.optimizer_step(None, 1, {})
    assert called == [] and counting.lookups <= 1, "no listener: no hook call, at most one lookup"

    monkeypatch.undo()  # a listener arrives: the cache notices at once, and again when it leaves
    observer = Observer()
    accel_backends.register_plugin(observer)
    events.mode_switch(None, "eval", entering=False)
    accel_backends.unregister_plugin(observer)
    events.mode_switch(None, "eval", entering=True)
    assert observer.seen == [("mode", "eval", False)]
    accel_backends.reset_registry()  # a rebuilt registry (new plugins installed) is looked at afresh
    observer = Observer()
    accel_backends.register_plugin(observer)
    events.optimizer_step(None, 2, {"grad_norm": 1.0})
    assert observer.seen == [("step", 2, 1.0)]


def test_an_observer_that_does_not_fit_the_engine_spec_is_dropped_with_a_warning(monkeypatch):
    from accel_backends import registry
    from accel_backends.registry import PluginLoadWarning, Registry

    class Misfit:
        @accel_backends.hookimpl(optionalhook=True)
        def on_late_event(self, engine, wrong_argument):
            pass

    late_specs = types.ModuleType("late_specs")
    exec("from accel_backends import hookspec\n@hookspec\ndef on_late_event(engine):\n    '''A later layer.'''\n",
         vars(late_specs))
    reg = Registry(autoload=False)
    reg.register_plugin(Misfit(), name="misfit", label="misfit-dist 1.0")  # optional: accepted before the spec
    monkeypatch.setattr(registry, "_extra_hookspecs", [*registry._extra_hookspecs, late_specs])
    with pytest.warns(PluginLoadWarning, match="misfit.*asks for wrong_argument"):
        reg._add_new_hookspecs()  # what importing the later layer does; must not raise
    assert "misfit" not in dict(reg.plugin_manager.list_name_plugin())
    assert [f.plugin for f in reg.failures] == ["misfit"]
