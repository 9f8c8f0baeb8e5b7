"""The reader of a checkpoint's ``.metadata`` (engine/checkpoint/safe_reader.py, metadata_unpickler.py): real metadata
of FSDP checkpoints loads; planted pickles that would run a shell command (creating a marker file) are refused in one
line naming the file, and nothing runs."""

import pickle
import shutil
from pathlib import Path

import pytest
from planted_pickles import call as _call
from planted_pickles import global_of as _global
from planted_pickles import shell_payload
from planted_pickles import text as _text

REAL = Path(__file__).resolve().parent.parent / "data" / "checkpoint_v1" / "step_000002" / ".metadata"


def _payloads(marker: Path) -> dict[str, bytes]:
    shell = f"touch {marker}"
    return {
        # The 160-byte file: a callable reached through a module under the old allowed prefix.
        "os.system through an allowed module": shell_payload(marker),
        "builtins.getattr": pickle.PROTO + b"\x04" + _global("builtins", "getattr") + _global("os", "system")
        + pickle.TUPLE1 + pickle.REDUCE + pickle.STOP,
        "a function of an allowed module": _call("torch.distributed.checkpoint.state_dict_loader", "load", shell),
        "a text GLOBAL (protocol 0)": b"cos\nsystem\n(" + b"V" + shell.encode() + b"\ntR.",
        "a dotted name under an allowed class": _call("torch.distributed.checkpoint.metadata",
                                                      "Metadata.__init__.__globals__.os.system", shell),
        "torch.load under torch": _call("torch", "load", str(marker)),
        "subprocess": _call("subprocess", "getoutput", shell),
    }


def _read(directory: Path):
    from engine.checkpoint.safe_reader import SafeReader

    return SafeReader(directory).read_metadata()


def test_the_metadata_of_real_checkpoints_loads_as_pickle_would(tmp_path):
    from torch.distributed.checkpoint.metadata import Metadata

    shutil.copy(REAL, tmp_path / ".metadata")
    metadata, expected = _read(tmp_path), pickle.loads(REAL.read_bytes())
    assert type(metadata) is Metadata and len(metadata.state_dict_metadata) == 121
    assert metadata.state_dict_metadata == expected.state_dict_metadata
    assert metadata.storage_data == expected.storage_data


@pytest.mark.parametrize("kind", list(_payloads(Path("m"))))
def test_a_planted_metadata_runs_nothing_and_is_refused_in_one_line(tmp_path, kind):
    marker = tmp_path / "marker"
    (tmp_path / ".metadata").write_bytes(_payloads(marker)[kind])
    with pytest.raises(BaseException) as caught:  # noqa: PT011 - the kind is checked below, after the marker
        _read(tmp_path)
    assert not marker.exists(), f"{kind}: the planted pickle ran its shell command"
    from engine.checkpoint import UnsafeCheckpoint
    from engine.runtime import OneLineError

    assert isinstance(caught.value, UnsafeCheckpoint) and isinstance(caught.value, OneLineError), caught.value
    line = str(caught.value)
    assert "\n" not in line and line.startswith(f"{tmp_path / '.metadata'} was refused: it asks to load "), line
    assert "nothing in it was run" in line and "delete it" in line, line


def test_build_and_newobj_make_only_metadata_instances(tmp_path):
    """BUILD on an allowed class itself (setting a class attribute) and NEWOBJ of a dtype are refused."""
    from torch.distributed.checkpoint.metadata import TensorProperties

    from engine.checkpoint import UnsafeCheckpoint

    set_class_attr = (pickle.PROTO + b"\x04" + _global("torch.distributed.checkpoint.metadata", "TensorProperties")
                      + pickle.NONE + pickle.EMPTY_DICT + _text("planted") + _text("yes") + pickle.SETITEM
                      + pickle.TUPLE2 + pickle.BUILD + pickle.STOP)
    size_as_object = (pickle.PROTO + b"\x04" + _global("torch", "Size") + pickle.EMPTY_TUPLE + pickle.NEWOBJ
                      + pickle.STOP)
    layout_lookup = _call("torch.serialization", "_get_layout", "__class__")
    for payload in (set_class_attr, size_as_object, layout_lookup):
        (tmp_path / ".metadata").write_bytes(payload)
        with pytest.raises(UnsafeCheckpoint, match="was refused"):
            _read(tmp_path)
    assert not hasattr(TensorProperties, "planted")


def test_a_damaged_metadata_is_corrupt_not_refused(tmp_path):
    from engine.checkpoint import CorruptCheckpoint

    (tmp_path / ".metadata").write_bytes(REAL.read_bytes()[:200])
    with pytest.raises(CorruptCheckpoint, match=r"\.metadata is damaged"):
        _read(tmp_path)
    (tmp_path / ".metadata").write_bytes(pickle.dumps({"a": 1}))
    from engine.checkpoint import UnsafeCheckpoint

    with pytest.raises(UnsafeCheckpoint, match="a dict where the checkpoint's Metadata belongs"):
        _read(tmp_path)


def test_a_resume_stops_at_a_planted_checkpoint_instead_of_falling_back(tmp_path, monkeypatch):
    """The per-rank check before any load (``load_latest``) refuses the newest checkpoint's planted ``.metadata``:
    nothing runs, nothing loads, no fallback to the older checkpoint hides it."""
    import json
    from types import SimpleNamespace

    from engine import checkpoint
    from engine.checkpoint import run_checkpoints

    marker = tmp_path / "marker"
    for step in (1, 2):
        directory = tmp_path / f"step_{step:06d}"
        directory.mkdir()
        shutil.copy(REAL, directory / ".metadata")
        meta = {"format": checkpoint.FORMAT, "step": step, "skipped_steps": 0, "world_size": 1, "files": {}}
        (directory / checkpoint.META_FILE).write_text(json.dumps(meta))
    (tmp_path / "step_000002" / ".metadata").write_bytes(shell_payload(marker))
    loaded = []
    monkeypatch.setattr(run_checkpoints, "load_engines", lambda engines, path, *a: loaded.append(path))
    with pytest.raises(checkpoint.UnsafeCheckpoint, match=r"step_000002/\.metadata was refused"):
        checkpoint.load_latest({"policy": SimpleNamespace(rank=0, world_size=1)}, tmp_path)
    assert not marker.exists() and loaded == []
    with pytest.raises(checkpoint.UnsafeCheckpoint, match=r"step_000002/\.metadata was refused"):
        checkpoint.refuse_unsafe(tmp_path / "step_000002")  # the launcher's check, before any worker
    assert not marker.exists()
