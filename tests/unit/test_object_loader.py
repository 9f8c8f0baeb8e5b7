"""engine/object_loader.py: the one ``module:attribute`` loader; every failure is one line in one style (key,
value, what went wrong; what to do), raised as the caller's error type."""

import pytest

from engine.object_loader import ObjectLoadError, load_object
from engine.rollout.multi_turn.tools import ToolError


def test_loads_what_the_name_points_to():
    assert load_object("engine.object_loader:load_object", what="function", key="data.reward") is load_object


@pytest.mark.parametrize("spec, accept, message", [
    ("no_colon", None, "data.reward 'no_colon': must look like 'package.module:function'; name the module, a colon, "
                       "then the function"),
    ("no_such_module_here:f", None, "data.reward 'no_such_module_here:f': cannot import module "
                                    "'no_such_module_here' (ModuleNotFoundError: No module named "
                                    "'no_such_module_here'); is it on PYTHONPATH, and does it import by itself?"),
    ("engine.object_loader:missing", None, "data.reward 'engine.object_loader:missing': module "
                                           "'engine.object_loader' has no function 'missing'; check the function's "
                                           "name"),
    ("engine.object_loader:ObjectLoadError", lambda found: not isinstance(found, type),
     "data.reward 'engine.object_loader:ObjectLoadError': 'ObjectLoadError' in module 'engine.object_loader' is "
     "not a function; name a function"),
])
def test_each_failure_is_one_line_naming_key_value_and_fix(spec, accept, message):
    with pytest.raises(ObjectLoadError) as caught:
        load_object(spec, what="function", key="data.reward", accept=accept)
    assert str(caught.value) == message and isinstance(caught.value, ValueError)


def test_a_module_that_raises_on_import_is_reported_with_its_error(tmp_path, monkeypatch):
    (tmp_path / "broken_tools_module.py").write_text("raise RuntimeError('needs a GPU')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ToolError, match=r"^rollout.tools 'broken_tools_module:f': cannot import module "
                                        r"'broken_tools_module' \(RuntimeError: needs a GPU\); install it first$"):
        load_object("broken_tools_module:f", what="function", key="rollout.tools", error=ToolError,
                    when_unimportable="install it first")
