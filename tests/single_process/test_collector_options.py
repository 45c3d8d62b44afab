"""TorchRL's collector arguments that shape how envs and policies are built and what a batch holds:
``create_env_kwargs``, ``policy_factory``, ``init_fn``, ``set_truncated``, ``track_traj_ids``,
``reset_when_done``, ``compact_obs``, ``extend_buffer``, ``return_same_td``, the collect hooks
and ``compile_policy``; in one process and in worker processes."""
from __future__ import annotations

import json
import os
import threading
import warnings

import pytest
import torch
from torch import nn

from rpc_collectors import Collector, GymEnv, MultiAsyncCollector, MultiSyncCollector, split_trajectories
from rpc_collectors.single_process.profiling import ProfilerHook

pytestmark = [pytest.mark.timeout(120)]
multi = [pytest.mark.multiprocess, pytest.mark.usefixtures("no_leftover_processes")]

TRAJ = ("collector", "traj_ids")
WORKER = ("collector", "worker_id")
INIT_VARIABLE = "RPC_COLLECTORS_TEST_EPISODE_STEPS"


def cartpole(max_episode_steps: int = 500) -> GymEnv:
    return GymEnv("CartPole-v1", max_episode_steps=max_episode_steps)


def collector_of(workers: int, request, **kwargs):
    """A single-process ``Collector`` (``workers=0``), or a ``MultiSyncCollector`` of ``workers``
    CartPole workers; the latter marks the test as a multiprocess one."""
    if not workers:
        return Collector(cartpole, None, **kwargs)
    for mark in multi:
        request.applymarker(mark)
    return MultiSyncCollector([cartpole] * workers, None, **kwargs)


def longest_trajectory(batch) -> int:
    return int(split_trajectories(batch).get(("collector", "mask")).sum(-1).max())


# ------------------------------------------------------------------ create_env_kwargs
def test_create_env_kwargs_reach_the_env_factory():
    batch = Collector(cartpole, None, frames_per_batch=40, total_frames=40, create_env_kwargs={"max_episode_steps": 4}).next()
    assert longest_trajectory(batch) == 4 and batch.get(("next", "truncated")).any()


def test_create_env_kwargs_on_an_env_instance_are_refused():
    with pytest.raises(ValueError, match="create_env_kwargs=.*cannot be given to the env instance"):
        Collector(cartpole(), None, frames_per_batch=4, create_env_kwargs={"max_episode_steps": 4})


@pytest.mark.parametrize("kwargs", [{"max_episode_steps": 3}, [{"max_episode_steps": 3}, {"max_episode_steps": 6}]])
def test_create_env_kwargs_in_workers_one_for_all_or_one_each(kwargs, request):
    with collector_of(2, request, frames_per_batch=60, total_frames=60, create_env_kwargs=kwargs) as c:
        batch = c.next()
    expected = [3, 3] if isinstance(kwargs, dict) else [3, 6]
    assert [longest_trajectory(lane) for lane in batch.unbind(0)] == expected


def test_create_env_kwargs_list_must_have_one_entry_per_worker():
    with pytest.raises(ValueError, match="create_env_kwargs has 3 entries for 2 workers"):
        MultiSyncCollector([cartpole] * 2, None, frames_per_batch=8, create_env_kwargs=[{}] * 3)


# ------------------------------------------------------------------ policy_factory, init_fn
class PidPolicy:
    """Action 0, and the pid of the process that built the policy; holds a lock, so it cannot be pickled."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.built_in = os.getpid()

    def __call__(self, td):
        td.set("action", torch.zeros(td.batch_size, dtype=torch.int64))
        td.set("built_in", torch.full(td.batch_size, self.built_in))
        return td


def test_policy_factory_builds_the_policy_in_a_single_process_collector():
    batch = Collector(cartpole, policy_factory=PidPolicy, frames_per_batch=4, total_frames=4).next()
    assert (batch.get("built_in") == os.getpid()).all() and (batch.get("action") == 0).all()
    with pytest.raises(TypeError, match="policy and policy_factory were both given"):
        Collector(cartpole, nn.Linear(4, 2), policy_factory=PidPolicy, frames_per_batch=4)


@pytest.mark.multiprocess
@pytest.mark.usefixtures("no_leftover_processes")
def test_policy_factory_builds_an_unpicklable_policy_inside_each_worker():
    with MultiSyncCollector([cartpole] * 2, policy_factory=PidPolicy, frames_per_batch=8, total_frames=8) as c:
        batch = c.next()
    builders = {int(lane.get("built_in")[0]) for lane in batch.unbind(0)}
    assert len(builders) == 2 and os.getpid() not in builders and (batch.get("action") == 0).all()


def set_episode_steps() -> None:
    os.environ[INIT_VARIABLE] = "5"


def cartpole_from_init() -> GymEnv:
    return cartpole(int(os.environ[INIT_VARIABLE]))  # set by init_fn in this worker


@pytest.mark.multiprocess
@pytest.mark.usefixtures("no_leftover_processes")
def test_init_fn_runs_in_each_worker_before_its_env_is_built():
    assert INIT_VARIABLE not in os.environ
    with MultiAsyncCollector([cartpole_from_init] * 2, None, frames_per_batch=30, total_frames=60,
                             init_fn=set_episode_steps) as c:
        assert [longest_trajectory(batch) for batch in c] == [5, 5]
    assert INIT_VARIABLE not in os.environ


# ------------------------------------------------------------------ what a batch holds
@pytest.mark.parametrize("workers", [0, 2])
def test_set_truncated_marks_the_last_step_of_each_batch(workers, request):
    with collector_of(workers, request, frames_per_batch=20, total_frames=40, set_truncated=True) as collector:
        for batch in collector:
            truncated, done = batch.get(("next", "truncated")), batch.get(("next", "done"))
            assert truncated[..., -1, :].all() and done[..., -1, :].all()


def test_track_traj_ids_false_leaves_the_ids_out():
    batch = Collector(cartpole, None, frames_per_batch=8, total_frames=8, track_traj_ids=False).next()
    assert TRAJ not in batch.keys(True) and ("next", "done") in batch.keys(True)
    with pytest.raises(ValueError, match="split_trajs=True and trajs_per_batch need track_traj_ids=True"):
        Collector(cartpole, None, frames_per_batch=8, split_trajs=True, track_traj_ids=False)
    with pytest.raises(ValueError, match="split_trajs=True and trajs_per_batch need track_traj_ids=True"):
        MultiSyncCollector([cartpole] * 2, None, frames_per_batch=8, split_trajs=True, track_traj_ids=False)


def test_reset_when_done_false_is_refused_as_in_torchrl():
    with pytest.raises(ValueError, match="reset_when_done=False is invalid"):
        Collector(cartpole, None, frames_per_batch=8, reset_when_done=False)
    with pytest.raises(ValueError, match="reset_when_done=False is invalid"):
        MultiSyncCollector([cartpole] * 2, None, frames_per_batch=8, reset_when_done=False)


@pytest.mark.parametrize("workers", [0, 2])
def test_compact_obs_drops_next_observations_only(workers, request):
    with collector_of(workers, request, frames_per_batch=8, total_frames=8, compact_obs=True) as collector:
        batch = collector.next()
    keys = set(batch.keys(True, True))
    assert ("next", "observation") not in keys and "observation" in keys
    assert {("next", "reward"), ("next", "done"), ("next", "truncated")} <= keys


class RecordingBuffer:
    """A replay buffer that records how it was written."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple]] = []

    def add(self, td) -> None:
        self.calls.append(("add", tuple(td.shape)))

    def extend(self, td) -> None:
        self.calls.append(("extend", tuple(td.shape)))


def test_extend_buffer_false_adds_step_by_step():
    rb = RecordingBuffer()
    list(Collector(lambda: GymEnv("CartPole-v1", num_envs=2), None, frames_per_batch=8, total_frames=8,
                   replay_buffer=rb, extend_buffer=False))
    assert rb.calls == [("add", (2,))] * 4
    rb = RecordingBuffer()
    list(Collector(cartpole, None, frames_per_batch=8, total_frames=8, replay_buffer=rb))
    assert rb.calls == [("extend", (8,))]
    with pytest.raises(ValueError, match="extend_buffer=False adds each step"):
        Collector(cartpole, None, frames_per_batch=8, replay_buffer=RecordingBuffer(), extend_buffer=False,
                  postproc=lambda td: td)


def seeded_batches(**kwargs) -> tuple[list, list]:
    """Each batch a seeded random-action CartPole collector hands out, and a clone of it taken
    at its turn."""
    collector = Collector(cartpole, None, frames_per_batch=8, total_frames=24, **kwargs)
    collector.set_seed(0)
    handed, values = [], []
    for batch in collector:
        handed.append(batch)
        values.append(batch.clone())
    return handed, values


def test_return_same_td_hands_out_one_tensordict_with_each_batchs_values():
    """TorchRL's ``return_same_td``: each batch is the object handed out first, and holds at its
    turn what a collector without it hands out."""
    _, plain = seeded_batches()
    objects, values = seeded_batches(return_same_td=True)
    assert len(objects) == 3 and all(batch is objects[0] for batch in objects)
    for got, want in zip(values, plain):
        assert set(got.keys(True, True)) == set(want.keys(True, True)) and (got == want).all()
    assert not (values[0] == values[1]).all()


@pytest.mark.parametrize("kwargs, match", [
    ({"replay_buffer": RecordingBuffer()}, "return_same_td=True and a replay_buffer"),
    ({"trajs_per_batch": 2}, "return_same_td=True and trajs_per_batch=2"),
])
def test_return_same_td_is_refused_where_a_batch_outlives_its_iteration(kwargs, match):
    with pytest.raises(TypeError, match=match):
        Collector(cartpole, None, frames_per_batch=8, return_same_td=True, **kwargs)
    with pytest.raises(TypeError, match="return_same_td=1 is invalid; accepted: True or False"):
        Collector(cartpole, None, frames_per_batch=8, return_same_td=1)


def test_a_subclass_with_ignore_rb_gets_the_batches_and_keeps_its_buffer():
    """TorchRL's ``_ignore_rb`` (its runners write the buffer themselves): iteration hands out the
    batches, ``replay_buffer`` stays the subclass's, and the collector writes nothing to it."""
    class WritesItsOwnBuffer(Collector):
        _ignore_rb = True

    rb = RecordingBuffer()
    collector = WritesItsOwnBuffer(cartpole, None, frames_per_batch=8, total_frames=16, replay_buffer=rb,
                                   return_same_td=True)
    sizes = [batch.numel() for batch in collector]
    assert sizes == [8, 8] and collector.replay_buffer is rb and rb.calls == []
    with pytest.raises(RuntimeError, match="start\\(\\) needs a replay_buffer"):
        WritesItsOwnBuffer(cartpole, None, frames_per_batch=8, replay_buffer=rb).start()


class StepBuffer:
    """A replay buffer that keeps every step it is given with ``add()``."""

    def __init__(self) -> None:
        self.steps: list = []

    def add(self, td) -> None:
        self.steps.append(td.clone())

    def extend(self, td) -> None:
        raise AssertionError("extend_buffer=False must add step by step")


@pytest.mark.parametrize("sync, cat_results, num_envs", [
    (True, "stack", None), (True, "stack", 2), (True, 0, None), (True, 0, 2), (True, -1, 2), (False, None, 2),
])
def test_extend_buffer_false_in_workers_adds_each_workers_steps_in_order(sync, cat_results, num_envs, request):
    """Each ``add`` is one step of one worker (its envs' batch size), a worker's steps in time order."""
    for mark in multi:
        request.applymarker(mark)
    rb = StepBuffer()
    env = (lambda: GymEnv("CartPole-v1", num_envs=num_envs)) if num_envs else cartpole
    collector = MultiSyncCollector if sync else MultiAsyncCollector
    kwargs = {} if cat_results is None else {"cat_results": cat_results}
    kwargs["track_policy_version"] = True  # each step keeps ("collector", "worker_id"), which says whose it is
    with collector([env] * 2, None, frames_per_batch=16, total_frames=32, replay_buffer=rb, extend_buffer=False, **kwargs) as c:
        assert list(c) == [None, None]
    envs = num_envs or 1
    assert len(rb.steps) == 32 // envs
    assert all(step.shape == ((num_envs,) if num_envs else ()) for step in rb.steps)
    workers = [int(step[WORKER].reshape(-1)[0]) for step in rb.steps]
    assert all((step[WORKER] == w).all() for step, w in zip(rb.steps, workers))
    run = 8 // envs if sync else 16 // envs  # a worker's batch, in steps
    runs = [workers[i:i + run] for i in range(0, len(workers), run)]
    assert all(len(set(r)) == 1 for r in runs)
    if sync:
        assert [r[0] for r in runs] == [0, 1, 0, 1]
    for r in range(len(runs)):
        steps = rb.steps[r * run:(r + 1) * run]
        for before, after in zip(steps, steps[1:]):
            going_on = ~before[("next", "done")].reshape(-1)
            assert torch.equal(before[("next", "observation")].reshape(envs, -1)[going_on],
                               after["observation"].reshape(envs, -1)[going_on])


# ------------------------------------------------------------------ hooks
def test_collect_hooks_run_around_each_batch():
    calls = []
    collector = Collector(cartpole, None, frames_per_batch=8, total_frames=16,
                          postproc=lambda td: td.set("post", td.get("action")),
                          pre_collect_hook=lambda: calls.append("pre"),
                          post_collect_hook=lambda td: calls.append(("post", "post" in td.keys())))
    batches = list(collector)
    assert len(batches) == 2 and calls == ["pre", ("post", True)] * 2


def record_pid(path: str):
    def hook(td) -> None:
        with open(path, "a") as f:
            f.write(f"{os.getpid()} {td.numel()}\n")
    return hook


@pytest.mark.multiprocess
@pytest.mark.usefixtures("no_leftover_processes")
def test_collect_hooks_run_in_the_workers(tmp_path):
    path = str(tmp_path / "hooks")
    with MultiSyncCollector([cartpole] * 2, None, frames_per_batch=8, total_frames=16, post_collect_hook=record_pid(path)) as c:
        list(c)
    lines = [line.split() for line in open(path).read().splitlines()]
    assert len(lines) >= 4 and {size for _, size in lines} == {"4"}
    assert len({pid for pid, _ in lines}) == 2 and str(os.getpid()) not in {pid for pid, _ in lines}


@pytest.mark.multiprocess
@pytest.mark.usefixtures("no_leftover_processes")
def test_hook_setters_reach_every_worker_and_its_replacement(tmp_path):
    """TorchRL's setters on a multi-worker collector: the hook runs in each worker from the next
    batch on, in a worker restarted later too, and never in the trainer."""
    path = str(tmp_path / "hooks")
    with MultiSyncCollector([cartpole] * 2, None, frames_per_batch=8, max_worker_restarts=1) as c:
        c.next()
        assert c.post_collect_hook is None
        c.post_collect_hook = record_pid(path)
        c.next()
        first = {line.split()[0] for line in open(path).read().splitlines()}
        os.kill(c.infos[0]["pid"], 9)
        with pytest.warns(Warning, match="replacing it"):
            c.next()
        pids = {line.split()[0] for line in open(path).read().splitlines()}
        with pytest.raises(TypeError, match="pre_collect_hook=3"):
            c.pre_collect_hook = 3
    assert len(first) == 2 and str(os.getpid()) not in pids and len(pids) == 3  # the replacement's too


# ------------------------------------------------------------------ get_distant_attr, map_fn
def test_get_distant_attr_and_map_fn_on_one_collector():
    c = Collector(cartpole, None, frames_per_batch=8, worker_idx=5)
    assert c.get_distant_attr("worker_idx") == 5 and c.get_distant_attr("env.batch_size") == torch.Size([])
    assert c.map_fn("get_distant_attr", list_of_args=[("worker_idx",), ("frames_per_batch",)]) == [5, 8]
    with pytest.raises(ValueError, match="must have the same length"):
        c.map_fn("get_distant_attr", list_of_args=[("worker_idx",)], list_of_kwargs=[{}, {}])


@pytest.mark.multiprocess
@pytest.mark.usefixtures("no_leftover_processes")
@pytest.mark.parametrize("cls", [MultiSyncCollector, MultiAsyncCollector])
def test_get_distant_attr_and_map_fn_ask_each_worker(cls):
    with cls([cartpole] * 2, None, frames_per_batch=8, total_frames=32) as c:
        assert c.get_distant_attr("worker_idx") == [0, 1]
        per_worker = 4 if cls is MultiSyncCollector else 8  # a sync round shares frames_per_batch out
        assert c.get_distant_attr("frames_per_batch") == [per_worker] * 2
        assert c.map_fn("set_seed", list_of_args=[(1,), (2,)]) == [2, 3]
        with pytest.raises(ValueError, match="Expected 2 argument entries, got 1"):
            c.map_fn("get_distant_attr", list_of_args=[("worker_idx",)])


# ------------------------------------------------------------------ enable_profile
def test_enable_profile_writes_a_trace_of_the_batches_it_names(tmp_path):
    c = Collector(cartpole, None, frames_per_batch=8, total_frames=48)
    c.enable_profile(num_rollouts=3, warmup_rollouts=1, save_path=str(tmp_path / "trace_{worker_idx}.json"))
    assert c.profile_config.num_rollouts == 3 and c.profile_config.warmup_rollouts == 1
    traces = []
    for _ in c:
        traces.append((tmp_path / "trace_0.json").exists())
    assert traces == [False, False, True, True, True, True]  # batches 1 and 2 profiled, written after the 3rd
    assert "traceEvents" in json.load(open(tmp_path / "trace_0.json"))
    with pytest.raises(RuntimeError, match="Cannot enable profiling after iteration has started"):
        c.enable_profile()
    with pytest.raises(ValueError, match="warmup_rollouts=3 are invalid"):
        Collector(cartpole, None, frames_per_batch=8).enable_profile(num_rollouts=3, warmup_rollouts=3)



def test_the_profiler_takes_the_post_collect_hooks_place_and_keeps_calling_it(tmp_path):
    seen = []
    c = Collector(cartpole, None, frames_per_batch=8, total_frames=32, post_collect_hook=lambda b: seen.append(b.numel()))
    user_hook = c.post_collect_hook
    c.enable_profile(num_rollouts=2, warmup_rollouts=0, save_path=str(tmp_path / "t_{worker_idx}.json"))
    assert isinstance(c.post_collect_hook, ProfilerHook) and c.post_collect_hook is not user_hook
    c.enable_profile(num_rollouts=2, warmup_rollouts=0, save_path=str(tmp_path / "t_{worker_idx}.json"))
    assert c.post_collect_hook.replaced is user_hook  # enabled again: one profiler, the same hook kept
    c.next(), c.next()
    assert seen == [8, 8] and (tmp_path / "t_0.json").exists()
    c.disable_profile()
    assert c.post_collect_hook is user_hook and c.profile_config is None
    c.next()
    assert seen == [8, 8, 8]
    c.disable_profile()  # nothing enabled: nothing changes
    assert c.post_collect_hook is user_hook
    c.shutdown()

@pytest.mark.multiprocess
@pytest.mark.usefixtures("no_leftover_processes")
def test_enable_profile_on_a_multi_worker_collector_is_refused():
    with MultiSyncCollector([cartpole] * 2, None, frames_per_batch=8) as c:
        with pytest.raises(ValueError, match=r"enable_profile\(workers=\[0\]\) on MultiSyncCollector: profiling inside"):
            c.enable_profile()
        assert c.profile_config is None and c.next().shape == (2, 4)


# ------------------------------------------------------------------ compile_policy
COMPILED: list[int] = []


def counting_backend(graph_module, example_inputs):
    """A torch.compile backend that records each graph it compiles and runs it as it is."""
    COMPILED.append(len(example_inputs))
    return graph_module.forward


class Argmax(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 2)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.linear(obs).argmax(-1)


def test_compile_policy_runs_the_policy_compiled():
    torch.manual_seed(0)
    policy = Argmax()
    COMPILED.clear()
    Collector(cartpole, policy, frames_per_batch=8, total_frames=8).next()
    assert COMPILED == []
    batch = Collector(cartpole, policy, frames_per_batch=8, total_frames=8, compile_policy={"backend": counting_backend}).next()
    assert COMPILED and torch.equal(batch.get("action"), policy(batch.get("observation")))
    with pytest.raises(TypeError, match="compile_policy='yes' is invalid"):
        Collector(cartpole, policy, frames_per_batch=8, compile_policy="yes")


# ------------------------------------------------------------------ per-worker frames_per_batch and devices
@pytest.mark.multiprocess
@pytest.mark.usefixtures("no_leftover_processes")
def test_frames_per_batch_list_gives_each_worker_its_own():
    with MultiSyncCollector([cartpole] * 2, None, frames_per_batch=[4, 8], total_frames=24, cat_results=-1,
                            track_policy_version=True) as c:
        assert [c.frames_per_batch_worker(worker_idx=i) for i in range(2)] == [4, 8] == [4, c.frames_per_batch_worker()]
        batches = list(c)
    assert [b.shape for b in batches] == [(12,), (12,)]
    assert batches[0].get(("collector", "worker_id")).tolist() == [0] * 4 + [1] * 8
    with MultiAsyncCollector([cartpole] * 2, None, frames_per_batch=[4, 8], total_frames=48) as c:
        assert [c.frames_per_batch_worker(worker_idx=i) for i in range(2)] == [12, 12]
        sizes = [b.numel() for b in c]
    assert sizes == [12] * 4  # as TorchRL's: each async batch, whichever worker's, holds the list's sum


def vector_cartpole() -> GymEnv:
    return GymEnv("CartPole-v1", num_envs=2)


@pytest.mark.multiprocess
@pytest.mark.usefixtures("no_leftover_processes")
@pytest.mark.parametrize("frames", [[10, 10], [15, 5], [9, 4]])
def test_frames_per_batch_list_with_batched_envs_as_torchrl(frames):
    """Async: the sum rounded up to the env batch; sync: each worker's own, rounded up to its env batch."""
    total = sum(frames)
    with MultiAsyncCollector([vector_cartpole] * 2, None, frames_per_batch=frames, total_frames=-1) as c:
        assert all(c.next().numel() == -(-total // 2) * 2 for _ in range(4))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # 15, 5 and 9 do not divide over 2 envs: rounded up
        c = MultiSyncCollector([vector_cartpole] * 2, None, frames_per_batch=frames, total_frames=-1, cat_results=-1)
    with c:
        batch = c.next()
    assert batch.shape == (2, sum(-(-f // 2) for f in frames))


def test_frames_per_batch_list_is_checked_before_workers_start():
    with pytest.raises(ValueError, match="frames_per_batch has 3 entries for 2 workers"):
        MultiSyncCollector([cartpole] * 2, None, frames_per_batch=[4, 4, 4], cat_results=-1)
    with pytest.raises(ValueError, match=r"cat_results='stack' cannot combine; accepted: cat_results=-1"):
        MultiSyncCollector([cartpole] * 2, None, frames_per_batch=[4, 8])
    with pytest.raises(ValueError, match=r"frames_per_batch\[1\]=0 is invalid"):
        MultiSyncCollector([cartpole] * 2, None, frames_per_batch=[4, 0])


class DevicePolicy:
    """Action 0; records whether the TensorDict it was given has a device (it has one where policy_device is set)."""

    def __call__(self, td):
        td.set("action", torch.zeros(td.batch_size, dtype=torch.int64))
        td.set("given_device", torch.full(td.batch_size, td.device is not None))
        return td


@pytest.mark.multiprocess
@pytest.mark.usefixtures("no_leftover_processes")
def test_device_lists_give_each_worker_its_own():
    with MultiSyncCollector([cartpole] * 2, DevicePolicy(), frames_per_batch=8, total_frames=8,
                            policy_device=[None, "cpu"]) as c:
        batch = c.next()
    assert [bool(lane.get("given_device").all()) for lane in batch.unbind(0)] == [False, True]
    with pytest.raises(ValueError, match="policy_device has 3 entries for 2 workers"):
        MultiSyncCollector([cartpole] * 2, None, frames_per_batch=8, policy_device=["cpu"] * 3)


# ------------------------------------------------------------------ trajs_per_batch
def count_env() -> GymEnv:
    return GymEnv("CountEnv-v0", num_envs=2)  # episodes of 3, 5, 2 steps; observation [t, episode, action]


def assert_whole_trajectories(batch) -> None:
    """Each row one whole trajectory: from a reset (t = 0) to its done step, one episode."""
    mask = batch.get(("collector", "mask"))
    for row, valid in zip(batch.unbind(0), mask):
        steps = row[valid]
        t, episode = steps.get("observation")[:, 0], steps.get("observation")[:, 1]
        assert t.tolist() == list(range(len(steps))) and len(steps) in (2, 3, 5)
        assert (episode == episode[0]).all()
        done = steps.get(("next", "done")).squeeze(-1)
        assert done[-1] and not done[:-1].any()


def test_trajs_per_batch_yields_whole_trajectories():
    collector = Collector(count_env, None, frames_per_batch=4, total_frames=60, trajs_per_batch=3, traj_format="padded")
    batches = list(collector)
    assert len(batches) >= 5 and all(b.shape[0] == 3 for b in batches)
    for batch in batches:
        assert_whole_trajectories(batch)
    cat = Collector(count_env, None, frames_per_batch=4, total_frames=20, trajs_per_batch=2, traj_format="cat").next()
    assert cat.batch_dims == 1 and int(cat.get(("next", "done")).sum()) == 2 and bool(cat.get(("next", "done"))[-1])


def test_trajs_per_batch_writes_each_trajectory_flat_into_a_replay_buffer():
    rb = RecordingBuffer()
    list(Collector(count_env, None, frames_per_batch=4, total_frames=40, trajs_per_batch=3, replay_buffer=rb))
    assert rb.calls and all(kind == "extend" and len(shape) == 1 for kind, shape in rb.calls)
    with pytest.raises(ValueError, match="trajs_per_batch yields whole trajectories; accepted with it: split_trajs=False"):
        Collector(count_env, None, frames_per_batch=4, trajs_per_batch=3, split_trajs=True)


@pytest.mark.multiprocess
@pytest.mark.usefixtures("no_leftover_processes")
def test_trajs_per_batch_from_workers():
    with MultiSyncCollector([count_env] * 2, None, frames_per_batch=8, total_frames=80, trajs_per_batch=4, traj_format="padded",
                            track_policy_version=True) as c:
        batches = list(c)
    assert batches and all(b.shape[0] == 4 for b in batches)
    for batch in batches:
        assert_whole_trajectories(batch)
    workers = torch.cat([b.get(("collector", "worker_id"))[:, 0] for b in batches])
    assert set(workers.tolist()) == {0, 1}
