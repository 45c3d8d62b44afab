"""What TorchRL's collector tests observe of a collector, without torchrl installed: the
``"traj_pool"`` entry of ``state_dict()``, ``reset()`` and the trajectories ``trajs_per_batch``
holds back (``_traj_assembly``), the ``traj_format`` FutureWarning, ``MultiCollector(sync=...)``'s
class, the dispatch's words, the defaults the classes share, and a worker's ``replay_buffer``
(TorchRL's own classes beside ours: tests/collectors/test_torchrl_parity.py)."""
from __future__ import annotations

import inspect
import threading
import warnings

import pytest
import torch

from conftest import CountEnv
from rpc_collectors import Collector, GymEnv, MultiAsyncCollector, MultiCollector, MultiSyncCollector, RPCCollector
from rpc_collectors.single_process.trajectories import TRAJ_IDS

pytestmark = [pytest.mark.usefixtures("no_leftover_processes"), pytest.mark.timeout(180)]

WAIT = 60.0  # seconds a wait for background collection may take


def count_env() -> GymEnv:
    return GymEnv(CountEnv())


def _next_id(collector) -> int:
    return int(collector.state_dict()["traj_pool"]["traj_id"])


# ------------------------------------------------------------------ state_dict()["traj_pool"]
def test_traj_pool_is_the_id_the_next_trajectory_gets_and_grows_after_a_load():
    """TorchRL's ``traj_pool``: above every id handed out and those the envs' trajectories hold;
    a loaded collector's envs start new trajectories, with ids from there on."""
    c = Collector(count_env, None, frames_per_batch=9, total_frames=-1)  # episodes of 3, 5, 2 steps
    assert _next_id(c) == 1  # the env's first trajectory holds id 0 (TorchRL's reset takes it)
    batch = c.next()
    ids = batch[TRAJ_IDS]
    assert _next_id(c) == int(ids.max()) + 1 == int(ids[-1]) + 1  # the trajectory in flight holds the last
    state = c.state_dict()
    saved = int(state["traj_pool"]["traj_id"])
    c.shutdown()
    resumed = Collector(count_env, None, frames_per_batch=9, total_frames=-1)
    resumed.load_state_dict(state)
    assert _next_id(resumed) > saved
    after = resumed.next()[TRAJ_IDS]
    assert int(after.min()) >= saved and _next_id(resumed) == int(after.max()) + 1
    resumed.shutdown()


@pytest.mark.multiprocess
def test_multi_collector_traj_pool_is_above_every_workers_ids_and_grows_after_a_load():
    kwargs = dict(frames_per_batch=20, total_frames=80)
    with MultiSyncCollector([count_env] * 2, None, **kwargs) as c:
        seen = torch.cat([c.next()[TRAJ_IDS].flatten() for _ in range(2)])
        state = c.state_dict()
    saved = int(state["traj_pool"]["traj_id"])
    assert saved > int(seen.max())
    with MultiSyncCollector([count_env] * 2, None, **kwargs) as resumed:
        resumed.load_state_dict(state)
        assert _next_id(resumed) > saved
        assert int(resumed.next()[TRAJ_IDS].min()) > int(seen.max())


# ------------------------------------------------------------------ reset() and trajs_per_batch
def test_reset_drops_the_trajectories_held_back_and_starts_every_env_afresh():
    c = Collector(lambda: GymEnv(CountEnv(lengths=(3,))), None, frames_per_batch=10, total_frames=-1,
                  trajs_per_batch=2, traj_format="padded")
    batches = iter(c)
    first = next(batches)
    in_flight, complete = c._traj_assembly
    assert len(in_flight) == 1 and len(complete) == 1  # 3 episodes in 10 steps, a 4th going on
    held = max(max(in_flight), int(complete[0][TRAJ_IDS].max()))
    c.reset()
    assert not in_flight and not complete  # the same containers, emptied
    after = next(batches)
    ids, mask = after[TRAJ_IDS], after["collector", "mask"]
    assert int(ids[mask].min()) > max(held, int(first[TRAJ_IDS].max()))
    assert (after["observation"][:, 0, 0] == 0).all()  # each trajectory starts at a reset
    with pytest.raises(ValueError, match=r"reset\(index=0\): this collector resets all its envs; accepted: index=None"):
        c.reset(index=0)
    c.shutdown()


def test_traj_format_left_to_its_default_warns_that_it_becomes_cat():
    with pytest.warns(FutureWarning, match="will change to 'cat' in torchrl v0.16"):
        c = Collector(count_env, None, frames_per_batch=10, total_frames=20, trajs_per_batch=2)
    assert c.traj_format == "padded" and c.next().shape[0] == 2
    c.shutdown()

    class Buffer:
        def extend(self, td) -> None:
            pass

    for kwargs in ({"trajs_per_batch": 2, "traj_format": "padded"}, {"trajs_per_batch": 2, "traj_format": "cat"}, {},
                   {"trajs_per_batch": 2, "replay_buffer": Buffer()}):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            Collector(count_env, None, frames_per_batch=10, total_frames=20, **kwargs).shutdown()


# ------------------------------------------------------------------ classes, dispatch and defaults
@pytest.mark.multiprocess
@pytest.mark.parametrize("sync, cls", [(True, MultiSyncCollector), (False, MultiAsyncCollector)])
def test_multi_collector_with_sync_is_the_sync_or_async_class(sync, cls):
    for c in (MultiCollector([count_env] * 2, None, sync=sync, frames_per_batch=20, total_frames=20),
              Collector(count_env, None, num_collectors=2, sync=sync, frames_per_batch=20, total_frames=20)):
        with c:
            assert type(c) is cls and c.sync is sync
            assert c.next().numel() == 20
    with MultiCollector([count_env] * 2, None, frames_per_batch=20, total_frames=20) as c:
        assert type(c) is MultiCollector and c.sync is True


@pytest.mark.parametrize("kwargs, error, words", [
    ({"backend": "process", "num_collectors": 0}, ValueError, "num_collectors=0 is invalid: it must be a positive integer"),
    ({"backend": "process", "num_collectors": True}, TypeError, "num_collectors=True is invalid: it must be a positive integer"),
    ({"backend": "direct", "num_collectors": 2}, ValueError, "it runs at most one collector"),
    ({"backend": "direct", "env_list": 2}, ValueError, "2 env constructors in create_env_fn; accepted: exactly one"),
    ({"backend": "submitit", "backend_options": {"launcher": "mp"}}, ValueError, "it requires launcher='submitit'"),
])
def test_dispatch_errors_use_torchrls_words(kwargs, error, words):
    kwargs = dict(kwargs)
    env = [count_env] * kwargs.pop("env_list", 0) or count_env
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)")):
        Collector(env, None, frames_per_batch=20, **kwargs)


def test_classes_differ_from_collectors_defaults_where_torchrls_do():
    """TorchRL's Collector leaves ``init_random_frames``/``split_trajs`` None and samples by default;
    its RPC and Ray collectors say ``-1``, ``-1`` and False (the same meaning)."""
    own = inspect.signature(Collector.__init__).parameters
    assert own["exploration_type"].default.name == "RANDOM" and own["no_cuda_sync"].default is False
    theirs = inspect.signature(RPCCollector.__init__).parameters
    differ = {name for name, p in own.items() if name in theirs and name not in ("self", "backend", "sync")
              and p.default is not inspect.Parameter.empty and theirs[name].default != p.default}
    assert differ == {"init_random_frames", "max_frames_per_traj", "split_trajs"}
    with Collector(count_env, None, frames_per_batch=10, total_frames=10, split_trajs=None) as c:
        assert c.split_trajs is False and c.init_random_frames == 0 and c.next().shape == (10,)
    with pytest.raises(TypeError, match="no_cuda_sync='yes' is invalid; accepted: True or False"):
        Collector(count_env, None, frames_per_batch=10, no_cuda_sync="yes")


# ------------------------------------------------------------------ a worker's replay_buffer
class CountingBuffer:
    """Frames written, and how many ``extend()`` calls wrote them."""

    def __init__(self) -> None:
        self.frames = self.write_count = 0
        self.cond = threading.Condition()

    def extend(self, td) -> None:
        with self.cond:
            self.frames, self.write_count = self.frames + td.numel(), self.write_count + 1
            self.cond.notify_all()

    def __len__(self) -> int:
        return self.frames


@pytest.mark.multiprocess
@pytest.mark.parametrize("cls", [MultiSyncCollector, MultiAsyncCollector])
def test_each_workers_replay_buffer_is_the_one_the_trainer_writes(cls):
    rb = CountingBuffer()
    c = cls([count_env] * 2, None, frames_per_batch=16, total_frames=-1, replay_buffer=rb)
    try:
        c.start()
        with rb.cond:
            assert rb.cond.wait_for(lambda: rb.frames >= 16, WAIT), "background collection wrote nothing"
        with c.pause():
            assert c.map_fn("replay_buffer.__len__") == [len(rb)] * 2
            assert c.get_distant_attr("replay_buffer.write_count") == [rb.write_count] * 2
            assert c.get_distant_attr("worker_idx") == [0, 1]  # other paths are still the workers'
    finally:
        c.async_shutdown(timeout=WAIT)


# ------------------------------------------------------------------ a policy that writes no action
def _features_only(td):
    return td.set("features", td.get("observation") * 2)


def test_a_policy_that_writes_no_action_is_refused_by_the_first_batch():
    """As TorchRL's: construction succeeds (env transforms may be what the policy lacks); the
    first batch names what is missing."""
    c = Collector(count_env, _features_only, frames_per_batch=10, total_frames=10)
    with pytest.raises(ValueError, match=r"did not write \['action'\] into the TensorDict it was given"):
        c.next()
    c.shutdown()


# ------------------------------------------------------------------ interruptor and preemptive_threshold
class Flag:
    """TorchRL's ``_Interruptor`` shape: ``collection_stopped()``."""

    def __init__(self, stopped: bool) -> None:
        self.stopped = stopped

    def collection_stopped(self) -> bool:
        return self.stopped


def _action_zero(td):
    return td.set("action", torch.zeros(td.batch_size, dtype=torch.int64))


def test_an_interruptor_ends_each_batch_at_the_step_it_says_stop():
    """Stopped from the start: each batch holds one collected step, then padding (id -1, mask
    False); the collected steps are those a collector without it collects, and only they count."""
    c = Collector(count_env, _action_zero, frames_per_batch=5, total_frames=5, interruptor=Flag(True))
    batches = list(c)
    assert len(batches) == 5 and c.frames == 5
    for b in batches:
        assert b.shape == (5,) and b[TRAJ_IDS][0] >= 0 and (b[TRAJ_IDS][1:] == -1).all()
        assert b["collector", "mask"].tolist() == [True, False, False, False, False]
    reference = Collector(count_env, _action_zero, frames_per_batch=5, total_frames=5).next()
    collected = torch.stack([b[0] for b in batches])
    assert torch.equal(collected["observation"], reference["observation"])
    assert torch.equal(collected["next", "observation"], reference["next", "observation"])
    running = Collector(count_env, None, frames_per_batch=5, total_frames=5, interruptor=Flag(False)).next()
    assert (running["collector", "mask"]).all()
    with pytest.raises(TypeError, match="interruptor=1 is invalid; accepted: None or an object with a collection_stopped"):
        Collector(count_env, None, frames_per_batch=5, interruptor=1)


@pytest.mark.multiprocess
def test_preemptive_threshold_one_is_kept_as_given_and_no_interruptor_is_made():
    with MultiSyncCollector([count_env] * 2, None, frames_per_batch=20, total_frames=20, preemptive_threshold=1.0) as c:
        assert c.preemptive_threshold == 1.0 and c.interruptor is None
        batch = c.next()
    assert (batch[TRAJ_IDS] >= 0).all() and ("collector", "mask") not in batch.keys(True)


@pytest.mark.multiprocess
def test_fake_tensordict_is_a_single_process_collectors_only():
    with MultiSyncCollector([count_env] * 2, None, frames_per_batch=20, total_frames=20) as c:
        with pytest.raises(NotImplementedError, match="MultiSyncCollector.fake_tensordict is not implemented, as in TorchRL"):
            c.fake_tensordict()
    with Collector(count_env, None, frames_per_batch=10) as c:
        with pytest.raises(TypeError, match=r"fake_tensordict\(\) reads the env's fake_tensordict\(\)"):
            c.fake_tensordict()


# ------------------------------------------------------------------ what a replay buffer is given
class RecordingStackBuffer:
    """Keeps what ``extend()`` was given."""

    def __init__(self) -> None:
        self.given: list = []

    def extend(self, td) -> None:
        self.given.append(td)


def test_a_replay_buffer_is_given_the_steps_lazily_stacked_with_the_frames_a_batch_holds():
    """As TorchRL's: the storage writes each step where it goes, without a dense copy first."""
    from tensordict import LazyStackedTensorDict

    from conftest import TDCountEnv

    rb = RecordingStackBuffer()
    c = Collector(TDCountEnv(), _action_zero, frames_per_batch=10, total_frames=20, replay_buffer=rb)
    assert list(c) == [None, None] and c._use_buffers is False
    reference = list(Collector(TDCountEnv(), _action_zero, frames_per_batch=10, total_frames=20))
    assert all(isinstance(td, LazyStackedTensorDict) for td in rb.given)
    for given, batch in zip(rb.given, reference):
        assert given.batch_size == batch.batch_size and given.names == batch.names
        assert (given.to_tensordict() == batch).all()
