"""Reading DCP's .metadata, which is a pickle (as torch's FileSystemReader reads it).

Unpickling runs whatever code the file names: a checkpoint directory from someone else can
execute code on load. FerryReader reads .metadata by default (safe=True) with a restricted
unpickler (in the spirit of torch.load(weights_only=True)) that builds only DCP's own
metadata types -- Metadata, MetadataIndex, TensorStorageMetadata, ChunkStorageMetadata,
TensorProperties, BytesStorageMetadata, StorageMeta, torch's _StorageInfo, ferry's
FerryStorageInfo -- torch.Size, dtypes, paths (pathlib), layouts, memory formats and plain containers; any
other global is refused with a FerryError naming it.

Calling an allowed class is not enough to stay harmless: pickle's BUILD opcode sets
attributes on whatever object sits on the stack, and a class or function pushed by
GLOBAL is such an object (a crafted file replaced MetadataIndex.__repr__ that way, or
filled torch.serialization._get_layout.cache). Here BUILD applies only to instances this
unpickler made (by calling or instantiating an allowed class) whose type is one of the
metadata types, and only with plain attribute names; never to a class, a function, a
dtype or any other object found by name. That needs the pure-Python unpickler (the C one
cannot be told what BUILD may touch); .metadata is small, so the cost is small."""
from __future__ import annotations

import collections
import pickle

import torch

from . import io as _io

_MODULES = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata", "MetadataIndex", "TensorStorageMetadata", "ChunkStorageMetadata",
        "TensorProperties", "BytesStorageMetadata", "StorageMeta", "_MEM_FORMAT_ENCODING"},
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "ferry._ckpt_dcp": {"FerryStorageInfo"},
    "collections": {"OrderedDict"},
    "builtins": {"set", "frozenset", "complex", "slice"},
    "torch": {"Size"},
    "torch.serialization": {"_get_layout"},        # a layout by name (TensorProperties)
    "pathlib": {"PosixPath", "PurePosixPath"},     # StorageMeta.checkpoint_id (FileSystemWriter)
}

# the types whose instances BUILD may fill (their pickles carry a state)
_BUILD_TYPES = {
    "torch.distributed.checkpoint.metadata": _MODULES["torch.distributed.checkpoint.metadata"]
    - {"_MEM_FORMAT_ENCODING"},
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "ferry._ckpt_dcp": {"FerryStorageInfo"},
    "collections": {"OrderedDict"},
}

_BUILD, _REDUCE, _NEWOBJ, _NEWOBJ_EX, _INST, _OBJ = (
    op[0] for op in (pickle.BUILD, pickle.REDUCE, pickle.NEWOBJ, pickle.NEWOBJ_EX,
                     pickle.INST, pickle.OBJ))


def _made_by(op):
    """A dispatch entry that runs pickle's own handler for `op`, then remembers the
    object it left on the stack as made by this unpickler."""
    base = pickle._Unpickler.dispatch[op]

    def run(self):
        base(self)
        obj = self.stack[-1]
        self._made[id(obj)] = obj          # held: its id is not reused while loading
    return run


class _SafeUnpickler(pickle._Unpickler):
    dispatch = dict(pickle._Unpickler.dispatch)

    def __init__(self, f, path):
        super().__init__(f)
        self.path = path
        self._made = {}
        self._build_types = set()
        for module, names in _BUILD_TYPES.items():
            for name in names:
                try:
                    self._build_types.add(super().find_class(module, name))
                except (ImportError, AttributeError):
                    pass

    def _refuse(self, what):
        _io.fail("%s: DCP metadata %s, which FerryReader(safe=True) does not build (only "
                 "DCP's metadata types); open a directory you trust with safe=False"
                 % (self.path, what), _io.EFORMAT)

    def find_class(self, module, name):
        if name in _MODULES.get(module, ()):
            return super().find_class(module, name)
        if module == "torch":
            obj = getattr(torch, name, None)
            if isinstance(obj, (torch.dtype, torch.layout, torch.memory_format)):
                return obj
        if module == "collections" and name == "OrderedDict":
            return collections.OrderedDict
        self._refuse("names %s.%s" % (module, name))

    def load_build_safe(self):
        state = self.stack[-1]
        inst = self.stack[-2]
        if id(inst) not in self._made or type(inst) not in self._build_types:
            self._refuse("sets attributes on %s (BUILD on an object it did not make)"
                         % (type(inst).__name__ if not isinstance(inst, type) else
                            "the class " + inst.__name__))
        parts = state if isinstance(state, tuple) and len(state) == 2 else (state,)
        for part in parts:
            if part is None:
                continue
            if not isinstance(part, dict) and getattr(type(inst), "__setstate__", None) is None:
                self._refuse("gives %s a state of type %s" % (type(inst).__name__,
                                                              type(part).__name__))
            if isinstance(part, dict):
                for k in part:
                    if not isinstance(k, str) or k.startswith("__"):
                        self._refuse("sets attribute %r of %s" % (k, type(inst).__name__))
        pickle._Unpickler.load_build(self)

    dispatch[_BUILD] = load_build_safe
    for _op in (_REDUCE, _NEWOBJ, _NEWOBJ_EX, _INST, _OBJ):
        dispatch[_op] = _made_by(_op)
    del _op


def load(f, path, safe):
    if not safe:
        return pickle.load(f)
    return _SafeUnpickler(f, path).load()
