"""RPC targets for tests/scripts/multihost_trainer.py: run on a collector server, say where it runs.

Importable on every rank (the trainer script's directory is on ``sys.path`` of every rank that
runs it), so the trainer can call them over ``torch.distributed.rpc``.
"""
from __future__ import annotations

import fcntl
import os
import socket
import struct

SIOCGIFADDR = 0x8915


def interface_address(ifname: str) -> str:
    """IPv4 address of ``ifname`` in this process's network namespace."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        packed = fcntl.ioctl(sock.fileno(), SIOCGIFADDR, struct.pack("256s", ifname.encode()[:15]))
    return socket.inet_ntoa(packed[20:24])


def where() -> dict:
    """This process: pid, hostname, network namespace (inode) and its interface's address."""
    ifname = os.environ.get("TP_SOCKET_IFNAME") or os.environ.get("GLOO_SOCKET_IFNAME") or "lo"
    return {
        "pid": os.getpid(),
        "hostname": socket.gethostname(),
        "netns": os.stat("/proc/self/ns/net").st_ino,
        "ifname": ifname,
        "address": interface_address(ifname),
    }
