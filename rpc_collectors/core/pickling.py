"""User code and its tensors as bytes for another process: :func:`dumps` is cloudpickle (closures,
lambdas and functions of ``__main__`` travel by value) with two differences, each an invariant owned
here, and :func:`loads` reads what it wrote.

* A function that travels keeps its file name and line numbers, so a worker's traceback names the
  user's own file and line, and shows the line where the file is readable. cloudpickle 3.1.3 and
  later rename every code object it pickles ``<dynamic-code>`` (for deterministic payloads); here a
  code object travels whole, as :mod:`marshal` writes it for a ``.pyc`` (the interpreter's own
  format: same Python version on both ends, as cloudpickle's code objects need too).
* A CPU tensor's storage travels once, as its raw bytes beside the pickle stream (pickle's
  out-of-band buffers, each at an offset aligned for any dtype), and :func:`loads` gives each a
  storage of its own: a copy out of read-only bytes, where torch's own pickling writes each
  storage through ``torch.save`` and reads it back through ``torch.load``; the bytes themselves
  where they are writable (a local worker's copy-on-write mapping of its spec: the workers given
  one spec share its pages until one writes a page, which is then copied for that worker alone).
  Tensors that share a storage (views, tied weights) share one at the other end
  too; every dtype, shape, stride and offset comes back as it was. Other storages (CUDA, meta)
  travel as torch pickles them.

The bytes: a header (:data:`MAGIC`, the stream's length, the number of storages), each storage's
length, the pickle stream, then the storages' bytes in order, each from an offset that is a
multiple of :data:`ALIGN`.
"""
from __future__ import annotations

import io
import marshal
import pickle
import struct
import types
from collections import ChainMap
from typing import Any

import cloudpickle
import numpy as np
import torch

MAGIC = b"rpcc-pk2"
# bytes; where each storage starts, from the start of the bytes (a mapping starts on a page)
ALIGN = 64
_HEAD = struct.Struct("<8sQQ")
_LENGTH = struct.Struct("<Q")


def _code_reduce(code: types.CodeType) -> tuple:
    return marshal.loads, (marshal.dumps(code),)


def _storage(data: memoryview) -> torch.storage.TypedStorage:
    """A CPU storage of ``data``'s bytes, as ``torch.load`` gives a saved ``UntypedStorage``
    (wrapped, of uint8: what torch's tensor rebuilds read): ``data`` itself if it is writable (it
    stays alive with the storage), else a copy."""
    data = memoryview(data)
    if not data.readonly and data.nbytes:
        return _typed(torch.frombuffer(data, dtype=torch.uint8).untyped_storage(), torch.uint8)
    out = torch.empty(data.nbytes, dtype=torch.uint8)
    out.numpy()[:] = np.frombuffer(data, dtype=np.uint8)
    return _typed(out.untyped_storage(), torch.uint8)


def _typed(storage: torch.UntypedStorage, dtype: torch.dtype) -> torch.storage.TypedStorage:
    return torch.storage.TypedStorage(wrap_storage=getattr(storage, "_untyped_storage", storage),
                                      dtype=dtype, _internal=True)


def _same(storage: torch.storage.TypedStorage) -> torch.storage.TypedStorage:
    """The storage another tensor's pickle already brought (it is in pickle's memo)."""
    return storage


class _Pickler(cloudpickle.Pickler):
    dispatch_table = ChainMap({types.CodeType: _code_reduce}, cloudpickle.Pickler.dispatch_table)

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=5, buffer_callback=self._out_of_band)
        # the storages' bytes in the order the stream names them
        self.buffers: list[pickle.PickleBuffer] = []
        # (address, bytes) -> the first storage pickled over that memory
        self._storages: dict[tuple[int, int], torch.UntypedStorage] = {}
        # id -> the PickleBuffers made here (any other, numpy's, stays in the stream)
        self._own: dict[int, pickle.PickleBuffer] = {}

    def _out_of_band(self, buffer: pickle.PickleBuffer) -> bool:
        if self._own.get(id(buffer)) is not buffer:
            return True
        self.buffers.append(buffer)
        return False

    def reducer_override(self, obj: Any) -> Any:
        typed = isinstance(obj, torch.storage.TypedStorage)
        if typed and obj._untyped_storage.device.type == "cpu":
            return _typed, (obj._untyped_storage, obj.dtype)
        if isinstance(obj, torch.UntypedStorage) and obj.device.type == "cpu":
            key = (obj.data_ptr(), obj.nbytes())
            first = self._storages.get(key)
            if first is not None and key[1]:
                return _same, (first,)
            self._storages[key] = obj
            raw = torch.empty(0, dtype=torch.uint8).set_(obj, 0, (obj.nbytes(),), (1,))
            buffer = pickle.PickleBuffer(raw.numpy())
            self._own[id(buffer)] = buffer
            return _storage, (buffer,)
        return super().reducer_override(obj)


def dumps(value: Any) -> bytes:
    """``value`` as bytes for another process: cloudpickle's stream, code objects with their file
    names, CPU storages beside it."""
    out = io.BytesIO()
    pickler = _Pickler(out)
    pickler.dump(value)
    stream, buffers = out.getbuffer(), [b.raw() for b in pickler.buffers]
    lengths = b"".join(_LENGTH.pack(b.nbytes) for b in buffers)
    parts = [_HEAD.pack(MAGIC, stream.nbytes, len(buffers)), lengths, stream]
    at = sum(len(p) for p in parts[:2]) + stream.nbytes
    for buffer in buffers:
        parts.append(bytes(-at % ALIGN))
        at += -at % ALIGN + buffer.nbytes
        parts.append(buffer)
    return b"".join(parts)


def loads(data: bytes | memoryview) -> Any:
    """The value :func:`dumps` gave ``data`` (any bytes-like object: a memory map of them too)."""
    view = memoryview(data)
    magic, length, count = _HEAD.unpack_from(view) if view.nbytes >= _HEAD.size else (b"", 0, 0)
    if magic != MAGIC:
        raise ValueError("these bytes were not written by rpc_collectors.core.pickling.dumps "
                         "(same rpc_collectors on both ends?)")
    at = _HEAD.size + _LENGTH.size * count
    lengths = [_LENGTH.unpack_from(view, _HEAD.size + _LENGTH.size * i)[0] for i in range(count)]
    stream, at = view[at:at + length], at + length
    buffers = []
    for size in lengths:
        at += -at % ALIGN
        buffers.append(view[at:at + size])
        at += size
    return pickle.loads(stream, buffers=buffers)
