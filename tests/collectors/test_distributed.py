"""TorchRL's distributed names: DistributedCollector, DistributedSyncCollector, the "mp" launcher
with tcp_port, and Collector(..., backend=...) dispatch; with real local worker processes."""
from __future__ import annotations

import importlib.util
import os
import socket

import pytest
import torch
from torch import nn

from conftest import CountEnv
from rpc_collectors import (
    Collector,
    DistributedCollector,
    DistributedSyncCollector,
    GymEnv,
    MultiAsyncCollector,
    MultiCollector,
    MultiSyncCollector,
    RPCCollector,
    distributed,
)
from rpc_collectors.transport.rendezvous import free_port

pytestmark = [pytest.mark.multiprocess, pytest.mark.usefixtures("no_leftover_processes"), pytest.mark.timeout(120)]

OBS, VERSION, WORKER = "observation", ("collector", "policy_version"), ("collector", "worker_id")


class ActionPolicy(nn.Module):
    """Takes action ``bias`` (0 or 1) whatever it observes: a weight push shows in the actions."""

    def __init__(self, action: int = 0) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(2))
        self.set_action(action)

    def set_action(self, action: int) -> None:
        with torch.no_grad():
            self.bias.copy_(torch.tensor([1.0, 0.0] if action == 0 else [0.0, 1.0]))

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return (observation[..., :1] * 0 + self.bias).argmax(-1)


def count_env() -> GymEnv:
    return GymEnv(CountEnv())


def check_frames(batch) -> None:
    """Each row of a ``CountEnv`` batch ([..., T]) is one env's consecutive steps: the next
    observation is one step on, and a step after an episode's end starts a new one at t=0."""
    obs, nxt, done = batch[OBS][..., 0], batch["next", OBS][..., 0], batch["next", "done"].squeeze(-1)
    assert torch.equal(nxt, obs + 1)
    going_on = ~done[..., :-1]
    assert torch.equal(obs[..., 1:][going_on], nxt[..., :-1][going_on])
    assert (obs[..., 1:][~going_on] == 0).all()


# ------------------------------------------------------------------ DistributedCollector
def test_distributed_sync_batches_are_stacked_and_weights_reach_the_workers():
    """TorchRL's DistributedCollector stacks its nodes' batches: [N, T] in worker order."""
    policy = ActionPolicy(0)
    with DistributedCollector([count_env] * 2, policy, frames_per_batch=20, total_frames=60, sync=True,
                              launcher="mp", track_policy_version=True) as c:
        assert c.sync and c.cat_results == "stack"
        for i, batch in enumerate(c):
            assert batch.shape == (2, 10)
            assert torch.equal(batch[WORKER], torch.tensor([[0] * 10, [1] * 10]))
            assert (batch["action"] == i % 2).all() and (batch[VERSION] == i).all()
            check_frames(batch)
            policy.set_action((i + 1) % 2)
            c.update_policy_weights_()


def test_distributed_defaults_to_async_batches_of_one_worker():
    with DistributedCollector([count_env] * 2, None, frames_per_batch=20, total_frames=400, launcher="mp") as c:
        batches, workers = [], []
        for batch in c:  # 20 batches: on a loaded machine one worker may deliver the first few alone
            batches.append(batch)
            workers.append(c.last_batch.worker_frames)
    assert not c.sync and len(batches) == 20 and all(b.shape == (20,) for b in batches)
    assert all(len(w) == 1 and list(w.values()) == [20] for w in workers)  # one worker's batch
    assert {next(iter(w)) for w in workers} == {0, 1}


def test_distributed_sync_collector_pushes_weights_every_round_by_default():
    """update_interval=1 (TorchRL's default): the trainer's weights before every round."""
    policy = ActionPolicy(0)
    with DistributedSyncCollector([count_env] * 2, policy, frames_per_batch=20, total_frames=60, launcher="mp") as c:
        actions = []
        for i, batch in enumerate(c):
            assert batch.shape == (2, 10)
            actions.append(batch["action"].unique().tolist())
            policy.set_action((i + 1) % 2)  # no update_policy_weights_: the collector pushes
    assert actions == [[0], [1], [0]]


def action_policy() -> ActionPolicy:
    return ActionPolicy(0)


@pytest.mark.parametrize("collector_class", ["Collector", "MultiSyncCollector", "MultiAsyncCollector"])
@pytest.mark.parametrize("factory", [False, True], ids=["policy", "policy-and-factory"])
def test_update_interval_1_pushes_the_trainers_weights_to_every_node_worker(collector_class, factory):
    """TorchRL's DistributedSyncCollector test: the trainer's policy changes after the first round, no
    update_policy_weights_ call; every later round (on every local worker of every node) has the new
    weights. With policy_factory too, the workers build their policies and get the trainer's weights."""
    import rpc_collectors

    policy = ActionPolicy(0)
    with DistributedSyncCollector([count_env] * 2, policy, policy_factory=action_policy if factory else None,
                                  collector_class=getattr(rpc_collectors, collector_class),
                                  num_workers_per_collector=1 if collector_class == "Collector" else 2,
                                  frames_per_batch=40, total_frames=200, launcher="mp") as c:
        actions = []
        for batch in c:
            actions.append(batch["action"].unique().tolist())
            policy.set_action(1)
    assert actions == [[0]] + [[1]] * 4


@pytest.mark.parametrize("sync", [True, False])
def test_a_push_reaches_every_local_worker_of_an_async_node_before_its_next_batch(sync):
    """Node collectors of 2 async local workers. Sync rounds: after a push, the next round holds only the new weights
    (what the local workers collected before is dropped). Async: nothing is dropped; each node's batches hold the
    versions that chose them, and the new one once the batches begun before it are out."""
    from rpc_collectors import MultiAsyncCollector

    policy = ActionPolicy(0)
    with DistributedCollector([count_env] * 2, policy, collector_class=MultiAsyncCollector, num_workers_per_collector=2,
                              frames_per_batch=20, total_frames=-1, sync=sync, launcher="mp",
                              track_policy_version=True) as c:
        seen: dict[int, list[int]] = {0: [], 1: []}
        for version in range(1, 5):
            c.next()
            policy.set_action(version % 2)
            c.update_policy_weights_()
            if sync:
                batch = c.next()
                assert (batch[VERSION] == version).all() and (batch["action"] == version % 2).all()
                continue
            while not all(version in v for v in seen.values()):
                batch = c.next()
                versions = batch[VERSION].unique().tolist()
                assert len(versions) == 1 and (batch["action"] == versions[0] % 2).all()
                seen[int(batch[WORKER][0])].append(versions[0])
        if not sync:
            assert c.dropped_frames == 0


def test_update_interval_pushes_every_kth_round():
    policy = ActionPolicy(0)
    with DistributedCollector([count_env] * 2, policy, frames_per_batch=20, total_frames=100, sync=True,
                              update_interval=2, launcher="mp") as c:
        versions = []
        for _ in c:
            versions.append(c.last_batch.newest_version)
            policy.set_action(1)
    assert versions == [0, 0, 1, 1, 2]


def test_distributed_policy_factory_builds_the_policy_in_each_worker():
    from test_collector_options import PidPolicy, cartpole

    with DistributedSyncCollector([cartpole] * 2, policy_factory=PidPolicy, launcher="mp", frames_per_batch=8,
                                  total_frames=8) as c:
        batch = c.next()
    builders = {int(lane.get("built_in")[0]) for lane in batch.unbind(0)}
    assert len(builders) == 2 and os.getpid() not in builders and (batch.get("action") == 0).all()


@pytest.mark.parametrize("kwargs, error, words", [
    ({"update_interval": 0}, ValueError, ["update_interval=0", "int >= 1"]),
    ({"update_interval": 2, "update_after_each_batch": True}, ValueError, ["update_interval=2", "one way"]),
    ({"weight_sync_schemes": {"policy": object()}}, ValueError, ["weight_sync_schemes={'policy': object}",
                                                                  "cannot map", "SharedMemWeightSyncScheme"]),
    ({"weight_recv_schemes": {}}, ValueError, ["weight_recv_schemes={}", "not supported"]),
    ({"launcher": "submitit_delayed"}, ValueError, ["submitit_delayed", "slurm/submit.py"]),
    ({"launcher": "submitit", "slurm_kwargs": {"folder": ""}}, ValueError, ["slurm_kwargs={'folder': ''}",
                                                                            "without it ./log_test"]),
    ({"launcher": "submitit", "slurm_kwargs": ["log_test"]}, ValueError, ["slurm_kwargs=['log_test']", "None or a dict"]),
    ({"launcher": "submitit", "slurm_kwargs": {"folder": "/tmp/x", "slurm_bogus": 1}}, ValueError,
     ["slurm_kwargs=", "bogus", "update_parameters"]),
    ({"launcher": "mp", "slurm_kwargs": {"folder": "/tmp/x"}}, ValueError, ["slurm_kwargs=", "launcher='submitit'"]),
    ({"launcher": "submitit", "slurm_kwargs": {"folder": "/tmp/x", "max_resubmits": -1}}, ValueError,
     ["slurm_kwargs['max_resubmits']=-1", "an int >= 0"]),
    ({"launcher": "mp", "tcp_port": 70000}, ValueError, ["tcp_port=70000", "1..65535"]),
    ({"launcher": "mp", "tcp_port": "70000"}, ValueError, ["tcp_port='70000'", "1..65535", "string of digits"]),
    ({"launcher": "mp", "tcp_port": "41x01"}, ValueError, ["tcp_port='41x01'", "string of digits"]),
    ({"launcher": "mp", "tcp_port": 4.0}, ValueError, ["tcp_port=4.0", "an int"]),
    ({"launcher": "debug", "tcp_port": 12345}, ValueError, ["tcp_port=12345", "launcher='debug'"]),
    ({"launcher": "launcher_x"}, ValueError, ["launcher='launcher_x'", "'mp'", "'submitit'"]),
    ({"launcher": "mp", "backend": "mpi"}, ValueError, ["backend='mpi'", "'gloo'"]),
])
def test_bad_arguments_are_clear_errors_before_any_process(kwargs, error, words):
    from procs import descendants

    before = descendants()
    with pytest.raises(error) as info:
        DistributedCollector([count_env] * 2, ActionPolicy(), frames_per_batch=20, **kwargs)
    assert all(w in str(info.value) for w in words), str(info.value)
    assert descendants() == before


def test_torchrl_module_names():
    assert distributed.DistributedCollector is DistributedCollector
    assert distributed.DistributedSyncCollector is DistributedSyncCollector
    assert distributed.RPCCollector is RPCCollector


# ------------------------------------------------------------------ TorchRL's RPCCollector keywords
def test_torchrls_single_machine_rpc_call_collects_each_workers_steps():
    """TorchRL's single_machine/rpc.py on a machine without CUDA (``visible_devices=None``): each
    worker's frames are a single-process Collector's, frame for frame."""
    with RPCCollector([count_env] * 2, ActionPolicy(1), num_workers_per_collector=1, frames_per_batch=20,
                      total_frames=160, collector_class=Collector,
                      collector_kwargs={"device": "cpu", "storing_device": "cpu"}, sync=False, storing_device="cpu",
                      launcher="mp", visible_devices=None) as c:
        per_worker = {0: [], 1: []}
        for batch in c:
            (worker,) = c.last_batch.worker_frames
            per_worker[worker].append(batch)
    with Collector(count_env, ActionPolicy(1), frames_per_batch=20, total_frames=160) as single:
        expected = torch.cat(list(single))
    keys = [OBS, "action", ("next", OBS), ("next", "reward"), ("next", "done")]
    assert per_worker[0] and per_worker[1], "both workers delivered"
    for batches in per_worker.values():
        ours = torch.cat(batches)
        assert ours.device == torch.device("cpu")
        for key in keys:
            assert torch.equal(ours[key], expected[key][:ours.numel()]), key


@pytest.mark.parametrize("cls", [RPCCollector, DistributedCollector])
@pytest.mark.parametrize("name, value, words", [
    ("visible_devices", [1, 2], ["visible_devices=[1, 2]", "device map", "host memory", "storing_device"]),
    ("tensorpipe_options", {"num_worker_threads": 4}, ["tensorpipe_options={'num_worker_threads': 4}", "rpc_timeout"]),
    ("weight_updater", "updater", ["weight_updater='updater'", "update_policy_weights_"]),
    ("weight_recv_schemes", {}, ["weight_recv_schemes={}", "update_policy_weights_"]),
])
def test_torchrls_rpc_arguments_without_a_counterpart_are_refused_saying_why(cls, name, value, words):
    """TorchRL's RPCCollector keywords that cannot mean anything here: None, their default, is
    accepted; any other value is a ValueError before any process starts."""
    from procs import descendants

    before = descendants()
    with pytest.raises(ValueError) as info:
        cls([count_env] * 2, ActionPolicy(), frames_per_batch=20, launcher="mp", **{name: value})
    assert all(w in str(info.value) for w in [*words, "not supported", "accepted: None"]), str(info.value)
    assert descendants() == before


@pytest.mark.parametrize("name", ["visible_devices", "tensorpipe_options"])
def test_local_multi_collectors_take_no_rpc_keywords_as_torchrls(name):
    with pytest.raises(TypeError, match=f"MultiSyncCollector.__init__.. got an unexpected keyword argument '{name}'"):
        MultiSyncCollector([count_env] * 2, None, frames_per_batch=20, **{name: None})


@pytest.mark.parametrize("cls", [DistributedCollector, DistributedSyncCollector])
def test_distributed_collectors_refuse_an_unknown_keyword_before_any_process_starts(cls):
    from procs import descendants

    before = descendants()
    with pytest.raises(TypeError, match=f"{cls.__name__}.__init__.. got an unexpected keyword argument 'num_envs'"):
        cls([count_env] * 2, None, frames_per_batch=20, launcher="mp", num_envs=2)
    assert descendants() == before


# ------------------------------------------------------------------ "mp" and tcp_port
def _listens(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_mp_tcp_port_given_and_not_given_two_collectors_on_one_host():
    """"mp" is local worker processes; tcp_port is where the weight group's store listens
    (broadcast transport), a free port when not given. Two such collectors run side by side."""
    port = free_port()
    policy_a, policy_b = ActionPolicy(0), ActionPolicy(1)
    with RPCCollector([count_env] * 2, policy_a, frames_per_batch=20, launcher="mp", tcp_port=port,
                      weight_transport="broadcast") as a, \
         RPCCollector([count_env] * 2, policy_b, frames_per_batch=20, launcher="mp",
                      weight_transport="broadcast") as b:
        assert a.workers.rdv.master_port == port and _listens(port)
        assert b.workers.rdv.master_port != port and _listens(b.workers.rdv.master_port)
        policy_a.set_action(1)
        policy_b.set_action(0)
        a.update_policy_weights_()
        b.update_policy_weights_()
        assert (next(iter(a))["action"] == 1).all() and (next(iter(b))["action"] == 0).all()
    assert not _listens(port)


def test_mp_tcp_port_as_a_string_of_digits_is_that_port():
    """TorchRL passes ``tcp_port=str(port)`` (and stores it as a string): the store listens there."""
    port = free_port()
    with RPCCollector([count_env] * 2, ActionPolicy(), frames_per_batch=20, launcher="mp", tcp_port=str(port),
                      weight_transport="broadcast") as c:
        assert c.workers.rdv.master_port == port and _listens(port)
        assert next(iter(c)).shape == (20,)
    assert not _listens(port)


def test_mp_tcp_port_taken_is_an_error_naming_it():
    port = free_port()
    with RPCCollector([count_env] * 2, ActionPolicy(), frames_per_batch=20, launcher="mp", tcp_port=port,
                      weight_transport="broadcast"):
        with pytest.raises(ValueError, match=f"tcp_port={port} is already in use"):
            RPCCollector([count_env] * 2, ActionPolicy(), frames_per_batch=20, launcher="mp", tcp_port=port,
                         weight_transport="broadcast")


def test_mp_with_shared_memory_weights_opens_no_port():
    """With the default transport the workers share the trainer's memory: tcp_port is not opened,
    so two collectors given the same port both run."""
    port = free_port()
    with MultiCollector([count_env] * 2, ActionPolicy(), frames_per_batch=20, launcher="mp", tcp_port=port) as a, \
         MultiCollector([count_env] * 2, ActionPolicy(), frames_per_batch=20, launcher="mp", tcp_port=port) as b:
        assert next(iter(a)).shape == next(iter(b)).shape == (2, 10)
        assert not _listens(port)


# ------------------------------------------------------------------ Collector(backend=...)
@pytest.mark.parametrize("backend, options, cls, sync, shape", [
    (None, {}, MultiAsyncCollector, False, (20,)),
    ("process", {}, MultiSyncCollector, True, (2, 10)),
    ("multiprocessing", {}, MultiSyncCollector, True, (2, 10)),
    ("rpc", {"launcher": "mp"}, RPCCollector, True, (20,)),
    ("distributed", {"launcher": "mp"}, DistributedCollector, True, (2, 10)),
])
def test_collector_dispatches_to_the_backend(backend, options, cls, sync, shape):
    c = Collector(count_env, ActionPolicy(), num_collectors=2, backend=backend, sync=sync if backend else None,
                  backend_options=options, frames_per_batch=20, total_frames=40)
    with c:
        assert type(c) is cls and c.num_workers == 2 and c.sync is sync
        batches = list(c)
    assert [b.shape for b in batches] == [shape] * 2
    for b in batches:
        check_frames(b.reshape(2, 10) if len(shape) == 1 and sync else b)  # rpc: the workers' [T] concatenated


def test_collector_direct_is_this_process():
    for c in (Collector(count_env, frames_per_batch=10, total_frames=20),
              Collector([count_env], backend="direct", num_collectors=1, frames_per_batch=10, total_frames=20)):
        with c:
            assert type(c) is Collector
            assert [b.shape for b in c] == [(10,), (10,)]


def test_collector_list_of_envs_gives_the_number_of_collectors():
    with Collector([count_env] * 3, None, backend="process", sync=True, frames_per_batch=30, total_frames=30) as c:
        assert c.num_workers == 3 and next(iter(c)).shape == (3, 10)


def test_collector_submitit_backend_is_distributed_collector_with_the_submitit_launcher(monkeypatch):
    """backend='submitit' builds a DistributedCollector that submits jobs (stopped here at its
    slurm_kwargs check, before anything starts)."""
    seen = {}
    original = DistributedCollector.__init__

    def spy(self, *args, **kwargs):
        seen.update(kwargs)
        original(self, *args, **kwargs)

    monkeypatch.setattr(DistributedCollector, "__init__", spy)
    with pytest.raises(ValueError, match="slurm_kwargs=.*slurm_bogus.* is invalid"):
        Collector(count_env, None, num_collectors=2, backend="submitit", frames_per_batch=20,
                  backend_options={"slurm_kwargs": {"slurm_bogus": 1}})
    assert seen["launcher"] == "submitit" and seen["sync"] is False and len(seen) > 2


def test_submitit_jobs_log_to_torchrls_folder_when_slurm_kwargs_has_none(monkeypatch, tmp_path):
    """TorchRL's distributed collectors never pass a folder: theirs is ./log_test, and so is ours."""
    from rpc_collectors.cluster import jobs

    monkeypatch.chdir(tmp_path)
    for slurm_kwargs in (None, {"timeout_min": 100, "slurm_partition": "train"}):
        executor = jobs.executor(slurm_kwargs)
        assert executor.folder == tmp_path / "log_test" and executor.default_folder
    assert not jobs.executor({"folder": str(tmp_path / "mine")}).default_folder


@pytest.mark.xdist_group("ray")  # its own Ray: never beside tests/collectors/test_ray.py's
def test_collector_ray_backend_builds_a_ray_collector_or_says_what_is_missing():
    """With ray installed: a RayCollector; otherwise an
    ImportError saying so, before anything starts."""
    if importlib.util.find_spec("ray") is None:
        with pytest.raises(ImportError, match=r"backend='ray': RayCollector needs Ray: pip install \"rpc_collectors\[ray\]\""):
            Collector(count_env, None, num_collectors=2, backend="ray", frames_per_batch=20)
        return
    from rpc_collectors.collectors.ray import RayCollector

    with Collector("CartPole-v1", None, num_collectors=2, backend="ray", sync=True, frames_per_batch=20,
                   total_frames=20) as c:  # an env id: Ray's workers need not import the tests
        assert type(c) is RayCollector and c.num_workers == 2
        batch = next(iter(c))
    assert batch.numel() == 20


@pytest.mark.parametrize("kwargs, error, words", [
    ({"backend": "direct", "num_collectors": 2}, ValueError, ["backend='direct'", "num_collectors=2"]),
    ({"sync": True}, ValueError, ["sync=True", "backend='direct'"]),
    ({"backend_options": {"launcher": "mp"}}, ValueError, ["backend_options=", "backend='direct'"]),
    ({"backend": "thread"}, ValueError, ["backend='thread'", "'process'"]),
    ({"backend": "process", "sync": "yes"}, TypeError, ["sync='yes'"]),
    ({"num_collectors": 0}, ValueError, ["num_collectors=0"]),
    ({"num_collectors": 2.0}, TypeError, ["num_collectors=2.0"]),
    ({"backend": "process", "backend_options": {"num_workers": 2}}, ValueError, ["num_workers", "reserved for Collector's own"]),
    ({"backend": "process", "backend_options": {"frames_per_batch": 10}}, ValueError, ["frames_per_batch", "duplicate"]),
    ({"backend": "process", "backend_options": []}, TypeError, ["backend_options=[]"]),
    ({"backend": "submitit", "backend_options": {"launcher": "mp"}}, ValueError, ["backend='submitit'", "launcher='mp'"]),
    ({"backend": "process", "num_collectors": 3, "env_list": 2}, ValueError, ["num_collectors=3", "2 env constructors"]),
    ({"backend": "direct", "env_list": 2}, ValueError, ["backend='direct'", "2 env constructors"]),
])
def test_collector_contradictions_are_errors_before_any_process(kwargs, error, words):
    from procs import descendants

    kwargs = dict(kwargs)
    env = [count_env] * kwargs.pop("env_list", 0) or count_env
    before = descendants()
    with pytest.raises(error) as info:
        Collector(env, None, frames_per_batch=20, **kwargs)
    assert all(w in str(info.value) for w in words), str(info.value)
    assert descendants() == before


def test_collector_subclass_and_positional_errors():
    class Mine(Collector):
        pass

    with pytest.raises(TypeError, match="only accepted by Collector itself"):
        Mine(count_env, None, frames_per_batch=10, num_collectors=2)
    with pytest.raises(TypeError, match="at most create_env_fn and policy positionally"):
        Collector(count_env, None, 10, num_collectors=2)


def test_collector_signature_shows_its_arguments_and_the_dispatch_keywords():
    import inspect

    parameters = inspect.signature(Collector).parameters
    assert list(parameters)[:2] == ["create_env_fn", "policy"] and "frames_per_batch" in parameters
    assert all(parameters[name].default is None for name in ("backend", "backend_options", "num_collectors", "sync"))


def test_submitit_without_a_reachable_slurm_cluster_is_a_clear_error(monkeypatch, tmp_path):
    from procs import descendants

    for name in ("SLURM_CONF", "TP_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):  # no cluster configured
        monkeypatch.delenv(name, raising=False)
    before = descendants()
    with pytest.raises(RuntimeError, match=r"needs a SLURM cluster .* `scontrol show config` failed .* SLURM_CONF"):
        DistributedCollector([count_env] * 2, None, frames_per_batch=20, slurm_kwargs={"folder": str(tmp_path)})
    assert descendants() == before and not list(tmp_path.glob("*rendezvous*"))


def test_submitit_tcp_port_taken_is_an_error_naming_it_before_any_job(monkeypatch, tmp_path):
    """The trainer's rendezvous listens at tcp_port; taken, it is refused before any job is submitted."""
    monkeypatch.setenv("TP_SOCKET_IFNAME", "lo")  # where the jobs would reach this trainer: no cluster needed
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with pytest.raises(ValueError, match=f"tcp_port={port} is already in use"):
            DistributedCollector([count_env] * 2, None, frames_per_batch=20, tcp_port=port,
                                 slurm_kwargs={"folder": str(tmp_path)})
    assert not list(tmp_path.iterdir()), "nothing was written or submitted"
