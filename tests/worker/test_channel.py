"""The pipes a local worker is driven over (rpc_collectors.worker.channel), both ends in this process."""
from __future__ import annotations

import os
import threading

import pytest
import torch
from tensordict import TensorDict

from rpc_collectors.transport.doorbell import Doorbell
from rpc_collectors.worker.channel import Channel, ChannelClosed, RemoteError, run_channel

pytestmark = pytest.mark.timeout(30)


class Worker:
    """The worker side, served from a thread: ``echo`` returns its arguments, ``fail`` raises,
    ``wait`` blocks until released."""

    def __init__(self, channel: Channel) -> None:
        self.release, self.ended = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=run_channel, args=(channel.ends, self.handle, self.ended.set), daemon=True)
        self.thread.start()
        channel.hello.wait()
        channel.opened()

    def handle(self, method: str, args: tuple):
        if method == "echo":
            return args
        if method == "wait":
            self.release.wait(10)
            return "released"
        raise ValueError(f"no method {method}")


@pytest.fixture
def channel():
    channel = Channel()
    yield channel
    channel.close()


def test_tensors_and_tensordicts_arrive_whole_whatever_their_dtype_or_strides(channel):
    Worker(channel)
    batch = TensorDict({"obs": torch.arange(12.0).reshape(3, 4), ("next", "done"): torch.ones(3, 1, dtype=torch.bool)},
                       batch_size=[3], names=["time"])
    odd = [torch.arange(6).reshape(2, 3).t(), torch.ones(2, dtype=torch.bfloat16), torch.zeros(3).to_sparse()]
    out_batch, *out_odd = channel.call("echo", batch, *odd).wait()
    assert (out_batch == batch).all() and out_batch.names == ["time"]
    for got, sent in zip(out_odd, odd):
        assert got.dtype == sent.dtype and got.shape == sent.shape
        assert torch.equal(got.to_dense(), sent.to_dense())
    got = out_batch["obs"]
    got += 1  # what arrives is the receiver's own, writable memory
    assert (batch["obs"] == torch.arange(12.0).reshape(3, 4)).all()


def test_a_call_in_progress_does_not_hold_up_another(channel):
    worker = Worker(channel)
    slow = channel.call("wait")
    assert channel.call("echo", 1).wait() == (1,)  # answered while "wait" still runs
    assert not slow.done()
    worker.release.set()
    assert slow.wait() == "released"


def test_a_raise_comes_back_with_its_traceback_and_the_channel_goes_on(channel):
    Worker(channel)
    with pytest.raises(RemoteError, match=r"(?s)Traceback.*ValueError: no method nope"):
        channel.call("nope").wait()
    assert channel.call("echo", "still here").wait() == ("still here",)


def test_closing_ends_the_worker_and_fails_what_is_in_flight(channel):
    worker = Worker(channel)
    pending = channel.call("wait")
    channel.close()
    with pytest.raises(ChannelClosed):
        pending.wait()
    with pytest.raises(ChannelClosed):
        channel.call("echo", 1).wait()
    worker.release.set()
    assert worker.ended.wait(10), "the worker side did not end after the trainer closed its end"
    worker.thread.join(10)


def test_an_exit_fails_the_calls_with_its_reason(channel):
    worker = Worker(channel)
    pending = channel.call("wait")
    channel.exited("died with exit code -9 (SIGKILL)")
    with pytest.raises(ChannelClosed, match=r"died with exit code -9 \(SIGKILL\)"):
        pending.wait()
    assert channel.exit_reason() == "died with exit code -9 (SIGKILL)"
    worker.release.set()


@pytest.mark.parametrize("pipes", [Channel, Doorbell])
def test_ends_whose_numbers_were_closed_and_reused_do_not_open(pipes):
    """Ends opened after the trainer closed them (a worker it gave up on) refuse the pipes
    that took their numbers; the pipes' own ends open."""
    closed = pipes()
    stale = closed.ends
    closed.close()
    fresh = pipes()
    try:
        assert fresh.ends.request == stale.request, "the test needs the closed number reused"
        with pytest.raises(FileNotFoundError, match="names another file"):
            stale.open()
        for fd in fresh.ends.open():
            os.close(fd)
    finally:
        fresh.close()
