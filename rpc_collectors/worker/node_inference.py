"""Inference per node (``inference="node"``): a node's local workers call one policy in the node.

The local workers keep their rollout (so a node's batch is laid out as with a policy in every
local worker), but their policy is a :class:`NodePolicy`: per step it sends the policy's inputs
(its ``in_keys``) to the node over a Unix socket, raw bytes with no pickle, and waits for the
outputs. The node's :class:`NodeInference`, a thread of the node process, waits on every local
worker's socket at once, runs the policy once on all requests that are ready (concatenated along
the batch dim, on the node's device), and answers each worker with its rows of the outputs and
the version of the weights that chose them. The trainer's weights land in that one policy.

The node's socket admits only the node's user's processes that present its token
(:mod:`rpc_collectors.transport.local_socket`), once per connection, before any request is read.
Per connection, the first request carries its layout (keys, batch size, shapes, dtypes), pickled
once, and so does the first answer. A local worker that dies closes its socket (the node forgets
it; its replacement connects anew). An exception of the policy ends the loop: the node closes
every socket (the local workers' steps fail) and raises the exception in its next answer.
"""
from __future__ import annotations

import math
import pickle
import selectors
import socket
import struct
import threading
from typing import Any

import torch
from tensordict.nn import set_interaction_type

from rpc_collectors.single_process.policies import StepPolicy
from rpc_collectors.transport.local_socket import Address, PrivateListener

# length of the pickled layout that follows (0: none)
HEADER = struct.Struct("<I")
VERSION = struct.Struct("<q")
# seconds between checks of the stop flag while nothing happens
POLL = 0.5

# [(key, shape, dtype)]
Layout = list


def _recv_exactly(sock: socket.socket, n: int) -> bytearray:
    data = bytearray(n)
    view, got = memoryview(data), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if not k:
            raise EOFError("the node's inference socket was closed")
        got += k
    return data


def _recv_tensors(sock: socket.socket, layout: Layout) -> list[torch.Tensor]:
    out = []
    for _, shape, dtype in layout:
        tensor = torch.empty(shape, dtype=dtype)
        if tensor.numel():
            raw = _recv_exactly(sock, tensor.numel() * tensor.element_size())
            tensor.view(-1).view(torch.uint8).copy_(torch.frombuffer(raw, dtype=torch.uint8))
        out.append(tensor)
    return out


def _send(sock: socket.socket, head: bytes, tensors: list[torch.Tensor]) -> None:
    sock.sendall(head)
    for tensor in tensors:
        if tensor.numel():
            sock.sendall(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy())


def _layout(tensors: list[torch.Tensor], keys: list) -> Layout:
    return [(key, tuple(t.shape), t.dtype) for key, t in zip(keys, tensors)]


class NodePolicy:
    """A local worker's policy under node inference: calls the node's policy, one request per step.

    Picklable (it travels in the local worker's spec); connects on its first call. ``collector``
    (set by the worker's server) gets the version of the weights of each batch's first step as
    its ``policy_version``, once :meth:`begin` was called for the batch.
    """

    def __init__(self, address: Address, in_keys: list, timeout: float) -> None:
        self.address, self.in_keys, self.timeout = address, in_keys, timeout
        self._sock: socket.socket | None = None
        self._out_layout: Layout | None = None
        self.collector: Any = None
        self._first = False

    def __getstate__(self) -> dict:
        return {"address": self.address, "in_keys": self.in_keys, "timeout": self.timeout}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["address"], state["in_keys"], state["timeout"])

    def begin(self) -> None:
        """A batch starts: its first step's weights version becomes the collector's."""
        self._first = True

    def __call__(self, td: Any) -> Any:
        tensors = [td.get(key) for key in self.in_keys]
        head = b""
        if self._sock is None:
            self._sock = self.address.connect(self.timeout)
            described = pickle.dumps((tuple(td.batch_size), _layout(tensors, self.in_keys)))
            head = HEADER.pack(len(described)) + described
        else:
            head = HEADER.pack(0)
        try:
            _send(self._sock, head, tensors)
            version = VERSION.unpack(_recv_exactly(self._sock, VERSION.size))[0]
            if self._out_layout is None:
                size = HEADER.unpack(_recv_exactly(self._sock, HEADER.size))[0]
                self._out_layout = pickle.loads(_recv_exactly(self._sock, size))
            outputs = _recv_tensors(self._sock, self._out_layout)
        except (EOFError, OSError) as err:
            raise RuntimeError(
                f"the node's policy did not answer ({err}); the node reports why") from None
        if self._first and self.collector is not None:
            self.collector.policy_version = version
        self._first = False
        for (key, _, _), value in zip(self._out_layout, outputs):
            td.set(key, value)
        return td


class _Client:
    """What the node knows of one local worker's connection."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.batch_size: tuple | None = None
        self.layout: Layout | None = None
        self.inputs: list[torch.Tensor] = []
        self.answered_layout = False


class NodeInference:
    """The node's inference loop: one policy, one thread, every local worker's requests batched.

    Args:
        policy: the node's policy (its weights receive the trainer's pushes).
        device: where it runs.
        exploration_type: set around each forward pass.
        version: returns the weights version of the policy now.
        compile_kwargs: if not None, the policy runs through ``torch.compile``.
    """

    def __init__(
        self, policy: Any, device: torch.device, exploration_type: Any, version: Any,
        compile_kwargs: dict | None = None,
    ) -> None:
        self.policy = StepPolicy(policy, device, compile_kwargs=compile_kwargs)
        if self.policy.td_module is None:
            raise TypeError(f"inference='node': policy={policy!r} has no in_keys; accepted: a "
                            "TensorDictModule or an nn.Module")
        self.exploration_type, self.version = exploration_type, version
        # held around each forward pass; weights change under it
        self.lock = threading.Lock()
        self.error: BaseException | None = None
        self._selector = selectors.DefaultSelector()
        self._listener = PrivateListener(self._selector, "node")
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="rpc-collectors-node-inference",
                                       daemon=True)
        self.thread.start()

    def stub(self, timeout: float) -> NodePolicy:
        """The policy a local worker is given."""
        return NodePolicy(self._listener.address, list(self.policy.in_keys), timeout)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                ready = []
                for key, _ in self._selector.select(POLL):
                    if key.data is self._listener:
                        sock = self._listener.ready(key.fileobj)
                        if sock is not None:
                            sock.settimeout(POLL * 20)
                            self._selector.register(sock, selectors.EVENT_READ, _Client(sock))
                    elif self._read(key.data):
                        ready.append(key.data)
                self._listener.expire()
                if ready:
                    self._act(ready)
        except BaseException as err:
            # the policy raised: the node's next answer raises it
            if not self._stop.is_set():
                self.error = err
        finally:
            self._close_all()

    def _read(self, client: _Client) -> bool:
        """Read one request of ``client`` into it; False if its worker went away."""
        try:
            size = HEADER.unpack(_recv_exactly(client.sock, HEADER.size))[0]
            if size:
                client.batch_size, client.layout = pickle.loads(_recv_exactly(client.sock, size))
            client.inputs = _recv_tensors(client.sock, client.layout)
            return True
        except (EOFError, OSError, TypeError):
            self._drop(client)
            return False

    def _act(self, clients: list[_Client]) -> None:
        counts = [math.prod(c.batch_size) for c in clients]
        inputs = {}
        for i, key in enumerate(self.policy.in_keys):
            parts = [c.inputs[i].reshape((n, *c.layout[i][1][len(c.batch_size):]))
                     for c, n in zip(clients, counts)]
            inputs[key] = torch.cat(parts) if len(parts) > 1 else parts[0]
        with self.lock, torch.no_grad(), set_interaction_type(self.exploration_type):
            outputs = self.policy(inputs, torch.Size([sum(counts)]))
            version = self.version()
        keys = list(outputs)
        split = [outputs[key].split(counts) for key in keys]
        for j, client in enumerate(clients):
            mine = [s[j].reshape((*client.batch_size, *s[j].shape[1:])) for s in split]
            head = VERSION.pack(version)
            if not client.answered_layout:
                described = pickle.dumps(_layout(mine, keys))
                head += HEADER.pack(len(described)) + described
                client.answered_layout = True
            try:
                _send(client.sock, head, mine)
            except OSError:
                self._drop(client)

    def _drop(self, client: _Client) -> None:
        try:
            self._selector.unregister(client.sock)
        except (KeyError, ValueError):
            pass
        client.sock.close()

    def _close_all(self) -> None:
        self._listener.close()
        for key in list(self._selector.get_map().values()):
            key.fileobj.close()
        self._selector.close()

    def close(self, timeout: float = 5.0) -> None:
        """Stop the loop and close every socket."""
        self._stop.set()
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(timeout)
