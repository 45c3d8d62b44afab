"""TorchRL's ``trust_policy``, ``cudagraph_policy`` and ``weight_sync_schemes`` without torchrl
installed (TorchRL's scheme objects themselves: tests/test_torchrl_interop.py)."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch import nn

from conftest import CountEnv
from rpc_collectors import Collector, GymEnv, MultiSyncCollector
from rpc_collectors.core.torchrl_args import weight_sync_schemes
from test_rpc_collector import BiasPolicy

pytestmark = pytest.mark.timeout(120)


def count_env() -> GymEnv:
    return GymEnv(CountEnv())


class TensorDictPolicy(nn.Module):
    """A plain module whose forward takes the step's TensorDict (TorchRL's trusted policies)."""

    def __init__(self) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.ones(()))

    def forward(self, td):
        td.set("action", torch.ones(td.batch_size, dtype=torch.int64))
        td.set("saw_keys", torch.full(td.batch_size, len(td.keys())))
        return td


def test_trust_policy_calls_a_plain_module_on_the_tensordict():
    batch = Collector(count_env, TensorDictPolicy(), frames_per_batch=4, trust_policy=True).next()
    assert (batch["action"] == 1).all() and (batch["saw_keys"] > 1).all()
    with pytest.raises(AttributeError, match="Tensor.* has no attribute .set."):  # untrusted: given the observation
        Collector(count_env, TensorDictPolicy(), frames_per_batch=4).next()
    with pytest.raises(TypeError, match="trust_policy='yes' is invalid"):
        Collector(count_env, TensorDictPolicy(), frames_per_batch=4, trust_policy="yes")


@pytest.mark.multiprocess
@pytest.mark.usefixtures("no_leftover_processes")
def test_trust_policy_in_workers():
    with MultiSyncCollector([count_env] * 2, TensorDictPolicy(), frames_per_batch=8, trust_policy=True) as c:
        batch = c.next()
    assert (batch["action"] == 1).all() and (batch["saw_keys"] > 1).all()


@pytest.mark.skipif(torch.cuda.is_available(), reason="without CUDA only")
def test_cudagraph_policy_without_cuda_runs_the_policy_as_it_is_with_a_warning():
    with pytest.warns(UserWarning, match="no CUDA device, so the policy runs as it is"):
        c = Collector(count_env, BiasPolicy(1, size=3), frames_per_batch=4, cudagraph_policy=True)
    assert (c.next()["action"] == 1).all()
    Collector(count_env, None, frames_per_batch=4, cudagraph_policy=False)
    with pytest.raises(TypeError, match="cudagraph_policy='x' is invalid"):
        Collector(count_env, None, frames_per_batch=4, cudagraph_policy="x")


class SharedMemWeightSyncScheme:  # the name of TorchRL's class, from another package
    pass


@pytest.mark.parametrize("value, words", [
    ({"policy": object()}, ["{'policy': object}", "cannot map"]),
    ({"policy": SharedMemWeightSyncScheme()}, ["SharedMemWeightSyncScheme", "cannot map"]),
    ({"value_net": object()}, ["['value_net']", "accepted keys: 'policy'"]),
])
def test_schemes_that_cannot_map_are_refused_naming_them(value, words):
    with pytest.raises(ValueError) as info:
        weight_sync_schemes(value, "auto")
    assert all(w in str(info.value) for w in words), str(info.value)
    with pytest.raises(TypeError, match="weight_sync_schemes=3 is invalid"):
        weight_sync_schemes(3, "auto")
    assert weight_sync_schemes(None, "rpc") == weight_sync_schemes({}, "rpc") == "rpc"


def test_importing_the_package_does_not_import_torchrl():
    code = "import sys, rpc_collectors, rpc_collectors.core.torchrl_args; assert 'torchrl' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
