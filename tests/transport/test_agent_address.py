"""torch's TensorPipe binds every RPC agent of a process to the address its first agent picked.
A later agent that should listen on another interface is refused before it starts, naming both
addresses, instead of advertising an address its peers cannot reach (their joins would time out
on "connection refused")."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch.distributed.rpc as rpc

from rpc_collectors.transport.rendezvous import Rendezvous, free_port
from rpc_collectors.worker import rpc_rank as server

pytestmark = pytest.mark.timeout(60)


def test_an_agent_on_another_interface_than_the_first_is_refused(monkeypatch):
    monkeypatch.setattr(server, "_agent_started", True)
    monkeypatch.setattr(server, "_listening_on", "10.77.0.254")  # a first agent on a cluster's bridge
    rdv = Rendezvous("torchrun", 0, 2, "127.0.0.1", free_port("127.0.0.1"), "lo")
    with pytest.raises(RuntimeError, match=r"first RPC agent listened on 10\.77\.0\.254.*reach it on 127\.0\.0\.1 "
                                           r"\(interface 'lo'\): run this collector in a new process"):
        server.start_agent(server.TRAINER, rdv, rpc_timeout=5)
    assert not rpc.api._is_current_rpc_agent_set()


SUCCESSIVE_AGENTS = """
import torch.distributed.rpc as rpc
from rpc_collectors.transport.rendezvous import Rendezvous, serve_store
from rpc_collectors.worker import rpc_rank as server
for _ in range(2):
    store, port = serve_store("127.0.0.1", 0, 10)
    server.start_agent(server.TRAINER, Rendezvous("torchrun", 0, 1, "127.0.0.1", port, "lo"), 10)
    print(server._listening_on, flush=True)
    rpc.shutdown()
    del store
"""


def test_successive_agents_on_the_same_interface_start():
    """In a process of its own: an agent started here would bind this test process to loopback."""
    done = subprocess.run([sys.executable, "-c", SUCCESSIVE_AGENTS], capture_output=True, text=True, timeout=50)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["127.0.0.1", "127.0.0.1"]
