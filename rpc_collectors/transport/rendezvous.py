"""Where the trainer and the collector servers meet: launch mode, addresses, ports, interfaces."""
from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import os
import socket
import struct
import threading
import urllib.parse
from dataclasses import dataclass
from typing import Iterator

import torch.distributed as dist

from rpc_collectors.core.options import LAUNCHERS

SIOCGIFADDR = 0x8915


@dataclass(frozen=True)
class Rendezvous:
    """How this process joins the RPC world."""

    # "local", "torchrun", "slurm" or "debug"
    launcher: str
    rank: int
    world_size: int
    master_addr: str
    master_port: int
    # network interface for TensorPipe and gloo
    interface: str | None
    # torchrun's agent already serves the store on master_port
    agent_store: bool = False
    # tells apart the worker names of successive collectors in one trainer
    session: str = ""
    # members join and leave a running group (world_size is not fixed)
    dynamic: bool = False

    def address(self) -> str:
        """This process's address on the rendezvous's interface (without one, ``master_addr``)."""
        return interface_address(self.interface) if self.interface else self.master_addr

    def init_method(self, timeout: float) -> str:
        """``init_rpc``'s URL: the store on master_addr:master_port, reached
        within ``timeout`` s."""
        return f"{SCHEME}://{self.master_addr}:{self.master_port}?timeout={timeout}"


def detect_launcher(launcher: str, elastic: bool = False) -> str:
    """Resolve ``launcher="auto"``: torchrun or SLURM when their variables are set, else local.

    A SLURM job of one task runs local workers, unless ``elastic`` (its collectors join later)."""
    if launcher not in LAUNCHERS:
        known = ", ".join(map(repr, LAUNCHERS))
        raise ValueError(f"launcher={launcher!r} is not known; accepted: {known}")
    if launcher == "submitit_delayed":
        raise ValueError(
            "launcher='submitit_delayed' is not supported: it is TorchRL's way to run the trainer "
            "and its collectors in one SLURM submission; accepted instead: launcher='slurm' (or "
            "'auto') with the script submitted by slurm/submit.py, one job whose task 0 trains and "
            "whose other tasks collect, or launcher='submitit' with the trainer outside a job (a "
            "login node), or elastic=True with collector jobs of slurm/submit.py --join JOBID"
        )
    # TorchRL's name for local worker processes
    if launcher == "mp":
        return "local"
    if launcher != "auto":
        return launcher
    torchrun_variables = ("RANK" in os.environ and "WORLD_SIZE" in os.environ
                          and "SLURM_JOB_ID" not in os.environ)
    if "TORCHELASTIC_RUN_ID" in os.environ or torchrun_variables:
        return "torchrun"
    if "SLURM_JOB_ID" in os.environ and (int(os.environ.get("SLURM_NTASKS", "1")) > 1 or elastic):
        return "slurm"
    return "local"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now, chosen by the kernel."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


SCHEME = "rpc-collectors"


def serve_store(host: str, port: int, timeout: float,
                argument: str = "MASTER_PORT") -> tuple[dist.TCPStore, int]:
    """Serve the rendezvous store on ``host:port`` only (``port=0``: any free port).

    Every process, this one included, reaches it as a client through the ``rpc-collectors://``
    rendezvous, so nothing listens beyond ``host``, and dropping the returned store stops the
    server: its socket closes and every wait on it fails at once. The port is bound with
    ``SO_REUSEADDR``, as TCPStore binds its own, so a port whose last connections linger in
    TIME_WAIT is free. Returns the store and its port.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                raise ValueError(f"{argument}={port} is already in use on {host}; choose a free "
                                 "port") from err
            raise
        sock.listen(1024)
        port = sock.getsockname()[1]
        store = dist.TCPStore(
            host, port, None, True, datetime.timedelta(seconds=timeout),
            wait_for_workers=False, master_listen_fd=os.dup(sock.fileno()),
        )
    return store, port


def store_client(rdv: Rendezvous, timeout: float) -> dist.TCPStore:
    """A client of the rendezvous store of ``rdv`` (the trainer's, or torchrun's agent store).

    ``ConnectionError`` when no store answers there within ``timeout`` s. torch's client would
    wait forever on a server that accepts and never answers, so it connects in a daemon thread
    of its own, left to end with that connection.
    """
    outcome: list = []

    def connect() -> None:
        try:
            outcome.append(dist.TCPStore(rdv.master_addr, rdv.master_port, None, False,
                                         datetime.timedelta(seconds=timeout)))
        except Exception as err:
            # torch's DistNetworkError and kin
            outcome.append(err)

    thread = threading.Thread(target=connect, name="rpc-collectors-store-client", daemon=True)
    thread.start()
    thread.join(timeout)
    if outcome and not isinstance(outcome[0], Exception):
        return outcome[0]
    reason = f": {str(outcome[0]).splitlines()[0]}" if outcome else ""
    raise ConnectionError(f"no rendezvous store answered at {rdv.master_addr}:{rdv.master_port} "
                          f"within {timeout:g} s{reason}")


def stopped_key(rdv: Rendezvous) -> str:
    """Store key the trainer sets once its RPC agent stopped: the servers stop theirs after it."""
    return f"rpc_collectors/stopped/{rdv.session}"


def _rendezvous_handler(url: str, **kwargs: object) -> Iterator:
    """``rpc-collectors://host:port?timeout=T&rank=R&world_size=W``: a client of the store there."""
    parsed = urllib.parse.urlparse(url)
    query = dict(urllib.parse.parse_qsl(parsed.query))
    rank, world_size = int(query["rank"]), int(query["world_size"])
    timeout = datetime.timedelta(seconds=float(query["timeout"]))
    store = dist.TCPStore(parsed.hostname, parsed.port, None, False, timeout)
    yield store, rank, world_size
    raise RuntimeError("the rpc-collectors rendezvous cannot be retried")


dist.register_rendezvous_handler(SCHEME, _rendezvous_handler)


def interface_address(name: str) -> str:
    """The IPv4 address of network interface ``name``."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            packed = fcntl.ioctl(sock.fileno(), SIOCGIFADDR,
                                 struct.pack("256s", name.encode()[:15]))
        except OSError as err:
            names = [n for _, n in socket.if_nameindex()]
            raise ValueError(
                f"network interface {name!r} has no IPv4 address here; interfaces: "
                f"{', '.join(names)}"
            ) from err
    return socket.inet_ntoa(packed[20:24])


def interface_towards(addr: str) -> str:
    """The name of the interface this host uses to reach ``addr``."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        # UDP connect sends nothing
        sock.connect((socket.gethostbyname(addr), 9))
        local = sock.getsockname()[0]
    for _, name in socket.if_nameindex():
        with contextlib.suppress(ValueError):
            if interface_address(name) == local:
                return name
    raise ValueError(f"no network interface of this host has the address {local} that routes to "
                     f"{addr}")


def from_environment(launcher: str) -> Rendezvous:
    """Rendezvous of a torchrun or SLURM run, read from RANK, WORLD_SIZE,
    MASTER_ADDR, MASTER_PORT."""
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
               if k not in os.environ]
    if missing:
        raise ValueError(
            f"launcher={launcher!r} needs the environment variables {', '.join(missing)}; run "
            "under torchrun, or submit with rpc_collectors.cluster.submission, or use "
            "launcher='local'"
        )
    addr, port = os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"MASTER_PORT={port!r} is invalid; accepted: a port number in 1..65535")
    interface = interface_for(addr)
    return Rendezvous(
        launcher=launcher, rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]),
        master_addr=addr, master_port=int(port), interface=interface,
        agent_store=os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
    )


def interface_for(addr: str) -> str:
    """``TP_SOCKET_IFNAME``/``GLOO_SOCKET_IFNAME`` when set (checked), else the interface
    that routes to ``addr``."""
    interface = os.environ.get("TP_SOCKET_IFNAME") or os.environ.get("GLOO_SOCKET_IFNAME")
    if interface:
        # a wrong name fails here, not as a hang
        interface_address(interface)
        return interface
    return interface_towards(addr)


@contextlib.contextmanager
def socket_interface(interface: str | None) -> Iterator[None]:
    """Make TensorPipe and gloo bind to ``interface`` while the RPC agent starts.

    TensorPipe reads ``TP_SOCKET_IFNAME`` and gloo ``GLOO_SOCKET_IFNAME`` only then; they are
    restored afterwards so the rest of the process (a DDP group, say) is unaffected.
    """
    keys = ("TP_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
    saved = {k: os.environ.get(k) for k in keys}
    if interface:
        for k in keys:
            os.environ[k] = interface
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def host_id() -> str:
    """Identifies this machine (boot), so peers can tell whether they share memory."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"
