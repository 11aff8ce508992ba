"""DCP's file reader, made safe for files ELFES did not write: DCP unpickles ``.metadata`` with plain ``pickle``
and any entry the metadata calls *bytes* with ``torch.load(weights_only=False)``, either of which would run whatever
a planted pickle names. This reader builds DCP's own metadata classes and nothing else, accepts only tensor entries
stored in the folder's own shard files (``__<rank>_<n>.distcp``), all there in full, refuses to read a bytes entry,
and checks each entry's CRC-32 checksums (DCP writes every entry as a ``torch.save`` archive, whose records carry
one; torch does not check it when it loads) before DCP loads the entry with ``weights_only=True``.

Importing it imports DCP (and DTensor, sympy: about a second): :mod:`.checkpoint` imports it when it reads a sharded
checkpoint, never for a single-file one."""

from __future__ import annotations

import enum
import importlib
import mmap
import os
import pickle
import re
import struct
import zipfile
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

import torch
from torch.distributed.checkpoint.filesystem import FileSystemReader, _StorageInfo
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner

from .payload import ShardDamage as ShardDamage  # re-exported: where a reader's damage is expected
from .payload import UnusableCheckpointError

SHARD_FILE = re.compile(r"__[0-9]+_[0-9]+\.distcp")  # the files DCP's FileSystemWriter names, one or more per rank


class SafeReader(FileSystemReader):
    """DCP's file reader, but its ``.metadata`` is unpickled building DCP's own metadata classes only, every entry
    must be a tensor stored within one of the folder's shard files, a bytes entry is never read, and each entry's
    checksums are checked before DCP loads it (with ``weights_only=True``).

    The metadata is read and checked once per reader: make one per folder and hand it to whatever loads the folder
    (:func:`~elfes.engine.sharded.load_shards`), so that a load reads it (and stats every shard file) once."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(path)
        self._checked: Metadata | UnusableCheckpointError | None = None  # the checked metadata, or its refusal

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        super().reset(checkpoint_id)
        self._checked = None  # maybe another folder now: read its metadata afresh

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """The folder's checked metadata, or its refusal (an :class:`UnusableCheckpointError`, :class:`ShardDamage`
        for a damaged folder), the same at every call: DCP's fallback after a failed read, to a rank's own metadata
        (``rank=``; ELFES writes none), is given the refusal too."""
        if self._checked is None:
            try:
                self._checked = self._read_checked_metadata()
            except UnusableCheckpointError as refusal:
                self._checked = refusal
        if isinstance(self._checked, UnusableCheckpointError):
            raise self._checked.with_traceback(None)
        self._checked.storage_meta = self._checked.storage_meta or StorageMeta()
        self._checked.storage_meta.load_id = self.load_id
        return self._checked

    def _read_checked_metadata(self) -> Metadata:
        folder = Path(self.path)
        path = folder / ".metadata"
        if not path.is_file():
            raise ShardDamage("its .metadata is missing")
        with open(path, "rb") as stream:
            try:
                metadata = _MetadataUnpickler(stream).load()
            except EOFError:
                raise ShardDamage("its .metadata is cut short") from None
            except _RefusedName as refused:
                raise UnusableCheckpointError(refused.refusal(path)) from None
            except pickle.UnpicklingError as error:  # a stream that is no pickle, or a refused getattr
                raise UnusableCheckpointError(
                    f"{path} holds Python objects that safe loading refuses to build ({error}); ELFES writes only DCP's "
                    "metadata there, so this folder was not written by ELFES, or was altered. Resume from another checkpoint."
                ) from None
            except OSError:  # the read itself failed (an I/O error): nothing says the folder is bad
                raise
            except Exception as error:  # DCP's own classes built from arguments DCP never writes: torch.Size("x")
                raise UnusableCheckpointError(
                    f"{path} cannot be unpickled as DCP metadata ({type(error).__name__}: {error}); " + _NOT_ELFES
                ) from None
        if not isinstance(metadata, Metadata):
            raise UnusableCheckpointError(f"{path} is not DCP metadata; resume from a checkpoint written by Trainer.train().")
        try:
            _check_entries(folder, metadata)
        except (TypeError, AttributeError) as error:  # DCP's classes holding what DCP never puts there
            raise UnusableCheckpointError(f"{path} holds DCP metadata of a shape DCP never writes ({error}); "
                                          + _NOT_ELFES) from None
        return metadata

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Any:
        # DCP's planner would load a bytes item with torch.load(weights_only=False); none is read at all.
        unpickled = sorted(item.dest_index.fqn for item in plan.items if item.type != LoadItemType.TENSOR)
        if unpickled:
            raise UnusableCheckpointError(f"{self.path} asks to unpickle {', '.join(unpickled)} (bytes entries); " + _NOT_ELFES)
        return super().read_data(plan, planner)

    def _slice_file(self, file: Any, sinfo: _StorageInfo) -> IO[bytes]:
        # Where DCP opens one entry (a torch.save archive) for torch.load: its checksums are checked first, on the
        # file's pages where they lie (mapped, not copied), then torch reads it as DCP would.
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped, memoryview(mapped) as pages:
            with pages[sinfo.offset:sinfo.offset + sinfo.length] as view:
                problem = _checksum_problem(view)
        if problem is not None:
            raise ShardDamage(f"its shard {sinfo.relative_path} holds an entry at byte {sinfo.offset} that {problem}")
        return super()._slice_file(file, sinfo)


_NOT_ELFES = ("ELFES writes only tensors into a sharded checkpoint's shards, so this folder was not written by ELFES, "
              "or was altered; nothing of it was loaded. Resume from another checkpoint.")


def _check_entries(folder: Path, metadata: Metadata) -> None:
    """Refuse metadata ELFES never writes (an entry that is no tensor, a piece stored outside the folder's shard
    files or transformed on its way); raise :class:`ShardDamage` for a shard file that is missing or shorter than
    the metadata says."""
    others = sorted(key for key, entry in metadata.state_dict_metadata.items() if not isinstance(entry, TensorStorageMetadata))
    if others:
        raise UnusableCheckpointError(f"{folder / '.metadata'} declares {', '.join(others)} as no tensor (bytes entries); " + _NOT_ELFES)
    sizes: dict[str, int] = {}
    for index, where in (metadata.storage_data or {}).items():
        name = where.relative_path if isinstance(where, _StorageInfo) else None
        if not isinstance(name, str) or not SHARD_FILE.fullmatch(name) or where.transform_descriptors:
            raise UnusableCheckpointError(
                f"{folder / '.metadata'} stores {getattr(index, 'fqn', index)} in {name!r}, not in one of the folder's "
                "shard files (__<rank>_<n>.distcp) as written; " + _NOT_ELFES)
        if name not in sizes:
            shard = folder / name
            if not shard.is_file():
                raise ShardDamage(f"its shard {name} is missing")
            sizes[name] = shard.stat().st_size
        if where.offset < 0 or where.length < 0 or where.offset + where.length > sizes[name]:
            raise ShardDamage(
                f"its shard {name} holds {sizes[name]} bytes, and its metadata places {getattr(index, 'fqn', index)} "
                f"at bytes {where.offset} to {where.offset + where.length}: the file was cut short")


def _checksum_problem(view: memoryview) -> str | None:
    """Why a ``torch.save`` archive (its bytes ``view``) is not whole or a record of it fails its CRC-32
    checksum; None when all pass. A record whose checksum is 0 was written without one
    (torch.serialization.set_crc32_options(False)): skipped. torch stores each record uncompressed."""
    try:
        with zipfile.ZipFile(_ViewFile(view)) as archive:
            records = archive.infolist()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as error:
        return f"is not a whole archive ({error})"
    for record in records:
        header = view[record.header_offset:record.header_offset + 30]
        if len(header) < 30 or bytes(header[:4]) != b"PK\x03\x04" or record.compress_type != zipfile.ZIP_STORED:
            return f"has a damaged record {record.filename!r}"
        name_length, extra_length = struct.unpack("<HH", header[26:30])
        data = record.header_offset + 30 + name_length + extra_length
        if record.CRC and zlib.crc32(view[data:data + record.file_size]) != record.CRC:
            return f"fails the CRC-32 checksum of its record {record.filename!r}"
    return None


class _ViewFile:
    """A read-only file over a memoryview: what zipfile reads an archive's directory from, copying only that."""

    def __init__(self, view: memoryview) -> None:
        self.view, self.position = view, 0

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        self.position = max(0, (offset, self.position + offset, len(self.view) + offset)[whence])
        return self.position

    def tell(self) -> int:
        return self.position

    def read(self, size: int = -1) -> bytes:
        end = len(self.view) if size is None or size < 0 else self.position + size
        data = bytes(self.view[self.position:end])
        self.position += len(data)
        return data


# DCP's metadata classes, by a place that holds each (resolved to the objects themselves: AllowList).
_METADATA_PLACES = {
    "torch.distributed.checkpoint.metadata": (
        "Metadata", "MetadataIndex", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata",
        "TensorProperties", "StorageMeta", "_MEM_FORMAT_ENCODING"),
    "torch.distributed.checkpoint.filesystem": ("_StorageInfo",),
    "torch.serialization": ("_get_layout",),
    "torch": ("Size",),
    "pathlib": ("PosixPath", "PurePosixPath"),
    "collections": ("OrderedDict",),
}


def _lookup(module: str, name: str) -> Any:
    """``name`` of ``module`` (a plain attribute, no dotted path), or None where this Python or torch has none."""
    try:
        return getattr(importlib.import_module(module), name, None)
    except ImportError:
        return None


class AllowList:
    """The objects a ``.metadata`` may name, resolved from ``places`` (module -> names): a pickle may name each by
    any module that holds it, the place listed or its home in this torch, and nothing else. Only those modules are
    ever imported to look a name up."""

    def __init__(self, places: Mapping[str, tuple[str, ...]]) -> None:
        found = (_lookup(module, name) for module, names in places.items() for name in names)
        self.objects = tuple(item for item in found if item is not None)  # a place this torch lacks is left out
        self.identities = frozenset(id(item) for item in self.objects)  # self.objects keeps them alive
        self.modules = frozenset(places) | {item.__module__ for item in self.objects}

    def find(self, module: str, name: str) -> Any:
        """The allowed object ``module.name`` names, or None."""
        found = _lookup(module, name) if module in self.modules else None
        return found if found is not None and id(found) in self.identities else None


_METADATA = AllowList(_METADATA_PLACES)


class _RefusedName(pickle.UnpicklingError):
    """A name in a ``.metadata`` that is none of DCP's metadata classes in this torch."""

    def __init__(self, module: str, name: str) -> None:
        super().__init__(f"{module}.{name} is none of DCP's metadata classes in torch {torch.__version__}")
        self.named = f"{module}.{name}"
        self.torch_name = module.partition(".")[0] == "torch"

    def refusal(self, path: Path) -> str:
        """Why ``path`` is refused, and what to do."""
        if self.torch_name:  # one of torch's own names: maybe a class that the torch which wrote it kept elsewhere
            return (f"{path} names {self.named}, which torch {torch.__version__} does not hold among DCP's metadata "
                    "classes, so safe loading refuses to build it: the torch that wrote the checkpoint may keep it where "
                    "this one does not (a newer torch may move or rename DCP's classes); if this torch wrote it, the "
                    "folder was altered. Nothing of it was loaded. Resume with the torch version that wrote the "
                    "checkpoint, or from a checkpoint this torch wrote.")
        return (f"{path} holds Python objects that safe loading refuses to build ({self}); ELFES writes only DCP's "
                "metadata there, so this folder was not written by ELFES, or was altered. Resume from another checkpoint.")


def _enum_member(cls: Any, name: str) -> Any:
    """What ``getattr`` may build here: a member of one of the metadata's enums (some Python versions, 3.11.2
    among them, pickle an enum member as ``getattr(cls, name)``), nothing else."""
    if isinstance(cls, enum.EnumMeta) and isinstance(name, str) and name in cls.__members__:
        return cls.__members__[name]
    raise pickle.UnpicklingError(f"getattr({cls!r}, {name!r}) is not part of DCP's metadata")


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        found = _METADATA.find(module, name)
        if found is not None:
            return found
        if (module, name) == ("builtins", "getattr"):
            return _enum_member
        raise _RefusedName(module, name)
