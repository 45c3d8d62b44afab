"""What a SLURM task finds out about the host it runs on: a name resolved, the node's address as
SLURM knows it, whether a port is free for the rendezvous store, and the network interfaces (which
exist, which only reach this host), for :mod:`~rpc_collectors.cluster.submission` to choose the
master's address and each task's interface.
"""
from __future__ import annotations

import ipaddress
import os
import re
import socket
import subprocess

from rpc_collectors.transport.rendezvous import interface_address


def _resolve(name: str) -> str | None:
    try:
        return socket.gethostbyname(name)
    except OSError:
        return None


def _scontrol_node_addr(node: str) -> str | None:
    try:
        out = subprocess.run(["scontrol", "show", "node", node], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"\bNodeAddr=(\S+)", out)
    return match.group(1) if match else None


def _check_port_free(port: int) -> None:
    """Refuse a port that is taken, binding as the rendezvous store will (a
    TIME_WAIT port is free)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError as err:
            origin = ("set in the environment" if "MASTER_PORT" in os.environ
                      else f"derived from SLURM job id {os.environ.get('SLURM_JOB_ID')}")
            raise RuntimeError(
                f"MASTER_PORT {port} ({origin}) is already in use on {socket.gethostname()}: "
                "resubmit, or export MASTER_PORT=<a free port> before submitting") from err


def _loopback(name: str) -> bool:
    """Whether interface ``name`` has no address other hosts could reach
    (loopback, or no IPv4 at all)."""
    try:
        return ipaddress.ip_address(interface_address(name)).is_loopback
    except ValueError:
        return True


def _interface_names() -> list[str]:
    return sorted(name for _, name in socket.if_nameindex())


def _check_interface(name: str) -> str:
    names = _interface_names()
    if name not in names:
        raise ValueError(f"interface={name!r} does not exist on {socket.gethostname()}; "
                         f"accepted here: {names}")
    return name
