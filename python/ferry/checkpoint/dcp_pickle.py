"""Reading DCP's .metadata, which is a pickle (as torch's FileSystemReader reads it).

Unpickling runs whatever code the file names: a checkpoint directory from someone else can
execute code on load. FerryReader(safe=True) reads .metadata with a restricted unpickler
(in the spirit of torch.load(weights_only=True)) that builds only DCP's own metadata types
-- Metadata, MetadataIndex, TensorStorageMetadata, ChunkStorageMetadata, TensorProperties,
BytesStorageMetadata, StorageMeta, torch's _StorageInfo, ferry's FerryStorageInfo --
torch.Size, dtypes, layouts, memory formats and plain containers; any other global is
refused with a FerryError naming it."""
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
}


class _SafeUnpickler(pickle.Unpickler):
    def __init__(self, f, path):
        super().__init__(f)
        self.path = path

    def find_class(self, module, name):
        if name in _MODULES.get(module, ()):
            return super().find_class(module, name)
        if module == "torch":
            obj = getattr(torch, name, None)
            if isinstance(obj, (torch.dtype, torch.layout, torch.memory_format)):
                return obj
        if module == "collections" and name == "OrderedDict":
            return collections.OrderedDict
        _io.fail("%s: DCP metadata names %s.%s, which FerryReader(safe=True) does not "
                 "build (only DCP's metadata types); open a directory you trust with "
                 "safe=False" % (self.path, module, name), _io.EFORMAT)


def load(f, path, safe):
    if not safe:
        return pickle.load(f)
    return _SafeUnpickler(f, path).load()
