"""DCP's ``.metadata`` file read as data: an unpickler that knows exactly the names checkpoint metadata holds.

A checkpoint is a file users download and share; DCP writes its metadata with ``pickle``, and a pickle can name any
callable (``os.system`` reached as ``<allowed module>.os.system``, ``builtins.getattr``). So every global is looked
up in an exact allow-list of ``(module, name)`` pairs (found by listing the globals of real FSDP1/FSDP2/LoRA/
mixed-precision checkpoints with their optimizer state), each is checked to be what it claims (a DCP dataclass, an
enum, ``torch.Size``, a dtype), and the opcodes that call or mutate objects are narrowed: REDUCE calls only the few
constructors of plain values below, with plain arguments; NEWOBJ makes only DCP's dataclasses; BUILD fills only
instances of them; extension codes, persistent ids and INST/OBJ are refused. The pure-Python unpickler is used
because its opcodes can be narrowed (metadata is kilobytes: the cost does not matter).
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import pathlib
import pickle

import torch

DCP_METADATA = "torch.distributed.checkpoint.metadata"
# Every class DCP metadata holds (instances made by NEWOBJ, filled by BUILD).
_DATACLASSES = {(DCP_METADATA, name) for name in ("Metadata", "MetadataIndex", "StorageMeta", "TensorProperties",
                                                  "TensorStorageMetadata", "BytesStorageMetadata",
                                                  "ChunkStorageMetadata")}
_DATACLASSES.add(("torch.distributed.checkpoint.filesystem", "_StorageInfo"))
_ENUMS = {(DCP_METADATA, "_MEM_FORMAT_ENCODING")}  # TensorProperties' memory format, by value
_DTYPES = {name for name, value in vars(torch).items() if isinstance(value, torch.dtype)}
_LAYOUTS = {str(value): value for value in vars(torch).values() if isinstance(value, torch.layout)}
_PLAIN = (str, bytes, int, float, bool, type(None))


class Refused(pickle.UnpicklingError):
    """The pickle asks for something checkpoint metadata never holds; ``what`` names it."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


def _layout_named(name):
    """Stands in for ``torch.serialization._get_layout``: a layout by its name, and nothing else."""
    if not isinstance(name, str) or name not in _LAYOUTS:
        raise Refused(f"torch.serialization._get_layout({name!r})")
    return _LAYOUTS[name]


def _pure_path(kind):
    """Stands in for ``pathlib.PosixPath``/``WindowsPath`` (the checkpoint id DCP records): a pure path of strings,
    which cannot touch the disk."""
    def make(*parts):
        if not all(isinstance(part, str) for part in parts):
            raise Refused(f"pathlib path of {parts!r}")
        return kind(*parts)
    return make


_PATHS = {("pathlib", "PosixPath"): _pure_path(pathlib.PurePosixPath),
          ("pathlib", "WindowsPath"): _pure_path(pathlib.PureWindowsPath)}


def _checked_import(module: str, name: str):
    """``module.name`` (one attribute: never a dotted path), which must be defined there, under that name."""
    obj = getattr(importlib.import_module(module), name, None)
    if getattr(obj, "__module__", None) != module or getattr(obj, "__qualname__", None) != name:
        raise Refused(f"{module}.{name} (not the class it claims to be)")
    return obj


def _plain(value) -> bool:
    if isinstance(value, (tuple, list)):
        return all(_plain(item) for item in value)
    return isinstance(value, _PLAIN)


class MetadataUnpickler(pickle._Unpickler):  # noqa: SLF001 - the Python unpickler: its opcodes can be narrowed
    """Loads DCP checkpoint metadata; anything else raises ``Refused``."""

    dispatch = dict(pickle._Unpickler.dispatch)  # noqa: SLF001

    def __init__(self, file) -> None:
        super().__init__(file)
        self._constructors: set = set()  # what REDUCE may call: the constructors of plain values found so far
        self._classes: set = set()  # what NEWOBJ may make and BUILD may fill

    def find_class(self, module: str, name: str):
        pair = (module, name)
        if pair in _DATACLASSES:
            cls = _checked_import(module, name)
            if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
                raise Refused(f"{module}.{name} (not a dataclass)")
            self._classes.add(cls)
            return cls
        if pair in _ENUMS:
            cls = _checked_import(module, name)
            if not (isinstance(cls, type) and issubclass(cls, enum.Enum)):
                raise Refused(f"{module}.{name} (not an enum)")
            self._constructors.add(cls)
            return cls
        if pair == ("torch", "Size"):
            self._constructors.add(torch.Size)
            return torch.Size
        if module == "torch" and name in _DTYPES:
            dtype = getattr(torch, name)
            if not isinstance(dtype, torch.dtype):
                raise Refused(f"torch.{name} (not a dtype)")
            return dtype
        if pair == ("torch.serialization", "_get_layout"):
            self._constructors.add(_layout_named)
            return _layout_named
        if pair in _PATHS:
            self._constructors.add(_PATHS[pair])
            return _PATHS[pair]
        raise Refused(f"{module}.{name}")

    def persistent_load(self, pid):
        raise Refused("a persistent id (a tensor storage: metadata holds none)")

    def _reduce(self):
        args = self.stack.pop()
        func = self.stack[-1]
        if func not in self._constructors or not isinstance(args, tuple) or not _plain(args):
            raise Refused(f"a call of {getattr(func, '__qualname__', type(func).__name__)}")
        self.stack[-1] = func(*args)

    def _newobj(self):
        args = self.stack.pop()
        cls = self.stack.pop()
        if cls not in self._classes or not isinstance(args, tuple) or not _plain(args):
            raise Refused(f"an instance of {getattr(cls, '__qualname__', type(cls).__name__)}")
        self.append(cls.__new__(cls, *args))

    def _build(self):
        if type(self.stack[-2]) not in self._classes:  # an instance of a DCP class: never a class, a dtype, a path
            raise Refused(f"setting the state of {type(self.stack[-2]).__qualname__}")
        pickle._Unpickler.load_build(self)  # noqa: SLF001

    def _refuse(self):
        raise Refused("an object made by INST/OBJ/NEWOBJ_EX or an extension code")

    dispatch[pickle.REDUCE[0]] = _reduce
    dispatch[pickle.NEWOBJ[0]] = _newobj
    dispatch[pickle.BUILD[0]] = _build
    for _opcode in (pickle.INST, pickle.OBJ, pickle.NEWOBJ_EX, pickle.EXT1, pickle.EXT2, pickle.EXT4):
        dispatch[_opcode[0]] = _refuse
    del _opcode


def load_metadata(file):
    """The DCP ``Metadata`` pickled in the open binary ``file``; ``Refused`` for anything else."""
    metadata = MetadataUnpickler(file).load()
    metadata_class = importlib.import_module(DCP_METADATA).Metadata
    if type(metadata) is not metadata_class:
        raise Refused(f"a {type(metadata).__qualname__} where the checkpoint's Metadata belongs")
    return metadata
