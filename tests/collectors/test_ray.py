"""RayCollector on a real Ray instance, started once for the session on 127.0.0.1.

``StampEnv`` (from test_restarts) observes ``[pid, per-process step, worker]``, so the batches
alone tell which actor stepped which frame; ``ImageEnv`` observes a large uint8 image whose
bytes follow from its worker and step, checked byte for byte on the trainer.
"""
from __future__ import annotations

import copy
import functools
import gc
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import weakref

import gymnasium as gym
import numpy as np
import pytest
import torch

ray = pytest.importorskip("ray")

from folders import PYTHONPATH  # noqa: E402
from procs import Holdings, holds_beyond, run_in_session, wait_gone  # noqa: E402
from rpc_collectors import GymEnv, WorkerError, WorkerRestartWarning  # noqa: E402
from rpc_collectors.collectors.ray import RayCollector  # noqa: E402
from rpc_collectors.core.metrics import FrameAccount  # noqa: E402
from test_restarts import StampEnv  # noqa: E402
from test_rpc_collector import BiasPolicy  # noqa: E402

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(300), pytest.mark.xdist_group("ray")]  # one Ray at a time

CPUS = 4  # logical CPUs of the session's Ray: two actors of 1 CPU, with room for a replacement


@pytest.fixture(scope="module")
def ray_cluster():
    """The user's own Ray, started once for this module on 127.0.0.1 and stopped after it, so that
    later tests see a process without Ray (never ``ray stop``: that ends every Ray of the machine)."""
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([PYTHONPATH, saved or ""])  # actors import the test envs
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths live there
    ray.init(address="local", num_cpus=CPUS, include_dashboard=False, _node_ip_address="127.0.0.1", _temp_dir=temp,
             log_to_driver=False)
    yield
    ray.shutdown()
    shutil.rmtree(temp, ignore_errors=True)
    if saved is None:
        os.environ.pop("PYTHONPATH")
    else:
        os.environ["PYTHONPATH"] = saved


def stamp_env(worker: int) -> GymEnv:
    return GymEnv(StampEnv(worker))


class ImageEnv(gym.Env):
    """A ``shape`` uint8 image: its first bytes are the worker and step, the rest drawn from them."""

    metadata: dict = {"render_modes": []}

    def __init__(self, worker: int, shape: tuple = (3, 256, 256)) -> None:
        self.observation_space = gym.spaces.Box(0, 255, shape, np.uint8)
        self.action_space = gym.spaces.Discrete(2)
        self.worker, self.shape, self.counter = worker, shape, 0

    def _obs(self) -> np.ndarray:
        return image(self.worker, self.counter, self.shape)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._obs(), {}

    def step(self, action):
        self.counter += 1
        return self._obs(), 0.0, False, self.counter % 50 == 0, {}


def image(worker: int, counter: int, shape: tuple) -> np.ndarray:
    obs = np.random.default_rng(worker * 1_000_003 + counter).integers(0, 256, shape, dtype=np.uint8)
    obs.reshape(-1)[:5] = worker, *counter.to_bytes(4, "little")
    return obs


def actor_pids(collector: RayCollector) -> set[int]:
    return {info["pid"] for info in collector.infos}


def cpus_free(timeout: float = 30.0) -> float:
    """The session's free CPUs once no actor holds any (Ray frees a killed actor's soon after)."""
    deadline = time.monotonic() + timeout
    while ray.available_resources().get("CPU") != CPUS and time.monotonic() < deadline:
        time.sleep(0.2)
    return ray.available_resources().get("CPU")


def assert_gone_and_ray_alive(pids: set[int]) -> None:
    """Our actors' processes ended; the user's Ray still runs."""
    assert not wait_gone(pids, 30), "actor processes were left behind"
    assert ray.is_initialized()
    assert ray.get(ray.put(41)) == 41


@pytest.mark.parametrize("shared_memory", [True, False], ids=["shm", "object-store"])
def test_sync_layout_weights_device_lists_and_user_ray(ray_cluster, shared_memory):
    policy = BiasPolicy(action=0, size=3)
    collector_kwargs = [{"max_frames_per_traj": 3}, {"max_frames_per_traj": 5}]
    kwargs_copy = copy.deepcopy(collector_kwargs)
    devices = ["cpu", torch.device("cpu")]
    collector = RayCollector(
        [functools.partial(stamp_env, 0), functools.partial(stamp_env, 1)], policy, frames_per_batch=20,
        total_frames=-1, sync=True, device=devices, collector_kwargs=collector_kwargs, track_policy_version=True,
        shared_memory=shared_memory,
    )
    pids = actor_pids(collector)
    try:
        assert collector_kwargs == kwargs_copy and devices == ["cpu", torch.device("cpu")]
        assert len(collector.remote_collectors) == 2 and collector.local_policy() is policy
        batches = []
        for i, batch in enumerate(collector):  # endless: total_frames=-1
            batches.append(batch)
            if i == 1:
                policy.set_action(1)
                collector.update_policy_weights_()
            if i == 3:
                break
        for batch in batches:
            assert batch.shape == (2, 10)
            obs = batch["observation"]
            assert (obs[..., 2] == torch.tensor([[0.0], [1.0]])).all()  # row i: actor i's env
            assert (batch["collector", "worker_id"] == torch.tensor([[0], [1]])).all()
            assert len({int(p) for p in obs[0, :, 0]} & {int(p) for p in obs[1, :, 0]}) == 0  # two processes
        steps = torch.cat([b["next", "observation"][..., 1] for b in batches], -1)
        assert (steps == torch.arange(1, 41, dtype=steps.dtype)).all()  # every step of each actor, in order
        # each actor's own collector_kwargs: trajectories truncated at 3 and 5 steps
        assert batches[0]["next", "step_count"][0].max() == 3 and batches[0]["next", "step_count"][1].max() == 5
        assert (batches[1]["action"] == 0).all() and (batches[2]["action"] == 1).all()
        assert (batches[2]["next", "policy_version"] == 1).all()  # the push reached the next batch
        traj_ids = [set(b["collector", "traj_ids"][w].tolist()) for b in batches[:1] for w in (0, 1)]
        assert not traj_ids[0] & traj_ids[1]
    finally:
        collector.shutdown()
    assert_gone_and_ray_alive(pids)


MAX_BATCHES = 2000  # a bound on the batches an async test waits for both actors in


def test_async_layout(ray_cluster):
    collector = RayCollector(
        lambda: GymEnv("CartPole-v1"), None, num_collectors=2, frames_per_batch=30, total_frames=-1, sync=False,
    )
    pids = actor_pids(collector)
    try:
        workers, batches = set(), 0
        for batch in collector:  # until both actors served: on a loaded machine one may start late
            assert batch.shape == (30,)
            assert "worker_id" not in batch["collector"].keys()  # TorchRL's keys; the record says whose
            ids = list(collector.last_batch.worker_frames)
            assert len(ids) == 1  # one actor's batch, first ready first served
            workers.add(ids[0])
            batches += 1
            if workers == {0, 1} or batches == MAX_BATCHES:
                break
        assert workers == {0, 1} and collector.frames == 30 * batches
    finally:
        collector.shutdown()
    assert_gone_and_ray_alive(pids)


def test_async_actors_keep_max_policy_lag_by_admission_and_drop_nothing(ray_cluster):
    """``max_policy_lag=1`` (admitted) with a push after every batch: each batch within one version of
    the trainer's, none dropped, both actors delivering."""
    from test_rpc_collector import BiasPolicy

    collector = RayCollector(
        lambda: GymEnv("CartPole-v1"), BiasPolicy(1, size=4), num_collectors=2, frames_per_batch=20,
        total_frames=-1, sync=False, max_policy_lag=1,
    )
    try:
        lags, workers = [], set()
        for i, _ in enumerate(collector):
            lags.append(collector.last_batch.lag)
            workers.update(collector.last_batch.worker_frames)
            collector.update_policy_weights_()
            if i == 20:
                break
        assert max(lags) <= 1 and collector.dropped_frames == 0 and workers == {0, 1}, (lags, workers)
    finally:
        collector.shutdown()


def test_set_seed_and_state_dict(ray_cluster):
    collector = RayCollector(
        lambda: GymEnv("CartPole-v1"), None, num_collectors=2, frames_per_batch=40, sync=True,
    )
    pids = actor_pids(collector)
    try:
        def seeded() -> list:
            assert collector.set_seed(7) == 9
            return [collector.next() for _ in range(2)]

        first, again = seeded(), seeded()
        for a, b in zip(first, again):
            assert (a["action"] == b["action"]).all() and (a["observation"] == b["observation"]).all()
        assert not (first[0]["observation"][0] == first[0]["observation"][1]).all()  # each actor its own seed
        state = collector.state_dict()
        assert state["frames"] == 160 and len(state["workers"]) == 2
        seen = again[-1]["collector", "traj_ids"].max()
        collector.next()
        collector.load_state_dict(state)
        assert collector.frames == 160
        resumed = collector.next()
        assert resumed["collector", "traj_ids"].min() > seen  # from where the state was: fresh trajectory ids
    finally:
        collector.shutdown()
    assert_gone_and_ray_alive(pids)


@pytest.mark.parametrize("shared_memory", [False, True], ids=["object-store", "shm"])
def test_large_uint8_observations_byte_for_byte(ray_cluster, shared_memory):
    shape = (3, 256, 256)
    collector = RayCollector(
        [functools.partial(GymEnv, ImageEnv(w, shape)) for w in (0, 1)], None, frames_per_batch=16, total_frames=96,
        sync=True, shared_memory=shared_memory,
    )
    pids = actor_pids(collector)
    try:
        for batch in collector:
            obs = batch["next", "observation"]
            assert obs.shape == (2, 8, *shape) and obs.dtype == torch.uint8
            for w in range(2):
                for t in range(8):
                    counter = int.from_bytes(bytes(obs[w, t].reshape(-1)[1:5].tolist()), "little")
                    assert np.array_equal(obs[w, t].numpy(), image(w, counter, shape))
            obs.zero_()  # the user's batch is their own memory
        assert collector.slots.plane.path_of(0) == ("shm" if shared_memory else "rpc")
    finally:
        collector.shutdown()
    assert_gone_and_ray_alive(pids)


@pytest.mark.parametrize("restarts", [0, 1])
def test_sigkilled_actor(ray_cluster, restarts):
    collector = RayCollector(
        [functools.partial(stamp_env, 0), functools.partial(stamp_env, 1)], None, frames_per_batch=20,
        sync=True, max_worker_restarts=restarts, rpc_timeout=60.0,
    )
    pids = actor_pids(collector)
    victim = collector.infos[1]
    try:
        next(iter(collector))
        os.kill(victim["pid"], signal.SIGKILL)
        if restarts:
            with pytest.warns(WorkerRestartWarning):
                batches = [b for _, b in zip(range(3), collector)]
            assert collector.worker_restarts == [0, 1] and collector.infos[1]["pid"] != victim["pid"]
            assert all(b.shape == (2, 10) for b in batches)
            assert int(batches[-1]["observation"][1, -1, 0]) == collector.infos[1]["pid"]
            pids |= actor_pids(collector)
        else:
            with pytest.raises(WorkerError) as err:
                for _ in collector:
                    pass
            assert err.value.worker_id == 1 and err.value.pid == victim["pid"]
            assert f"(Ray actor {victim['actor_id']}) died" in str(err.value)
    finally:
        collector.shutdown()
    assert_gone_and_ray_alive(pids)


def test_frame_accounts_balance_with_actors_the_trainer_cannot_read_once_gone(ray_cluster):
    """An actor's steps are read from its phases while it serves; once gone (killed and replaced, or
    shut down) it counts as having stepped what its batches brought in (docs/observability.md)."""
    collector = RayCollector(
        [functools.partial(stamp_env, 0), functools.partial(stamp_env, 1)], None, frames_per_batch=20,
        sync=True, max_worker_restarts=1, rpc_timeout=60.0,
    )
    pids = actor_pids(collector)
    try:
        batches = iter(collector)
        next(batches)
        running = collector.metrics().accounts
        assert running == FrameAccount(20, 20, 0, 0, 0), "a sync round's actors stepped its frames, no more"
        os.kill(collector.infos[1]["pid"], signal.SIGKILL)
        with pytest.warns(WorkerRestartWarning):
            for _ in range(3):
                next(batches)
        replaced = collector.metrics().accounts
        assert replaced == FrameAccount(80, 80, 0, 0, 0)
        pids |= actor_pids(collector)
    finally:
        collector.shutdown()
    assert collector.metrics().accounts == FrameAccount(80, 80, 0, 0, 0)
    assert_gone_and_ray_alive(pids)


@pytest.mark.parametrize("shutdown", [True, False], ids=["shut-down", "dropped"])
def test_a_dropped_collector_is_freed_with_its_actors_fds_and_shared_memory(ray_cluster, shutdown):
    def iterated_and_dropped() -> tuple[weakref.ref, set[int]]:
        collector = RayCollector([functools.partial(stamp_env, 0)], None, frames_per_batch=10, sync=True)
        batches = iter(collector)
        next(batches)
        next(batches)
        if shutdown:
            collector.shutdown()
        return weakref.ref(collector), actor_pids(collector)

    iterated_and_dropped()  # Ray's connections of the driver, opened on first use, are the baseline
    gc.collect()
    before = Holdings.now()
    ref, pids = iterated_and_dropped()
    gc.collect()
    assert ref() is None, "a RayCollector that was iterated and dropped is still alive after gc.collect()"
    assert_gone_and_ray_alive(pids)
    # Ray's own processes, threads and gRPC connections come and go with its pools: the collector's files stay flat
    left = holds_beyond(before)
    ours = {"fds": {name: n for name, n in left.get("fds", {}).items() if name != "socket:"},
            "shm_maps": left.get("shm_maps"), "shm_names": left.get("shm_names")}
    assert not any(ours.values()), f"a dropped RayCollector left behind {ours}"


def test_a_collector_whose_actor_failed_to_start_leaves_no_pool_behind(ray_cluster, monkeypatch):
    from rpc_collectors.pools.ray_actors import RayPool
    from test_batched_inference import broken_factory

    made = weakref.WeakSet()  # the pools of this test only: another test's are that test's to check
    init = RayPool.__init__

    def recorded(self, *args, **kwargs):
        made.add(self)
        init(self, *args, **kwargs)

    monkeypatch.setattr(RayPool, "__init__", recorded)
    for _ in range(2):
        with pytest.raises(WorkerError, match="simulator license server is down"):
            RayCollector([functools.partial(stamp_env, 0), broken_factory], None, frames_per_batch=10, sync=True)
    gc.collect()
    assert len(made) == 0, "a failed collector's pool is still alive"


def test_actor_pending_for_resources_is_a_clear_error(ray_cluster):
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"not running within 5.0 s: it asked for \{'num_cpus': 3\}.*free"):
        RayCollector(lambda: GymEnv("CartPole-v1"), None, num_collectors=2, frames_per_batch=10,
                     remote_configs={"num_cpus": 3}, rpc_timeout=5.0)
    assert time.monotonic() - start < 60
    assert cpus_free() == CPUS  # nothing of ours holds resources


def test_bad_input_before_any_actor(ray_cluster):
    import rpc_collectors
    from rpc_collectors.distributed import RayCollector as torchrl_path  # TorchRL's module path

    assert torchrl_path is RayCollector is rpc_collectors.RayCollector
    env = lambda: GymEnv("CartPole-v1")  # noqa: E731
    with pytest.raises(ValueError, match=r"remote_configs\[0\]\['num_gpus'\]=1: the Ray cluster has 0"):
        RayCollector(env, None, num_collectors=2, frames_per_batch=10, remote_configs={"num_gpus": 1})
    with pytest.raises(ValueError, match="num_collectors=3 does not match the 2 entries"):
        RayCollector([env, env], None, num_collectors=3, frames_per_batch=10)
    with pytest.raises(ValueError, match="collector_kwargs has 1 entries"):
        RayCollector([env, env], None, frames_per_batch=10, collector_kwargs=[{}])
    with pytest.raises(ValueError, match="collector_class='multi' is invalid; accepted: 'single', 'sync', 'async'"):
        RayCollector([env, env], None, frames_per_batch=10, collector_class="multi")
    with pytest.raises(ValueError, match="num_workers_per_collector=2 needs a multi-process collector_class"):
        RayCollector([env, env], None, frames_per_batch=10, num_workers_per_collector=2)
    assert cpus_free() == CPUS


def test_ray_init_config_while_ray_runs_uses_it_with_a_warning(ray_cluster):
    """TorchRL always passes its whole default ray_init_config: the running Ray is used, and kept."""
    with pytest.warns(UserWarning, match=r"ray_init_config=\{'num_cpus': 2\} is not applied: Ray already runs"):
        collector = RayCollector(lambda: GymEnv("CartPole-v1"), None, num_collectors=2, frames_per_batch=10,
                                 total_frames=20, ray_init_config={"num_cpus": 2})
    pids = actor_pids(collector)
    try:
        assert sum(b.numel() for b in collector) == 20
    finally:
        collector.shutdown()
    assert_gone_and_ray_alive(pids)


@pytest.mark.parametrize("collector_class", ["MultiSyncCollector", "MultiAsyncCollector"])
def test_node_collectors_in_ray_actors(ray_cluster, collector_class):
    """collector_class + num_workers_per_collector: each actor is a node of 2 local workers; a push
    reaches every local worker before its node's next batch."""
    import rpc_collectors

    policy = BiasPolicy(action=0, size=3)
    collector = RayCollector(
        [functools.partial(stamp_env, 0), functools.partial(stamp_env, 1)], policy, frames_per_batch=40,
        total_frames=-1, sync=True, collector_class=getattr(rpc_collectors, collector_class),
        num_workers_per_collector=2, track_policy_version=True,
    )
    pids = actor_pids(collector)
    try:
        local = [set(info["local_pids"]) for info in collector.infos]
        assert all(len(p) == 2 for p in local) and not local[0] & local[1] and not (local[0] | local[1]) & pids
        first = collector.next()
        policy.set_action(1)
        collector.update_policy_weights_()
        second = collector.next()
        if collector_class == "MultiSyncCollector":  # [actors, local workers, T]
            assert first.shape == (2, 2, 10)
            stepped = {int(p) for p in first["observation"][..., 0].flatten()}
            assert stepped == local[0] | local[1]  # every local worker's env, no actor's own
        else:  # [actors, T]: one local worker's batch per actor
            assert first.shape == (2, 20)
            assert all({int(p) for p in first["observation"][a, :, 0]} <= local[a] for a in (0, 1))
        assert (first["action"] == 0).all() and (second["action"] == 1).all()
        assert (second["collector", "policy_version"] == 1).all()
        pids |= local[0] | local[1]
    finally:
        collector.shutdown()
    assert_gone_and_ray_alive(pids)


def test_pause_and_pushed_weights_to_factory_policies(ray_cluster):
    """pause() stops background collection into the buffer; update_policy_weights_(weights) reaches
    policies the actors built (policy_factory)."""
    from tensordict import TensorDict

    from test_pause import Buffer

    buffer = Buffer()
    collector = RayCollector(
        [functools.partial(stamp_env, 0), functools.partial(stamp_env, 1)], None, frames_per_batch=10,
        total_frames=-1, policy_factory=functools.partial(BiasPolicy, 0, 3), replay_buffer=buffer,
    )
    pids = actor_pids(collector)
    try:
        collector.update_policy_weights_(TensorDict.from_module(BiasPolicy(1, 3)).lock_())
        assert collector.policy_version == 1
        collector.start()
        assert buffer.wait_for(3)
        with collector.pause():
            writes = buffer.writes
            time.sleep(0.3)  # unpaused, the actors deliver several batches meanwhile
            assert buffer.writes == writes
        assert buffer.wait_for(writes + 1)
    finally:
        collector.async_shutdown(timeout=30)
    assert collector.last_batch.oldest_version == 1
    assert_gone_and_ray_alive(pids)


def test_async_shutdown_may_be_awaited_as_torchrls(ray_cluster):
    """TorchRL's ``RayCollector.async_shutdown`` is a coroutine (its ray_buffer_infra example awaits
    it in an asyncio loop, buffer filled by ``start()``): ours may be awaited there too, and shuts
    the collector down, Ray left running as ``shutdown_ray=False`` asks."""
    import asyncio

    from test_pause import Buffer

    buffer = Buffer()
    collector = RayCollector([functools.partial(stamp_env, 0)], None, frames_per_batch=10, total_frames=-1,
                             replay_buffer=buffer)
    pids = actor_pids(collector)

    async def main() -> None:
        collector.start()
        while not buffer.writes:
            await asyncio.sleep(0.05)
        await collector.async_shutdown(shutdown_ray=False)

    asyncio.run(asyncio.wait_for(main(), timeout=120))
    assert not collector.running
    assert_gone_and_ray_alive(pids)


OWN_RAY = r"""
import json, shutil, sys, time, tempfile
from procs import descendants
from rpc_collectors import GymEnv
from rpc_collectors.collectors.ray import RayCollector
import ray
out = {}
start = time.monotonic()
try:
    RayCollector(lambda: GymEnv("CartPole-v1"), None, num_collectors=1, frames_per_batch=10,
                 ray_init_config={"address": "127.0.0.1:1"}, rpc_timeout=5.0)
except ConnectionError as err:
    out["connect_error"], out["connect_s"] = str(err), time.monotonic() - start
temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")
collector = RayCollector(lambda: GymEnv("CartPole-v1"), None, num_collectors=1, frames_per_batch=10, total_frames=30,
                         ray_init_config={"num_cpus": 2, "_node_ip_address": "127.0.0.1", "_temp_dir": temp})
out["ray_processes"] = len(descendants())
out["frames"] = sum(b.numel() for b in collector)
collector.shutdown()
out["initialized_after"] = ray.is_initialized()
deadline = time.monotonic() + 30
while descendants() and time.monotonic() < deadline:
    time.sleep(0.2)
out["left"] = sorted(descendants())
shutil.rmtree(temp, ignore_errors=True)
print(json.dumps(out))
"""


def test_collector_starts_and_stops_its_own_ray():
    """Without a Ray to attach to, the collector starts one and stops it all at shutdown."""
    env = dict(os.environ, PYTHONPATH=PYTHONPATH)
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run([sys.executable, "-c", OWN_RAY], env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "no Ray cluster answers there" in out["connect_error"] and out["connect_s"] < 30
    assert out["ray_processes"] > 0 and out["frames"] == 30
    assert out["initialized_after"] is False and out["left"] == []


NOT_RAY = r"""
import json, socket, sys, threading, time
from procs import descendants
from rpc_collectors import GymEnv
from rpc_collectors.collectors.ray import RayCollector
import ray

def serve(listener, answer, accepted):  # accepts and keeps every connection; answers nothing, or HTTP/1.1 as a dashboard does
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        accepted.append(conn)
        if answer == "http":
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

outs = {}
for answer in sys.argv[1:]:
    listener, accepted = socket.create_server(("127.0.0.1", 0)), []
    threading.Thread(target=serve, args=(listener, answer, accepted), daemon=True).start()
    out = outs[answer] = {"address": f"127.0.0.1:{listener.getsockname()[1]}"}
    start = time.monotonic()
    try:
        RayCollector(lambda: GymEnv("CartPole-v1"), None, num_collectors=1, frames_per_batch=10,
                     ray_init_config={"address": out["address"]}, rpc_timeout=5.0)
    except ConnectionError as err:
        out["error"] = str(err)
    out["seconds"], out["accepted"] = time.monotonic() - start, len(accepted)
    out["initialized_after"], out["left"] = ray.is_initialized(), sorted(descendants())
print(json.dumps(outs))
"""


def test_address_that_accepts_tcp_but_is_not_ray_is_a_connection_error():
    """Something that accepts TCP but is not a Ray head (a dashboard's port, any service: one that
    answers nothing, one that answers HTTP/1.1) is refused within about ``rpc_timeout`` with a
    ConnectionError naming the address, instead of ``ray.init`` retrying for minutes."""
    env = dict(os.environ, PYTHONPATH=PYTHONPATH)
    env.pop("RAY_ADDRESS", None)
    answers = ["silent", "http"]
    proc = run_in_session([sys.executable, "-c", NOT_RAY, *answers], timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    outs = json.loads(proc.stdout.strip().splitlines()[-1])
    assert list(outs) == answers
    for answer, out in outs.items():
        assert out["accepted"] >= 1, answer  # the plain TCP check alone passes there
        assert f"ray_init_config['address']={out['address']!r}" in out["error"] and "not a Ray head" in out["error"], out
        assert out["seconds"] < 30, answer  # rpc_timeout=5: well within, on a loaded machine too
        assert out["initialized_after"] is False and out["left"] == [], answer


RAY_START_LINES = ("Started a local Ray instance", "Token authentication is enabled for this Ray cluster")


@pytest.mark.parametrize("kind", ["ray-own", "ray-user", "ray-gone"])
def test_a_collector_never_shut_down_exits_cleanly_with_ray_gone(kind):
    """TorchRL's ``ray_collect.py`` never shuts its collector down: the finalizer closes the actors
    before Ray's own exit handler stops Ray (the collector's Ray, or the user's), or, where the user
    stopped Ray first, leaves them to it, and never starts a second Ray. Nothing is left behind, and
    stderr holds only what Ray says when it starts (once)."""
    from test_exit_cleanup import run_unshut

    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    try:
        proc, left = run_unshut(kind, temp)
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["done"]
    lines = proc.stderr.splitlines()
    assert [line for line in lines if not any(said in line for said in RAY_START_LINES)] == []
    assert sum(RAY_START_LINES[0] in line for line in lines) == 1, proc.stderr
    assert not left, f"processes left behind: {left}"


@pytest.mark.parametrize("user_filter", ["none", "error"])
def test_actor_warnings_show_as_the_trainers_filters_ask(user_filter):
    """Ray actors run under the trainer's warning filters as local workers do: an env's warnings say
    nothing by default, and raise where the trainer's filter asks."""
    from test_worker_warnings import check, run_script

    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    try:
        proc = run_script("ray", user_filter, temp)
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    assert [line for line in proc.stderr.splitlines() if not any(said in line for said in RAY_START_LINES)] == []
    check(proc, user_filter, workers=2)
