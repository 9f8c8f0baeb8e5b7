"""A real third-party plugin: built and pip-installed into a temporary folder, found through its entry point."""

import json
import textwrap

import pytest
from conftest import run_python

pytestmark = pytest.mark.slow


@pytest.fixture
def site(plugin_site):
    """The example plugin and a plugin that raises on import, pip-installed (with the others) once per session."""
    return plugin_site


def test_list_shows_the_plugin_and_the_broken_one(site):
    result = run_python(["-m", "accel_backends", "list", "--json"], env={"PYTHONPATH": site}, check=True)
    doc = json.loads(result.stdout)
    rows = {row["name"]: row for row in doc["backends"]}
    assert rows["example"]["available"] and rows["example"]["plugin"] == "accel-example-backend 0.1.0"
    assert rows["cpu"]["available"], "a broken plugin must not take the others down"
    assert doc["selected"] == rows_best(rows)
    (failure,) = doc["failed_plugins"]
    assert failure["plugin"] == "broken" and failure["distribution"] == "accel-broken-backend 9.9"
    assert "libvendor.so" in failure["error"]


def rows_best(rows):
    available = [r for r in rows.values() if r["available"]]
    return max(available, key=lambda r: r["priority"])["name"]


def test_table_output_names_the_failed_plugin(site):
    result = run_python(["-m", "accel_backends", "list"], env={"PYTHONPATH": site}, check=True)
    assert "example" in result.stdout and "accel-example-backend 0.1.0" in result.stdout
    assert "plugins that failed to load:" in result.stdout and "libvendor.so" in result.stdout


def test_plugin_is_selectable_by_environment_variable(site):
    code = "import accel_backends; b = accel_backends.get_backend(); print(b.name, type(b).__module__)"
    result = run_python(code, env={"PYTHONPATH": site, "ACCEL_BACKEND": "example"}, check=True)
    assert result.stdout.split() == ["example", "accel_example_backend.plugin"]
    assert "PluginLoadWarning" in result.stderr and "'broken'" in result.stderr and "libvendor.so" in result.stderr


def test_autoload_switch_keeps_third_party_plugins_out(site):
    code = textwrap.dedent(
        """
        import accel_backends
        print(sorted(i.name for i in accel_backends.list_backends()))
        accel_backends.get_backend("example")
        """
    )
    result = run_python(code, env={"PYTHONPATH": site, "ACCEL_BACKENDS_AUTOLOAD": "0"})
    assert result.returncode != 0
    assert "['cpu', 'cuda', 'npu']" in result.stdout
    assert "BackendNotFoundError" in result.stderr and "unknown backend 'example'" in result.stderr
    assert "libvendor.so" not in result.stderr, "the broken plugin must not even be imported"


def test_cli_errors_are_one_clear_line():
    unknown = run_python(["-m", "accel_backends", "info"], env={"ACCEL_BACKEND": "nosuch"})
    assert unknown.returncode == 2 and "Traceback" not in unknown.stderr
    assert "unknown backend 'nosuch'" in unknown.stderr and "cpu" in unknown.stderr
