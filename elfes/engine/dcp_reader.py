"""DCP's file reader with its ``.metadata`` read safely: DCP unpickles that file with plain ``pickle``, which would
run whatever a planted pickle names; this reader builds DCP's own metadata classes and nothing else (the tensors DCP
loads with ``torch.load(weights_only=True)`` itself)."""

from __future__ import annotations

import enum
import pickle
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from .payload import CheckpointError


class SafeReader(FileSystemReader):
    """DCP's file reader, but its ``.metadata`` is unpickled building DCP's own metadata classes only: a
    planted pickle fails to load instead of running (tensors DCP loads with ``weights_only=True`` itself)."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = Path(self.path) / ".metadata"
        with open(path, "rb") as stream:
            try:
                metadata = _MetadataUnpickler(stream).load()
            except pickle.UnpicklingError as error:
                raise CheckpointError(
                    f"{path} holds Python objects that safe loading refuses to build ({error}); ELFES writes only DCP's "
                    "metadata there, so this folder was not written by ELFES, or was altered. Resume from another checkpoint."
                ) from None
        if not isinstance(metadata, Metadata):
            raise CheckpointError(f"{path} is not DCP metadata; resume from a checkpoint written by Trainer.train().")
        metadata.storage_meta = metadata.storage_meta or StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


_METADATA_CLASSES = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata", "MetadataIndex", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata",
        "TensorProperties", "StorageMeta", "_MEM_FORMAT_ENCODING",
    },
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "pathlib": {"PosixPath", "PurePosixPath"},
    "collections": {"OrderedDict"},
}


def _enum_member(cls: Any, name: str) -> Any:
    """What ``getattr`` may build here: a member of one of the metadata's enums (some Python versions, 3.11.2
    among them, pickle an enum member as ``getattr(cls, name)``), nothing else."""
    if isinstance(cls, enum.EnumMeta) and isinstance(name, str) and name in cls.__members__:
        return cls.__members__[name]
    raise pickle.UnpicklingError(f"getattr({cls!r}, {name!r}) is not part of DCP's metadata")


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if name in _METADATA_CLASSES.get(module, ()) or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        if (module, name) == ("builtins", "getattr"):
            return _enum_member
        raise pickle.UnpicklingError(f"{module}.{name} is not part of DCP's metadata")
