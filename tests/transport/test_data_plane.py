"""The shared-memory data plane with real worker processes: contents, ownership, faults, memory.

``PixelEnv`` writes into every observation who made it (worker id, env index) and its step
counter, and fills the rest of the image with a byte derived from the counter, so a test can
tell from a batch alone whether any frame is missing, repeated, torn or from the wrong worker.
"""
from __future__ import annotations

import ctypes
import functools
import json
import mmap
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import gymnasium as gym
import numpy as np
import pytest
import torch
from tensordict import TensorDict

from folders import PYTHONPATH
from procs import wait_gone
from rpc_collectors import GymEnv, MultiCollector, WorkerError
from rpc_collectors.transport.data import IN_FLIGHT, SLOTS

pytestmark = [pytest.mark.multiprocess, pytest.mark.usefixtures("no_leftover_processes"), pytest.mark.timeout(90)]

SHAPE = (3, 32, 32)  # 3 KiB per observation: batches of 50+ frames go through shared memory


class PixelEnv(gym.Env):
    """uint8 image observations: bytes 0-3 the step counter, 4 the worker, 5 the env index, rest a fill byte."""

    metadata: dict = {"render_modes": []}

    def __init__(self, worker: int, index: int = 0, shape: tuple = SHAPE) -> None:
        self.observation_space = gym.spaces.Box(0, 255, shape, np.uint8)
        self.action_space = gym.spaces.Discrete(2)
        self.worker, self.index, self.counter = worker, index, 0
        self._obs = np.zeros(shape, np.uint8)

    def _render(self) -> np.ndarray:
        obs = self._obs
        obs.fill(fill_byte(self.counter))
        flat = obs.reshape(-1)
        flat[:4] = np.frombuffer(np.uint32(self.counter).tobytes(), np.uint8)
        flat[4], flat[5] = self.worker, self.index
        return obs.copy()

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._render(), {}

    def step(self, action):
        self.counter += 1
        return self._render(), 0.0, False, self.counter % 37 == 0, {}


def fill_byte(counter: int) -> int:
    return (counter * 7 + 1) % 251


def decode(obs: torch.Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(counter, worker, env index, intact) of every frame of ``obs`` [..., *SHAPE]."""
    flat = obs.reshape(-1, int(np.prod(obs.shape[-3:]))).numpy()
    counter = flat[:, :4].copy().view(np.uint32)[:, 0].astype(np.int64)
    intact = (flat[:, 6:] == ((counter * 7 + 1) % 251)[:, None].astype(np.uint8)).all(1)
    return counter, flat[:, 4].astype(np.int64), flat[:, 5].astype(np.int64), intact


def make_env(worker: int, num_envs: int | None, shape: tuple = SHAPE) -> GymEnv:
    if num_envs is None:
        return GymEnv(PixelEnv(worker, 0, shape))
    fns = [functools.partial(PixelEnv, worker, i, shape) for i in range(num_envs)]
    return GymEnv(gym.vector.SyncVectorEnv(fns, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP))


class Checker:
    """Follows every (worker, env) stream: counters must continue exactly where the last batch ended."""

    def __init__(self) -> None:
        self.next: dict[tuple[int, int], int] = {}

    def check(self, batch) -> None:
        obs, nxt = batch["observation"], batch["next", "observation"]
        c, w, e, ok = decode(obs)
        c2, w2, e2, ok2 = decode(nxt)
        assert ok.all() and ok2.all(), "a frame's pixels do not match its counter (torn or overwritten)"
        assert (c2 == c + 1).all() and (w2 == w).all() and (e2 == e).all()
        ids = batch["collector", "worker_id"].reshape(-1).numpy()
        assert (ids == w).all(), "worker_id does not name the worker whose env made the frame"
        streams: dict[tuple[int, int], list[int]] = {}
        for ci, wi, ei in zip(c, w, e):
            streams.setdefault((int(wi), int(ei)), []).append(int(ci))
        for key, counters in streams.items():
            start = self.next.get(key, counters[0])
            assert counters == list(range(start, start + len(counters))), f"frames of {key} missing or repeated"
            self.next[key] = start + len(counters)


def collector(num_envs: int | None, sync: bool, frames_per_worker: int = 60, shape: tuple = SHAPE, **kwargs):
    envs = [functools.partial(make_env, w, num_envs, shape) for w in range(2)]
    fpb = frames_per_worker * (2 if sync else 1)
    kwargs.setdefault("track_policy_version", True)  # the tests read each frame's ("collector", "worker_id")
    return MultiCollector(envs, None, sync=sync, frames_per_batch=fpb, total_frames=-1, **kwargs)


@pytest.mark.parametrize("num_envs", [None, 3], ids=["single", "vector"])
@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
def test_batches_hold_exactly_what_each_env_produced(sync, num_envs):
    with collector(num_envs, sync, frames_per_worker=60 if num_envs is None else 90) as c:
        checker, seen = Checker(), set()
        for i, batch in enumerate(c):
            checker.check(batch)
            seen.update(batch["collector", "worker_id"].unique().tolist())
            if i >= 7 and seen == {0, 1}:  # async on a loaded machine: one worker may deliver many batches first
                break
            assert i < 500, f"only workers {seen} delivered in 500 batches"
        assert [c.slots.plane.path_of(w) for w in range(2)] == ["shm", "shm"]  # the path under test


@pytest.mark.parametrize("cat_results", ["stack", 0, -1])
def test_one_sync_worker_gives_every_batch_the_same_shape(cat_results):
    """TorchRL's shapes for one worker: stacked ``[1, T]``, concatenated ``[T]``, from the first
    batch (an RPC result) to the later ones (from shared memory)."""
    envs = [functools.partial(make_env, 0, None, SHAPE)]
    with MultiCollector(envs, None, sync=True, frames_per_batch=60, total_frames=300, cat_results=cat_results) as c:
        shapes = {tuple(batch.shape) for batch in c}
        assert c.slots.plane.path_of(0) == "shm"
    assert shapes == {(1, 60) if cat_results == "stack" else (60,)}


@pytest.mark.parametrize("cat_results", ["stack", 0, -1])
def test_sync_layouts_from_shared_memory(cat_results):
    with collector(2, True, frames_per_worker=60, cat_results=cat_results) as c:
        it = iter(c)
        for _ in range(3):
            batch = next(it)
            Checker().check(batch)
        assert c.slots.plane.path_of(0) == "shm"
    expected = {"stack": (2, 2, 30), 0: (4, 30), -1: (2, 60)}[cat_results]
    assert tuple(batch.shape) == expected and batch.names[-1] == "time"


@pytest.mark.parametrize("sync, kwargs", [
    (True, {}), (True, {"cat_results": 0}), (False, {}),
    (True, {"collector_class": "sync", "num_workers_per_collector": 2}),
    (False, {"collector_class": "async", "num_workers_per_collector": 2}),
], ids=["sync", "sync-cat", "async", "sync-nodes", "async-nodes"])
def test_every_batch_reports_the_storing_device(sync, kwargs):
    """``storing_device="cpu"``: every batch (and its nested TensorDicts) says ``device=cpu``, as
    TorchRL's do: the first ones (RPC results) and the later ones, views of the shared-memory slots."""
    with collector(None, sync, frames_per_worker=20, storing_device="cpu", **kwargs) as c:
        devices, seen = [], set()
        for i, batch in enumerate(c):
            devices.append({batch.device, batch.get("next").device, batch.get("collector").device})
            seen.update(c.last_batch.worker_frames)
            if i >= 5 and seen == {0, 1}:  # async on a loaded machine: one worker may deliver many batches first
                break
            assert i < 500, f"only workers {seen} delivered in 500 batches"
        assert [c.slots.plane.path_of(w) for w in range(2)] == ["shm", "shm"]  # the path under test
    assert devices == [{torch.device("cpu")}] * len(devices)


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
def test_a_user_keeping_every_batch_finds_them_intact(sync):
    with collector(None, sync) as c:
        kept = []
        for batch in c:
            kept.append(batch)
            if len(kept) == 20:
                break
        snapshots = [b.clone() for b in kept[-3:]]
        for _ in range(4):  # the workers go on writing their slots
            next(iter(c))
    checker = Checker()
    for batch in kept:
        checker.check(batch)
    assert all((a == b).all() for a, b in zip(kept[-3:], snapshots))


def in_slot(tensor: torch.Tensor, pool) -> bool:
    return any(slot.data_ptr() <= tensor.data_ptr() < slot.data_ptr() + slot.numel() for slot in pool.slots)


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
def test_a_loop_that_drops_each_batch_gets_it_where_the_worker_wrote_it(sync):
    """No copy on the trainer while the user lets go of each batch before the next one."""
    with collector(None, sync) as c:
        checker, answered, lent = Checker(), set(), []
        for i, batch in enumerate(c):
            checker.check(batch)
            worker = 0 if sync else int(batch["collector", "worker_id"][0])
            if worker in answered:  # a worker's first batch comes as an RPC result and sets up its slots
                lent.append(in_slot(batch["observation"], c.slots.plane.pools[worker]))
            answered.add(worker)
            if len(lent) == 9:
                break
            assert i < 500, "a worker never delivered a second batch"
    assert all(lent)


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
def test_share_memory_on_a_batch_leaves_its_slot_to_the_workers(sync):
    """``share_memory_()`` moves the user's batch to memory of its own; later batches from the
    same slot still hold what the workers wrote there, and the moved batches keep their frames."""
    with collector(None, sync) as c:
        checker, moved = Checker(), []
        for i, batch in enumerate(c):
            checker.check(batch)  # fails on frames repeated from a slot the trainer no longer reads
            if i % 2 == 0:  # kept half the time, dropped the other half
                batch.share_memory_()
                moved.append((batch, batch.clone()))
            else:
                batch.share_memory_()
            if i >= 15 and c.slots.plane.path_of(0) == "shm":  # async: worker 0's first batch may come late
                break
            assert i < 500, "worker 0's batches never went through shared memory"
    assert all(batch["observation"].is_shared() for batch, _ in moved)
    assert all((batch == snapshot).all() for batch, snapshot in moved)


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
def test_batches_placed_on_another_device_leave_every_slot_free(sync):
    """With a storing device other than the host, the user's batch is a copy on that device and
    no slot is lent out: every slot not being written is free again once the batch is placed.
    ("meta" stands in for a GPU: a device whose tensors live outside host memory; tests/transport/test_cuda.py
    runs the same on a real one where there is one.)"""
    with collector(None, sync) as c:
        c.slots.plane.device = torch.device("meta")
        for i, batch in enumerate(c):
            assert all(v.device.type == "meta" for v in batch.values(True, True))
            assert tuple(batch.shape) == ((2, 60) if sync else (60,))
            pools = c.slots.plane.buffers
            assert pools, "no shared-memory buffer: the path under test was not taken"
            for pool in pools:
                assert all(pool._free(s) or s in pool._written for s in range(pool.num_slots)), "a slot is held outside the plane"
            if i == 8:
                break


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
def test_shared_buffers_are_bounded_by_slots_times_workers_times_batch_bytes(sync):
    with collector(3, sync) as c:
        it = iter(c)
        batches = [next(it) for _ in range(6)]
        shared = c.slots.plane.shared_bytes
    leaves = [v for k, v in batches[0].items(True, True) if k != ("collector", "worker_id")]
    batch_bytes = sum(v.numel() * v.element_size() for v in leaves) // (2 if sync else 1)  # one worker's
    padding = 64 * len(leaves) + mmap.PAGESIZE  # each tensor starts on a cache line, each slot on a page
    slots = SLOTS if sync else SLOTS + IN_FLIGHT - 1  # async: a slot more for each extra request in flight
    assert slots * 2 * batch_bytes <= shared <= slots * 2 * (batch_bytes + padding)


@pytest.mark.parametrize("sync, kwargs, depth", [
    (False, {}, IN_FLIGHT), (False, {"update_at_each_batch": True}, 1), (False, {"max_policy_lag": 1}, 1), (True, {}, 0),
], ids=["async", "async-weights-each-batch", "async-lag-bound", "sync"])
def test_an_async_worker_finds_its_next_request_waiting_as_it_finishes_a_batch(sync, kwargs, depth):
    """Async (weights not pushed after each batch): each local worker with slots is asked for two
    batches at once, so it never waits for the trainer between batches; sync rounds and async
    collectors that push weights after each batch or bound the policy lag ask one at a time (a
    batch asked ahead would start on older weights), and a sync round's requests wait for the
    user's next batch."""
    with collector(None, sync, **kwargs) as c:
        checker = Checker()
        for i, batch in enumerate(c):
            checker.check(batch)
            if i >= 6 and all(c.slots.plane.path_of(w) == "shm" for w in range(2)):
                break
            assert i < 500, "a worker's batches never went through shared memory"
        assert max(c.roster[w].outstanding for w in range(2)) == depth


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
def test_a_batch_the_user_holds_is_not_changed_by_later_collection(sync):
    """A batch handed out in its slot's memory (no copy) and held while the workers go on
    collecting (async: two requests ahead) keeps its frames."""
    with collector(None, sync) as c:
        it, held = iter(c), None
        for _ in range(500):
            batch = next(it)
            worker = 0 if sync else int(batch["collector", "worker_id"][0])
            if c.slots.plane.path_of(worker) == "shm" and in_slot(batch["observation"], c.slots.plane.pools[worker]):
                held = batch
                break
        assert held is not None, "no batch was handed out in its slot"
        snapshot = held.clone()
        checker = Checker()
        for _ in range(12):
            checker.check(next(it))
    assert (held == snapshot).all()
    Checker().check(held)


def shm_files() -> set[str]:
    """The data plane's files in /dev/shm (other programs' files come and go meanwhile)."""
    return {name for name in os.listdir("/dev/shm") if name.startswith("rpc_collectors_batches_")}


class FailingPixelEnv(PixelEnv):
    def step(self, action):
        if self.counter == 150:
            raise RuntimeError("the renderer lost its GPU context")
        return super().step(action)


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
def test_an_env_error_reaches_the_trainer_with_its_traceback(sync):
    """Workers on this host are asked for batches through their doorbell pipes: an error comes back that way."""
    envs = [functools.partial(make_env, 0, None), lambda: GymEnv(FailingPixelEnv(1))]
    c = MultiCollector(envs, None, sync=sync, frames_per_batch=120 if sync else 60, total_frames=-1,
                       track_policy_version=True)
    checker, bells = Checker(), set()
    try:
        with pytest.raises(WorkerError) as failure:
            for batch in c:
                checker.check(batch)
                bells.update(c.slots.plane._bells)
    finally:
        c.shutdown()
    assert bells == {0, 1}  # both were asked, and answered, through their pipes
    err = failure.value
    assert err.worker_id == 1 and "raised an error" in str(err)
    assert "the renderer lost its GPU context" in err.remote_traceback and "in step" in err.remote_traceback


class GrowingEnv:
    """A TensorDict env (TorchRL's protocol) whose steps carry one more key after its first episode
    (120 steps): from then on its batches no longer fit the layout of the shared buffer."""

    batch_size = torch.Size([])

    def __init__(self, worker: int) -> None:
        self.worker, self.t, self.resets = worker, 0, 0

    def _obs(self) -> TensorDict:
        td = TensorDict({"observation": torch.full(SHAPE, self.worker, dtype=torch.uint8)}, [])
        if self.resets > 1:
            td.set("step", torch.tensor([self.t]))
        return td

    def reset(self, td=None) -> TensorDict:
        self.resets += 1
        flags = {k: torch.zeros(1, dtype=torch.bool) for k in ("done", "terminated", "truncated")}
        return self._obs().update(flags)

    def rand_action(self, td: TensorDict) -> TensorDict:
        return td.set("action", torch.zeros((), dtype=torch.int64))

    def step(self, td: TensorDict) -> TensorDict:
        self.t += 1
        end = torch.tensor([self.t == 120])
        nxt = self._obs().update({"reward": torch.zeros(1), "done": end, "terminated": end,
                                  "truncated": torch.zeros(1, dtype=torch.bool)})
        return td.set("next", nxt)


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
def test_batches_that_stop_fitting_their_slots_arrive_whole(sync):
    """A batch whose keys differ from the first one's is sent back pickled through the doorbell pipe."""
    envs = [functools.partial(GrowingEnv, w) for w in range(2)]
    with MultiCollector(envs, None, sync=sync, frames_per_batch=120 if sync else 60, total_frames=-1,
                        track_policy_version=True) as c:
        per_worker: dict[int, list] = {0: [], 1: []}
        for batch in c:
            for w in (0, 1):
                part = batch[batch["collector", "worker_id"] == w]
                if part.batch_size[0]:
                    per_worker[w].append(part)
            if min(len(v) for v in per_worker.values()) == 4:
                break
        assert [c.slots.plane.path_of(w) for w in range(2)] == ["shm", "shm"]
    for w, parts in per_worker.items():
        parts = parts[:4]  # async: the other worker may have delivered more meanwhile
        assert [("step" in p.keys()) for p in parts] == [False, False, True, True]
        assert all((p["observation"] == w).all() for p in parts)
        steps = torch.cat([p["step"].reshape(-1) for p in parts[2:]]).tolist()
        assert steps == list(range(120, 240)), "frames of the grown batches are missing, repeated or torn"


@pytest.mark.timeout(60)
def test_worker_killed_while_writing_its_slot_gives_one_error_and_no_torn_batch():
    """A watcher kills worker 1 as soon as its next slot starts changing, i.e. mid-copy."""
    before = shm_files()
    big = (3, 128, 128)  # 48 KiB per observation, 3 MiB per tensor per batch: a copy of milliseconds
    c = collector(None, False, frames_per_worker=64, shape=big)
    it = iter(c)
    checker = Checker()
    while c.slots.plane.path_of(1) != "shm":
        checker.check(next(it))
    for _ in range(2):
        checker.check(next(it))
    pool = c.slots.plane.pools[1]
    victim = c.infos[1]["pid"]
    addresses = []  # first byte of both observation tensors in each slot (read without holding the slot)
    for slot in range(SLOTS):
        view = pool.layout.view(pool.slots[slot], None)
        addresses.append([view["observation"].data_ptr(), view["next", "observation"].data_ptr()])
    del view

    def read(slot: int) -> list[int]:
        return [ctypes.c_uint8.from_address(a).value for a in addresses[slot]]

    marks = [read(s) for s in range(SLOTS)]
    torn: list = []

    def watch() -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            for s in range(SLOTS):
                if read(s) != marks[s]:
                    os.kill(victim, signal.SIGKILL)
                    torn.append(s)
                    return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    with pytest.raises(WorkerError) as info:
        for batch in it:
            checker.check(batch)  # every batch yielded before the error is whole
    watcher.join(5)
    assert info.value.worker_id == 1 and "SIGKILL" in str(info.value)
    assert torn, "the worker was not caught writing"
    c.shutdown()
    assert not wait_gone({victim}, 5)
    assert shm_files() <= before, "a file was left in /dev/shm"


KILLED_TRAINER = textwrap.dedent("""
    import functools, sys
    sys.path[:0] = {tests!r}
    from test_data_plane import make_env
    from rpc_collectors import MultiCollector
    envs = [functools.partial(make_env, w, 2) for w in range(2)]
    c = MultiCollector(envs, None, sync={sync}, frames_per_batch=120, total_frames=-1)
    print(" ".join(str(i["pid"]) for i in c.infos), flush=True)
    told = False
    for i, batch in enumerate(c):  # collects until the test kills this process
        # async: a worker's first batch, which sets up its slots, may come after the other's third
        if not told and (i == 200 or all(c.slots.plane.path_of(w) == "shm" for w in range(2))):
            print("shm" if c.slots.plane.path_of(0) == c.slots.plane.path_of(1) == "shm" else "rpc", flush=True)
            told = True
""")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
def test_trainer_sigkilled_leaves_nothing_in_dev_shm(sync, tmp_path):
    before = shm_files()
    script = tmp_path / "trainer.py"
    script.write_text(KILLED_TRAINER.format(tests=PYTHONPATH.split(os.pathsep), sync=sync))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        pids = {int(p) for p in proc.stdout.readline().split()}
        assert proc.stdout.readline().strip() == "shm"  # collecting through shared memory now
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
        assert not wait_gone(pids, 20), "workers outlived their trainer"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    assert shm_files() <= before, "a file was left in /dev/shm"


TOO_LARGE = textwrap.dedent("""
    import functools, json, sys
    sys.path[:0] = {tests!r}
    from test_data_plane import make_env
    from rpc_collectors import MultiCollector
    envs = [functools.partial(make_env, w, None, (3, 64, 64)) for w in range(2)]
    c = MultiCollector(envs, None, sync=True, frames_per_batch=400, total_frames=-1)
    try:
        batch = next(iter(c))
        print(json.dumps({{"yielded": list(batch.shape)}}))
    except OSError as err:
        print(json.dumps({{"error": str(err), "closed": c._closed}}))
""")


def test_a_batch_larger_than_free_shared_memory_is_a_clear_error(tmp_path):
    """The trainer runs in its own mount namespace with a 4 MiB /dev/shm (needs root, as CI runs)."""
    script = tmp_path / "trainer.py"
    script.write_text(TOO_LARGE.format(tests=PYTHONPATH.split(os.pathsep)))
    shell = f"mount -t tmpfs -o size=4m tmpfs /dev/shm && exec {sys.executable} {script}"
    out = subprocess.run(["unshare", "--mount", "sh", "-c", shell], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert "error" in result, f"a batch was yielded: {result}"
    message = result["error"]
    batch_bytes = 200 * 2 * 3 * 64 * 64  # 200 frames of observation + next observation, at least
    assert "/dev/shm" in message and "4.0 MiB" in message, message
    needed = int(message.split("(")[1].split(" bytes")[0])
    assert needed >= SLOTS * batch_bytes
    assert result["closed"], "the collector was not shut down"
