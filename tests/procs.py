"""Process helpers for multi-process tests: who descends from whom, who is alive, who listens, what
this process holds."""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import re
import signal
import subprocess
import time
from typing import Any, Callable, Iterator


def _parents() -> dict[int, int]:
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            if fields[0] != "Z":  # zombies are dead
                parents[int(entry)] = int(fields[1])
    return parents


def descendants(pid: int | None = None) -> set[int]:
    """Live processes below ``pid`` (default: this process)."""
    root = os.getpid() if pid is None else pid
    parents, found, frontier = _parents(), set(), {root}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


MARK = "RPC_COLLECTORS_TEST_MARK"  # an environment variable that every process a run starts inherits


def marked(mark: str) -> set[int]:
    """Live processes whose environment holds ``MARK=mark``: all that a run started with it has
    started, also those that left its process tree (daemons, such as Ray's)."""
    entry, found = f"{MARK}={mark}".encode(), set()
    for pid in _parents():
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if entry in f.read().split(b"\0"):
                    found.add(pid)
        except OSError:  # gone, or not ours to read
            continue
    return found


def alive(pid: int) -> bool:
    return pid in _parents()


def wait_gone(pids: set[int], timeout: float = 10.0) -> set[int]:
    """Wait until none of ``pids`` is alive; return those still alive at the timeout."""
    deadline = time.monotonic() + timeout
    while True:
        left = {p for p in pids if alive(p)}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def run_marked(cmd: list[str], timeout: float, env: dict, linger: float = 30.0) -> tuple[subprocess.CompletedProcess, set[int]]:
    """Run ``cmd`` as :func:`run_in_session` does, marked (see :func:`marked`); return its output and
    the processes it started still alive ``linger`` seconds after it ended (killed then)."""
    mark = f"{os.getpid()}-{time.monotonic_ns()}"
    try:
        proc = run_in_session(cmd, timeout, dict(env, **{MARK: mark}))
        deadline = time.monotonic() + linger
        while marked(mark) and time.monotonic() < deadline:
            time.sleep(0.2)
        return proc, marked(mark)
    finally:
        for pid in marked(mark):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def unix_listeners(pid: int) -> set[str]:
    """Addresses of the Unix sockets that ``pid`` listens on, as ``connect`` takes them (an abstract
    name, shown with a leading "@" in /proc/net/unix, starts with NUL)."""
    inodes, found = _socket_inodes(pid), set()
    with open(f"/proc/{pid}/net/unix") as f:
        for line in list(f)[1:]:
            cols = line.split(maxsplit=7)  # Num RefCount Protocol Flags Type St Inode Path
            if len(cols) == 8 and int(cols[3], 16) & 0x10000 and cols[6] in inodes:  # __SO_ACCEPTCON: listening
                path = cols[7].rstrip("\n")
                found.add("\0" + path[1:] if path.startswith("@") else path)
    return found


def listening_addresses(pid: int) -> set[str]:
    """IPv4/IPv6 addresses (hex, as in /proc/net/tcp) that ``pid`` listens on over TCP."""
    inodes = _socket_inodes(pid)
    addresses = set()
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as f:
            for line in list(f)[1:]:
                cols = line.split()
                if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                    addresses.add(cols[1].split(":")[0])
    return addresses


LOOPBACK = {"0100007F", "00000000000000000000000001000000"}


def ctrl_c_raises() -> None:
    """``preexec_fn`` of a process a test sends SIGINT: Python in it turns SIGINT into
    KeyboardInterrupt, also when the test run itself ignores SIGINT (a background job, nohup,
    some CI runners), which the process would otherwise inherit."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def kill_sessions(procs: list[subprocess.Popen], timeout: float = 10.0) -> None:
    """SIGKILL the process group of each of ``procs`` still running (started with
    ``start_new_session=True``) and reap it."""
    for proc in procs:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass


@contextlib.contextmanager
def killed_at_exit(start: Callable[..., Any]) -> Iterator[Callable[..., Any]]:
    """``start`` wrapped so that every run it starts (anything with ``kill()``) is killed at exit,
    also after a failure: the body of a test fixture that starts runs."""
    started: list[Any] = []

    def tracked(*args: Any, **kwargs: Any) -> Any:
        run = start(*args, **kwargs)
        started.append(run)
        return run

    try:
        yield tracked
    finally:
        for run in started:
            run.kill()


def run_in_session(cmd: list[str], timeout: float, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``cmd`` (with ``env``, default this process's) in a session of its own and return its output;
    its whole process group is killed afterwards (a launcher's children too), also when it hangs or the test fails."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env=env)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def _what(target: str) -> str:
    """What an open file or mapping names, without the parts that differ between two of a kind
    (inode numbers, the random part of a temporary name)."""
    return re.sub(r"_[A-Za-z0-9_]{8}( \(deleted\))?$", "", re.sub(r"\[\d+\]", "", target))


def _shm_names() -> set[str]:
    """The names in /dev/shm this process may have made: this package's, and those with its pid
    (torch's, Python's); other programs' files come and go meanwhile."""
    mine = re.compile(rf"^rpc_collectors|(?<!\d){os.getpid()}(?!\d)")
    return {name for name in os.listdir("/dev/shm") if mine.search(name)} if os.path.isdir("/dev/shm") else set()


@dataclasses.dataclass
class Holdings:
    """What this process holds: live descendants, threads (kernel tasks, so native ones too), open
    descriptors and shared-memory mappings (each counted by what it names), and its names in /dev/shm."""

    processes: set[int]
    threads: collections.Counter  # by the kernel's name of each thread (comm)
    fds: collections.Counter
    shm_maps: collections.Counter
    shm_names: set[str]

    @classmethod
    def now(cls) -> "Holdings":
        fds: collections.Counter = collections.Counter()
        for fd in os.listdir("/proc/self/fd"):
            try:
                fds[_what(os.readlink(f"/proc/self/fd/{fd}"))] += 1
            except OSError:  # the descriptor listdir itself used, closed since
                continue
        shm_maps: collections.Counter = collections.Counter()
        with open("/proc/self/maps") as f:
            for path in {line.split(maxsplit=5)[5].strip() for line in f if " /dev/shm/" in line}:
                shm_maps[_what(path)] += 1
        return cls(descendants(), _thread_names(), fds, shm_maps, _shm_names())

    def beyond(self, before: "Holdings", ignore: set[int] = frozenset()) -> dict:
        """What this holds that ``before`` did not (processes in ``ignore`` aside); empty: nothing."""
        more = {
            "processes": self.processes - before.processes - set(ignore),
            "threads": _more_threads(self.threads, before.threads),
            "fds": dict(self.fds - before.fds),
            "shm_maps": dict(self.shm_maps - before.shm_maps),
            "shm_names": self.shm_names - before.shm_names,
        }
        return {what: held for what, held in more.items() if held}


# gRPC's EventEngine pool, loaded into this process by Ray in an earlier test, grows and shrinks on
# gRPC's own timer long after Ray shut down: its threads are nobody's that a test here starts.
NOT_OURS = frozenset({"event_engine"})


def _thread_names() -> collections.Counter:
    names: collections.Counter = collections.Counter()
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
        except OSError:  # the thread ended since listdir
            continue
        if name not in NOT_OURS:
            names[name] += 1
    return names


def _more_threads(now: collections.Counter, before: collections.Counter) -> dict:
    """The threads ``now`` holds beyond ``before`` by name, when it holds more in all; else none."""
    if sum(now.values()) <= sum(before.values()):
        return {}
    return dict(now - before) or {"(renamed)": sum(now.values()) - sum(before.values())}


def holds_beyond(before: Holdings, timeout: float = 10.0, ignore: set[int] = frozenset()) -> dict:
    """Wait up to ``timeout`` s until this process holds nothing ``before`` did not (processes
    exit, threads end and descriptors close a little after a shutdown); return what it still holds then."""
    deadline = time.monotonic() + timeout
    while True:
        left = Holdings.now().beyond(before, ignore)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)
