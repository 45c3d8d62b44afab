"""What travels to a worker: user code with its file and line numbers, whatever cloudpickle is installed; tensors of
every dtype, shape and memory layout as they were, storages shared where they were shared, each copied once."""
from __future__ import annotations

import pickle
import subprocess
import sys
import textwrap
import traceback

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from rpc_collectors.core import pickling
from rpc_collectors.transport.shm import SharedBytes

# every dtype a CPU tensor can hold data of, torch's own pickling failing on the float8 and unsigned ones
DTYPES = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16, torch.uint32,
          torch.uint64, torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128,
          torch.float8_e4m3fn, torch.float8_e5m2)
LAYOUTS = ("contiguous", "transposed", "sliced", "strided", "expanded", "empty")


def _raiser():
    def make_env():  # nested: not importable, so it travels by value, code object included
        raise RuntimeError("simulator licence not found")

    return make_env


def test_a_function_sent_by_value_keeps_its_file_and_line_and_its_traceback_shows_the_source():
    fn = _raiser()
    loaded = pickling.loads(pickling.dumps(fn))
    assert loaded is not fn
    assert loaded.__code__.co_filename == __file__
    assert loaded.__code__.co_firstlineno == fn.__code__.co_firstlineno
    try:
        loaded()
    except RuntimeError:
        text = traceback.format_exc()
    assert f'File "{__file__}", line {fn.__code__.co_firstlineno + 1}, in make_env' in text
    assert 'raise RuntimeError("simulator licence not found")' in text


def test_a_closure_of_the_users_main_script_shows_its_line_in_another_process(tmp_path):
    """The path a worker takes: a script's ``__main__`` function pickled in one interpreter and
    called in another."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import sys
        from rpc_collectors.core import pickling
        scale = 3
        def make_env():
            return 1 / (scale - 3)
        sys.stdout.buffer.write(pickling.dumps(make_env))
    """))
    pickled = subprocess.run([sys.executable, str(script)], capture_output=True, check=True, timeout=60).stdout
    called = subprocess.run(
        [sys.executable, "-c",
         "import sys; from rpc_collectors.core import pickling; pickling.loads(sys.stdin.buffer.read())()"],
        input=pickled, capture_output=True, timeout=60,
    )
    assert called.returncode == 1
    err = called.stderr.decode()
    assert f'File "{script}", line 6, in make_env' in err
    assert "return 1 / (scale - 3)" in err
    assert "ZeroDivisionError" in err


def _tensor(dtype: torch.dtype, shape: tuple, layout: str, seed: int) -> torch.Tensor:
    """A tensor of ``dtype`` and ``shape`` in ``layout``, its values drawn from ``seed`` (the bytes of random int8s, so
    any dtype's values, NaNs included, are compared bit for bit)."""
    gen = torch.Generator().manual_seed(seed)
    def dense(*dims: int) -> torch.Tensor:
        raw = torch.randint(-128, 128, (max(1, np.prod(dims, dtype=int)) * torch.empty(0, dtype=dtype).element_size(),),
                            generator=gen, dtype=torch.int8)
        raw = raw % 2 if dtype == torch.bool else raw  # a bool's byte is 0 or 1
        return raw.view(dtype)[:int(np.prod(dims, dtype=int))].view(dims)
    if layout == "transposed" and len(shape) >= 2:
        return dense(*reversed(shape)).permute(*reversed(range(len(shape))))
    if layout == "sliced" and shape:
        return dense(2 * shape[0] + 1, *shape[1:])[1::2]
    if layout == "strided":
        return dense(*shape, 3)[..., 2]
    if layout == "expanded":
        return dense(*[1] * len(shape)).expand(shape)
    if layout == "empty":
        return dense(0, *shape)
    return dense(*shape)


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> None:
    assert (type(a), a.dtype, a.shape, a.stride(), a.storage_offset()) == \
        (type(b), b.dtype, b.shape, b.stride(), b.storage_offset())
    assert a.requires_grad == b.requires_grad
    assert bytes(a.untyped_storage()) == bytes(b.untyped_storage())


tensors = st.builds(_tensor, st.sampled_from(DTYPES), st.sampled_from(((), (1,), (3,), (2, 3), (2, 1, 4))),
                    st.sampled_from(LAYOUTS), st.integers(0, 2**16))


@settings(deadline=None, derandomize=True, database=None, max_examples=150)
@given(tensors)
def test_a_tensor_comes_back_with_its_dtype_shape_strides_offset_and_bytes(tensor):
    loaded = pickling.loads(pickling.dumps(tensor))
    _same_tensor(tensor, loaded)
    assert loaded.untyped_storage().data_ptr() != tensor.untyped_storage().data_ptr() or not tensor.untyped_storage().nbytes()


@settings(deadline=None, derandomize=True, database=None, max_examples=40)
@given(tensors, st.integers(1, 4))
def test_views_of_one_storage_share_one_storage_at_the_other_end_and_nothing_with_this_one(base, views):
    flat = base.reshape(-1) if base.is_contiguous() else base.contiguous().reshape(-1)
    sent = [flat, *[flat[i:] for i in range(min(views, flat.numel()))]]
    loaded = pickling.loads(pickling.dumps(sent))
    for before, after in zip(sent, loaded):
        _same_tensor(before, after)
    assert len({t.untyped_storage().data_ptr() for t in loaded}) == 1
    if flat.numel():
        before = bytes(flat.untyped_storage())
        raw = torch.tensor([], dtype=torch.uint8).set_(loaded[-1].untyped_storage())
        raw[-1] ^= 1
        assert bytes(loaded[0].untyped_storage()) != before  # written through the shared storage
        assert bytes(flat.untyped_storage()) == before  # the sender's stays as it was


def test_a_policy_arrives_whole_tied_weights_tied_parameters_and_buffers_of_every_dtype():
    policy = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 3))
    policy[2].weight = policy[0].weight
    for i, dtype in enumerate(DTYPES):
        policy.register_buffer(f"b{i}", _tensor(dtype, (2, 3), "contiguous", i))
    loaded = pickling.loads(pickling.dumps(policy))
    assert loaded[2].weight is loaded[0].weight
    assert isinstance(loaded[0].weight, nn.Parameter) and loaded[0].weight.requires_grad
    for before, after in zip(policy.state_dict(keep_vars=True).values(), loaded.state_dict(keep_vars=True).values()):
        _same_tensor(before, after)
    out = loaded(torch.ones(1, 3))
    assert torch.equal(out, policy(torch.ones(1, 3)))


def test_storages_leave_the_stream_and_numpy_arrays_stay_writable():
    table = torch.arange(250_000, dtype=torch.float32)
    data = pickling.dumps({"table": table, "array": np.arange(4)})
    assert len(data) > table.numel() * 4 and len(data) - table.numel() * 4 < 2_000
    assert bytes(table.untyped_storage()) in data  # once, raw, not through torch.save
    loaded = pickling.loads(data)
    loaded["array"][0] = 7
    assert torch.equal(loaded["table"], table) and loaded["array"].tolist() == [7, 1, 2, 3]


def test_storages_loaded_from_a_shared_map_are_copy_on_write_views_of_it():
    """Workers given one spec share its pages until one writes: each write stays that reader's own,
    and the tensors stay valid once the view is released and the file closed."""
    table = torch.arange(100_000, dtype=torch.float64)
    shared, fd = SharedBytes.of(pickling.dumps({"a": table, "b": table[10:20]}), "a test's bytes", "")
    try:
        views = [shared.read(), shared.read()]
        assert all(isinstance(v, memoryview) and not v.readonly for v in views)
        first, second = (pickling.loads(v) for v in views)
        for view in views:
            view.release()
    finally:
        import os
        os.close(fd)
    assert first["a"].untyped_storage().data_ptr() % pickling.ALIGN == 0  # aligned for any dtype
    assert first["b"].untyped_storage().data_ptr() == first["a"].untyped_storage().data_ptr()  # one storage still
    first["a"] += 1  # the first reader's own: the other reader and the file keep the bytes
    assert torch.equal(first["a"], table + 1) and torch.equal(first["b"], table[10:20] + 1)
    assert torch.equal(second["a"], table) and torch.equal(second["b"], table[10:20])


def test_storages_loaded_from_read_only_bytes_are_copies():
    data = pickling.dumps(torch.arange(10.0))
    loaded = pickling.loads(data)
    loaded += 1
    assert torch.equal(pickling.loads(data), torch.arange(10.0))


def test_meta_tensors_travel_as_torch_pickles_them():
    loaded = pickling.loads(pickling.dumps(torch.empty(2, 3, device="meta")))
    assert loaded.device.type == "meta" and loaded.shape == (2, 3)


def test_bytes_not_written_by_dumps_are_refused_with_what_they_are_not():
    with pytest.raises(ValueError, match="not written by rpc_collectors.core.pickling.dumps"):
        pickling.loads(pickle.dumps({"policy": 1}))
