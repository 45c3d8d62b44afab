"""A real SLURM cluster on this machine, for trying job scripts and for the tests.

Starts munged, MariaDB + slurmdbd (accounting: without it submitit cannot read job states),
slurmctld and one slurmd per node. With ``--nodes 2`` each slurmd runs in its own network
namespace with its own address (10.77.0.1, 10.77.0.2, ...), the root namespace being attached
to the same bridge at 10.77.0.254, so a ``nodes=2`` job really spans two addresses.

    python slurm/devcluster.py install          # apt-get the Debian packages (root)
    python slurm/devcluster.py start --nodes 2  # prints the `export SLURM_CONF=...` line
    python slurm/devcluster.py status
    python slurm/devcluster.py stop

Partition ``debug`` (the default) holds every node; with 2+ nodes, ``learner`` holds node n1 and
``envs`` the others, for heterogeneous jobs (a trainer group and collector groups).

Needs root. Also importable (by path) from tests: ``start(nodes, workdir) -> Cluster``,
``stop(workdir)``, and ``HostNetwork`` for "hosts" in network namespaces without SLURM.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

PACKAGES = (
    "munge",
    "slurmctld",
    "slurmd",
    "slurm-client",
    "slurmdbd",
    "slurm-wlm-mysql-plugin",
    "mariadb-server",
    "iproute2",
)
DEFAULT_DIR = Path("/tmp/rpc-collectors-slurm")
MYSQL_SOCKET = Path("/run/mysqld/mysqld.sock")
MARIADB_SMALL = ("--innodb-log-file-size=8M", "--innodb-buffer-pool-size=32M")  # smaller files, faster start
MUNGE_RUN_DIR = Path("/run/munge")
SLURMCTLD_PORT = 6817
SLURMDBD_PORT = 6819
CLUSTER_SUBNET = "10.77.0"
CLUSTER_NETNS_PREFIX = "rpcc-slurm"
CPUS_PER_NODE = 8  # declared, not real: lets a 2-core VM run several tasks per node
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0
# Set in every daemon's environment; slurmstepd inherits it, so stop() can find leftovers.
MARKER_VAR = "RPCC_DEVCLUSTER_DIR"


class ClusterError(RuntimeError):
    """The dev cluster could not be started or stopped; the message carries the logs."""


# --------------------------------------------------------------------------- helpers


def _run(cmd: Sequence[str], check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    """Run a short command, capturing its output; raise ClusterError with it on failure."""
    proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=60, **kwargs)
    if check and proc.returncode != 0:
        raise ClusterError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
    return proc


def _wait_for(what: str, ready: Callable[[], bool], timeout: float, diagnose: Callable[[], str]) -> None:
    """Poll ``ready`` every 0.2 s until it is true; after ``timeout`` raise with ``diagnose()``."""
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise ClusterError(f"timed out after {timeout:.0f} s waiting for {what}\n{diagnose()}")
        time.sleep(0.2)


def _port_open(host: str, port: int) -> bool:
    """Whether something accepts TCP connections at host:port."""
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def _tail(path: Path, lines: int = 25) -> str:
    """The last lines of a log file, headed by its path."""
    if not path.exists():
        return f"--- {path}: (missing)"
    text = path.read_text(errors="replace").splitlines()[-lines:]
    return f"--- {path} (last {len(text)} lines)\n" + "\n".join(text)


def _process_alive(pid: int) -> bool:
    """Whether pid runs (a zombie child is reaped and counts as gone)."""
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    except ChildProcessError:
        pass
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return ""


def _terminate(pid: int, timeout: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM pid, wait up to timeout, then SIGKILL it and wait again."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout
        while _process_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not _process_alive(pid):
            return
    raise ClusterError(f"process {pid} ({_cmdline(pid)}) survived SIGKILL")


# --------------------------------------------------------------------------- namespaces


@dataclass(frozen=True)
class Host:
    """One namespace "host": run commands in it with ``HostNetwork.command``."""

    index: int
    netns: str
    address: str
    ifname: str

    @property
    def env(self) -> dict[str, str]:
        """Variables that make gloo and TensorPipe use this host's interface."""
        return {"GLOO_SOCKET_IFNAME": self.ifname, "TP_SOCKET_IFNAME": self.ifname}


@dataclass
class HostNetwork:
    """N "hosts" in network namespaces, each with its own address on one bridge.

    The bridge lives in namespace ``<prefix>-br``; host i (1-based) in ``<prefix>-h<i>`` with
    address ``<subnet>.<i>`` on interface ``ifname``. The root namespace is attached at
    ``<subnet>.254`` so that traffic to the subnet never leaves through the default route.
    Use distinct ``prefix`` and ``subnet`` for networks that exist at the same time.
    """

    n_hosts: int
    prefix: str = "rpcc"
    subnet: str = "10.78.0"
    ifname: str = "veth0"
    hosts: list[Host] = field(default_factory=list, init=False)

    @property
    def bridge_netns(self) -> str:
        return f"{self.prefix}-br"

    @property
    def root_ifname(self) -> str:
        return f"{self.prefix}-root"[:15]

    @property
    def root_address(self) -> str:
        return f"{self.subnet}.254"

    def create(self) -> "HostNetwork":
        """Create the bridge, the hosts and the root attachment (tearing down leftovers first)."""
        if not 1 <= self.n_hosts <= 250:
            raise ValueError(f"n_hosts={self.n_hosts!r}: expected 1 to 250 hosts")
        self.teardown()
        br = self.bridge_netns
        try:
            _run(["ip", "netns", "add", br])
            _run(["ip", "-n", br, "link", "add", "br0", "type", "bridge"])
            _run(["ip", "-n", br, "link", "set", "br0", "up"])
            for i in range(1, self.n_hosts + 1):
                self.hosts.append(self._add_host(i))
            _run(["ip", "link", "add", self.root_ifname, "type", "veth", "peer", "name", "p254", "netns", br])
            _run(["ip", "-n", br, "link", "set", "p254", "master", "br0", "up"])
            _run(["ip", "addr", "add", f"{self.root_address}/24", "dev", self.root_ifname])
            _run(["ip", "link", "set", self.root_ifname, "up"])
        except BaseException:
            self.teardown()
            raise
        return self

    def _add_host(self, i: int) -> Host:
        host = Host(i, f"{self.prefix}-h{i}", f"{self.subnet}.{i}", self.ifname)
        br = self.bridge_netns
        _run(["ip", "netns", "add", host.netns])
        _run(["ip", "-n", br, "link", "add", f"p{i}", "type", "veth", "peer", "name", self.ifname,
              "netns", host.netns])
        _run(["ip", "-n", br, "link", "set", f"p{i}", "master", "br0", "up"])
        _run(["ip", "-n", host.netns, "addr", "add", f"{host.address}/24", "dev", self.ifname])
        _run(["ip", "-n", host.netns, "link", "set", self.ifname, "up"])
        _run(["ip", "-n", host.netns, "link", "set", "lo", "up"])
        return host

    def command(self, index: int, argv: Sequence[str]) -> list[str]:
        """argv prefixed so that it runs in host ``index`` (nsenter keeps /sys and cgroupfs)."""
        return ["nsenter", f"--net=/run/netns/{self.host(index).netns}", *argv]

    def popen(self, index: int, argv: Sequence[str], env: dict[str, str] | None = None,
              **kwargs) -> subprocess.Popen:
        """Start argv in host ``index`` with its interface variables added to ``env``."""
        full_env = {**(os.environ if env is None else env), **self.host(index).env}
        return subprocess.Popen(self.command(index, argv), env=full_env, **kwargs)

    def host(self, index: int) -> Host:
        """Host ``index`` (1-based)."""
        if not 1 <= index <= len(self.hosts):
            raise ValueError(f"index={index!r}: expected 1 to {len(self.hosts)}")
        return self.hosts[index - 1]

    def cut(self, index: int) -> None:
        """Take host ``index`` off the bridge (its TCP connections stall, they do not fail)."""
        _run(["ip", "-n", self.bridge_netns, "link", "set", f"p{self.host(index).index}", "down"])

    def restore(self, index: int) -> None:
        """Put host ``index`` back on the bridge."""
        _run(["ip", "-n", self.bridge_netns, "link", "set", f"p{self.host(index).index}", "up"])

    def teardown(self) -> None:
        """End every process in the namespaces, delete them and the root link. Idempotent."""
        teardown_namespaces(self.prefix)
        if Path(f"/sys/class/net/{self.root_ifname}").exists():
            _run(["ip", "link", "del", self.root_ifname], check=False)
        self.hosts.clear()

    def __enter__(self) -> "HostNetwork":
        return self.create()

    def __exit__(self, *exc) -> None:
        self.teardown()


def teardown_namespaces(prefix: str) -> None:
    """Terminate the processes in every namespace named ``<prefix>-*`` and delete it."""
    listing = _run(["ip", "netns", "list"], check=False).stdout.split("\n")
    for name in [line.split()[0] for line in listing if line.startswith(f"{prefix}-")]:
        pids = _run(["ip", "netns", "pids", name], check=False).stdout.split()
        for pid in pids:
            _terminate(int(pid))
        _run(["ip", "netns", "del", name], check=False)


# --------------------------------------------------------------------------- install


def missing_packages() -> list[str]:
    """The Debian packages of PACKAGES that are not installed."""
    def installed(pkg: str) -> bool:
        proc = subprocess.run(["dpkg-query", "-W", "-f=${Status}", pkg], capture_output=True, text=True)
        return proc.stdout.strip() == "install ok installed"
    return [pkg for pkg in PACKAGES if not installed(pkg)]


def install() -> None:
    """apt-get install the missing packages (noninteractive, no recommends). Needs root."""
    missing = missing_packages()
    if not missing:
        print("devcluster: all packages installed")
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-q"], check=True, env=env, timeout=600)
    subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing],
                   check=True, env=env, timeout=1200)


# --------------------------------------------------------------------------- cluster


@dataclass(frozen=True)
class Cluster:
    """A running dev cluster: export ``env`` (or just SLURM_CONF) to use it."""

    workdir: Path
    nodes: dict[str, str]  # node name -> address

    @property
    def slurm_conf(self) -> Path:
        return self.workdir / "etc" / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.slurm_conf)}

    def log(self, name: str) -> Path:
        """Path of a daemon's log: munged, mariadb, slurmdbd, slurmctld, slurmd-<node>."""
        return self.workdir / "log" / f"{name}.log"

    def logs(self) -> str:
        """Tails of the controller's and the nodes' logs, for error messages."""
        names = ["slurmctld", "slurmdbd"] + [f"slurmd-{n}" for n in self.nodes]
        return "\n".join(_tail(self.log(name)) for name in names)


def _hostname() -> str:
    return socket.gethostname().split(".")[0]


def _real_memory_mb(nodes: int) -> int:
    """90% of what slurmd detects (more drains the node), shared among the nodes."""
    out = _run(["slurmd", "-C"]).stdout
    total = int(out.split("RealMemory=")[1].split()[0])
    return int(total * 0.9) // nodes


def _slurm_conf(workdir: Path, nodes: dict[str, str], ctld_addr: str) -> str:
    host = _hostname()
    mem = _real_memory_mb(len(nodes))
    node_lines = "\n".join(
        f"NodeName={name} NodeHostname={host} NodeAddr={addr} CPUs={CPUS_PER_NODE} "
        f"RealMemory={mem} State=UNKNOWN"
        for name, addr in nodes.items()
    )
    # cred_expire: also how long a requeued job waits before it may start again (SLURM's default: 120 s);
    # sched_interval, bf_interval: it starts within seconds of that, not at the next scheduling pass (up to 60 s)
    return f"""\
ClusterName=rpccdev
SlurmctldHost={host}({ctld_addr})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
SwitchType=switch/none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/linux
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort={SLURMDBD_PORT}
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=5
AuthInfo=cred_expire=15
MailProg=/bin/true
SlurmctldPort={SLURMCTLD_PORT}
StateSaveLocation={workdir}/state
SlurmdSpoolDir={workdir}/spool/%n
SlurmctldPidFile={workdir}/run/slurmctld.pid
SlurmdPidFile={workdir}/run/slurmd-%n.pid
SlurmctldLogFile={workdir}/log/slurmctld.log
SlurmdLogFile={workdir}/log/slurmd-%n.log
{node_lines}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
{_het_partitions(list(nodes))}"""


def _het_partitions(names: list[str]) -> str:
    """With 2+ nodes: ``learner`` (the first node) and ``envs`` (the others), beside ``debug``, for a
    heterogeneous job's trainer group and collector groups (``slurm.submit(groups=...)``)."""
    if len(names) < 2:
        return ""
    return (f"PartitionName=learner Nodes={names[0]} MaxTime=INFINITE State=UP\n"
            f"PartitionName=envs Nodes={','.join(names[1:])} MaxTime=INFINITE State=UP\n")


def _slurmdbd_conf(workdir: Path) -> str:
    return f"""\
AuthType=auth/munge
DbdHost=localhost
DbdPort={SLURMDBD_PORT}
SlurmUser=root
LogFile={workdir}/log/slurmdbd.log
PidFile={workdir}/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=root
StorageLoc=slurm_acct_db
"""


class _Launcher:
    """Starts the daemons in the foreground of their own sessions and records their pids."""

    def __init__(self, workdir: Path, env: dict[str, str]):
        self.workdir = workdir
        self.env = {**env, MARKER_VAR: str(workdir)}
        self.pids_file = workdir / "run" / "pids.json"

    def spawn(self, name: str, argv: Sequence[str], user: str | None = None) -> subprocess.Popen:
        """Start argv (as ``user``, its group too) with output to log/<name>.out."""
        with open(self.workdir / "log" / f"{name}.out", "ab") as log:
            proc = subprocess.Popen(list(argv), env=self.env, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True,
                                    user=user, group=user, extra_groups=[] if user else None)
        pids = _read_pids(self.workdir)
        daemon = next(arg for arg in argv if arg.startswith("/usr/sbin/"))  # after nsenter's args
        pids.append([name, proc.pid, daemon])
        self.pids_file.write_text(json.dumps(pids))
        return proc

    def wait_ready(self, proc: subprocess.Popen, what: str, ready: Callable[[], bool],
                   logs: Sequence[Path]) -> None:
        """Wait for ``ready``; fail early, with the logs, if the process exits."""
        def check() -> bool:
            if proc.poll() is not None:
                raise ClusterError(f"{what} exited with {proc.returncode}\n" +
                                   "\n".join(_tail(p) for p in logs))
            return ready()
        _wait_for(what, check, START_TIMEOUT_S, lambda: "\n".join(_tail(p) for p in logs))


def _read_pids(workdir: Path) -> list[list]:
    path = workdir / "run" / "pids.json"
    return json.loads(path.read_text()) if path.exists() else []


def _check_can_start() -> None:
    if os.geteuid() != 0:
        raise ClusterError("the dev cluster needs root (daemons, /run, network namespaces)")
    missing = missing_packages()
    if missing:
        raise ClusterError(f"missing Debian packages {missing}: run `python {__file__} install`")


def _check_nothing_running() -> None:
    with socket.socket(socket.AF_UNIX) as sock:
        mysql_up = sock.connect_ex(str(MYSQL_SOCKET)) == 0
    if _port_open("127.0.0.1", SLURMCTLD_PORT) or mysql_up:
        raise ClusterError(
            f"a slurmctld (port {SLURMCTLD_PORT}) or MariaDB ({MYSQL_SOCKET}) already runs here: "
            f"stop it first (`python {__file__} stop --dir DIR`)"
        )


def _prepare_workdir(workdir: Path, nodes: int) -> None:
    """Create the directories; wipe state and database together if the node count changed."""
    mode_file = workdir / "nodes"
    if mode_file.exists() and mode_file.read_text().strip() != str(nodes):
        print(f"devcluster: {workdir} was used with {mode_file.read_text().strip()} node(s): "
              "wiping its SLURM state and database", file=sys.stderr)
        for sub in ("state", "spool", "mysql"):
            shutil.rmtree(workdir / sub, ignore_errors=True)
    for sub in ("etc", "state", "spool", "log", "run"):
        (workdir / sub).mkdir(parents=True, exist_ok=True)
    workdir.chmod(0o755)  # MariaDB runs as mysql and must reach its datadir
    mode_file.write_text(str(nodes))


def _start_munge(launcher: _Launcher) -> None:
    MUNGE_RUN_DIR.mkdir(exist_ok=True)
    shutil.chown(MUNGE_RUN_DIR, "munge", "munge")
    log = launcher.workdir / "log" / "munged.out"
    proc = launcher.spawn("munged", ["/usr/sbin/munged", "--foreground"], user="munge")
    launcher.wait_ready(proc, "munged", lambda: _run(["munge", "-n"], check=False).returncode == 0, [log])


def _start_mariadb(launcher: _Launcher) -> None:
    datadir = launcher.workdir / "mysql"
    if not (datadir / "mysql").exists():
        datadir.mkdir(exist_ok=True)
        shutil.chown(datadir, "mysql", "mysql")
        _run(["mariadb-install-db", "--user=mysql", f"--datadir={datadir}",
              "--auth-root-authentication-method=socket", "--skip-test-db", *MARIADB_SMALL])
    MYSQL_SOCKET.parent.mkdir(exist_ok=True)
    shutil.chown(MYSQL_SOCKET.parent, "mysql", "mysql")
    log = launcher.workdir / "log" / "mariadb.out"  # its error log goes to stderr
    proc = launcher.spawn("mariadb", [
        "/usr/sbin/mariadbd", "--user=mysql", f"--datadir={datadir}", f"--socket={MYSQL_SOCKET}",
        "--skip-networking", f"--pid-file={datadir}/mariadb.pid", *MARIADB_SMALL,
    ])
    ping = ["mariadb-admin", f"--socket={MYSQL_SOCKET}", "ping"]
    launcher.wait_ready(proc, "MariaDB", lambda: _run(ping, check=False).returncode == 0, [log])


def _start_slurm_daemons(launcher: _Launcher, cluster: Cluster, network: HostNetwork | None) -> None:
    dbd = launcher.spawn("slurmdbd", ["/usr/sbin/slurmdbd", "-D"])
    launcher.wait_ready(dbd, "slurmdbd", lambda: _port_open("127.0.0.1", SLURMDBD_PORT),
                        [cluster.log("slurmdbd"), launcher.workdir / "log" / "slurmdbd.out"])
    ctld = launcher.spawn("slurmctld", ["/usr/sbin/slurmctld", "-D"])
    launcher.wait_ready(ctld, "slurmctld", lambda: _port_open("127.0.0.1", SLURMCTLD_PORT),
                        [cluster.log("slurmctld"), launcher.workdir / "log" / "slurmctld.out"])
    procs = []
    for i, name in enumerate(cluster.nodes, start=1):
        argv = ["/usr/sbin/slurmd", "-D", "-N", name]
        procs.append(launcher.spawn(f"slurmd-{name}", network.command(i, argv) if network else argv))

    def all_idle() -> bool:
        for proc in procs:
            if proc.poll() is not None:
                raise ClusterError(f"a slurmd exited with {proc.returncode}\n{cluster.logs()}")
        out = _run(["sinfo", "-h", "-N", "-o", "%N %T"], check=False, env=cluster.env).stdout
        states = dict(line.split() for line in out.splitlines() if line.strip())
        return len(states) == len(cluster.nodes) and set(states.values()) == {"idle"}

    _wait_for("every node idle in sinfo", all_idle, START_TIMEOUT_S, cluster.logs)


def start(nodes: int = 1, workdir: Path | str = DEFAULT_DIR) -> Cluster:
    """Start a dev cluster of ``nodes`` nodes (1: on loopback; 2+: in namespaces) in ``workdir``.

    Returns once ``sinfo`` shows every node idle; on any failure everything started is stopped
    and a ClusterError carrying the daemons' log tails is raised.
    """
    if not isinstance(nodes, int) or not 1 <= nodes <= 8:
        raise ValueError(f"nodes={nodes!r}: expected an int from 1 to 8")
    workdir = Path(workdir).resolve()
    _check_can_start()
    stop(workdir)
    _check_nothing_running()
    _prepare_workdir(workdir, nodes)
    network = HostNetwork(nodes, prefix=CLUSTER_NETNS_PREFIX, subnet=CLUSTER_SUBNET) if nodes > 1 else None
    addresses = [h.address for h in network.create().hosts] if network else ["127.0.0.1"]
    cluster = Cluster(workdir, {f"n{i}": addr for i, addr in enumerate(addresses, start=1)})
    ctld_addr = network.root_address if network else "127.0.0.1"
    cluster.slurm_conf.write_text(_slurm_conf(workdir, cluster.nodes, ctld_addr))
    dbd_conf = workdir / "etc" / "slurmdbd.conf"
    dbd_conf.write_text(_slurmdbd_conf(workdir))
    dbd_conf.chmod(0o600)
    launcher = _Launcher(workdir, cluster.env)
    try:
        _start_munge(launcher)
        _start_mariadb(launcher)
        _start_slurm_daemons(launcher, cluster, network)
    except BaseException:
        stop(workdir)
        raise
    return cluster


def _cancel_jobs(workdir: Path) -> None:
    """scancel every job of the cluster and wait (bounded) until squeue is empty."""
    env = {**os.environ, "SLURM_CONF": str(workdir / "etc" / "slurm.conf")}
    _run(["scancel", "--full", "--user", "root"], check=False, env=env)
    def queue_empty() -> bool:
        proc = _run(["squeue", "-h", "-o", "%i"], check=False, env=env)
        return proc.returncode != 0 or not proc.stdout.strip()
    try:
        _wait_for("the job queue to empty", queue_empty, STOP_TIMEOUT_S, lambda: "")
    except ClusterError as err:
        print(f"devcluster: {err}; killing what is left", file=sys.stderr)


def _leftover_job_processes(workdir: Path) -> list[int]:
    """Pids (slurmstepd and the like) whose environment carries this cluster's marker."""
    marker = f"{MARKER_VAR}={workdir}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if marker in (entry / "environ").read_bytes().split(b"\0"):
                    pids.append(int(entry.name))
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                continue
    return pids


def _alive_daemons(workdir: Path) -> list[tuple[str, int]]:
    """(name, pid) of the daemons recorded in workdir that still run, in start order."""
    return [(name, pid) for name, pid, exe in _read_pids(workdir)
            if _process_alive(pid) and exe in _cmdline(pid)]


def stop(workdir: Path | str = DEFAULT_DIR) -> None:
    """Stop every daemon started in ``workdir``, their job steps, and the namespaces. Idempotent."""
    workdir = Path(workdir).resolve()
    daemons = _alive_daemons(workdir)
    names = {name for name, _ in daemons}
    if "slurmctld" in names:
        _cancel_jobs(workdir)
    for _, pid in reversed(daemons):
        _terminate(pid)
    for pid in _leftover_job_processes(workdir):
        _terminate(pid)
    nodes_file = workdir / "nodes"
    if nodes_file.exists() and nodes_file.read_text().strip() != "1":
        HostNetwork(1, prefix=CLUSTER_NETNS_PREFIX, subnet=CLUSTER_SUBNET).teardown()
    if "mariadb" in names:
        MYSQL_SOCKET.unlink(missing_ok=True)
    (workdir / "run" / "pids.json").unlink(missing_ok=True)


def status(workdir: Path | str = DEFAULT_DIR) -> str:
    """A human-readable state: daemons alive or not, and sinfo's view."""
    workdir = Path(workdir).resolve()
    lines = [f"{name:16} pid {pid:7} {'running' if _process_alive(pid) else 'GONE'}"
             for name, pid, _ in _read_pids(workdir)] or ["no daemons recorded"]
    env = {**os.environ, "SLURM_CONF": str(workdir / "etc" / "slurm.conf")}
    if _port_open("127.0.0.1", SLURMCTLD_PORT):
        lines.append(_run(["sinfo", "-N"], check=False, env=env).stdout.rstrip())
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("install", help="apt-get install the Debian packages the cluster needs")
    for name in ("start", "stop", "status"):
        p = sub.add_parser(name)
        p.add_argument("--dir", type=Path, default=DEFAULT_DIR, help=f"working directory ({DEFAULT_DIR})")
    sub.choices["start"].add_argument("--nodes", type=int, choices=range(1, 9), default=1)
    args = parser.parse_args(argv)
    try:
        if args.command == "install":
            install()
        elif args.command == "start":
            cluster = start(args.nodes, args.dir)
            print(f"dev cluster up: nodes {cluster.nodes}\nexport SLURM_CONF={cluster.slurm_conf}")
        elif args.command == "stop":
            stop(args.dir)
        else:
            print(status(args.dir))
    except ClusterError as err:
        print(f"devcluster: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
