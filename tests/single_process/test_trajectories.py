"""split_trajectories and trajectory ids."""
from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from rpc_collectors import split_trajectories
from rpc_collectors.single_process.trajectories import TrajectoryIds


def batch(ids: list) -> TensorDict:
    ids = torch.tensor(ids)
    td = TensorDict(
        {
            "observation": torch.arange(ids.numel(), dtype=torch.float32).reshape(*ids.shape, 1) + 1,
            "next": {"reward": torch.ones(*ids.shape, 1)},
            "collector": {"traj_ids": ids},
        },
        batch_size=ids.shape,
    )
    td.names = [None] * (ids.dim() - 1) + ["time"]
    return td


def test_split_single_env():
    out = split_trajectories(batch([4, 4, 5, 5, 5, 6]))
    assert out.batch_size == torch.Size([3, 3])
    assert out.names == [None, "time"]
    mask = out["collector", "mask"]
    assert mask.dtype == torch.bool
    assert mask.tolist() == [[True, True, False], [True, True, True], [True, False, False]]
    assert out["observation"][..., 0].tolist() == [[1, 2, 0], [3, 4, 5], [6, 0, 0]]
    assert out["collector", "traj_ids"].tolist() == [[4, 4, 0], [5, 5, 5], [6, 0, 0]]
    assert out["next", "reward"][~mask].abs().sum() == 0


def test_split_vector_env():
    """[B, T]: trajectories of each env in turn; an id never merges two envs' rows."""
    out = split_trajectories(batch([[0, 0, 3, 3], [1, 1, 1, 1], [2, 4, 4, 5]]))
    assert out.batch_size == torch.Size([6, 4])
    assert out["collector", "mask"].sum(-1).tolist() == [2, 2, 4, 1, 2, 1]
    assert out["collector", "traj_ids"][:, 0].tolist() == [0, 3, 1, 2, 4, 5]
    assert out["observation"][2, :, 0].tolist() == [5, 6, 7, 8]
    # every real step appears exactly once
    obs = out["observation"][out["collector", "mask"]].squeeze(-1)
    assert sorted(obs.tolist()) == list(range(1, 13))


def test_split_three_dims_as_rows_of_envs():
    """[N, B, T] (a sync batch of vector envs): every env row split on its own, time last."""
    ids = torch.tensor([[[0, 0, 1], [2, 2, 2]], [[3, 4, 4], [5, 5, 6]]])
    td = TensorDict({"collector": {"traj_ids": ids}, "x": torch.arange(12.0).reshape(2, 2, 3)}, batch_size=[2, 2, 3])
    out = split_trajectories(td)
    assert out.batch_size == torch.Size([7, 3])
    assert out["collector", "mask"].sum(-1).tolist() == [2, 1, 3, 1, 2, 2, 1]
    assert out["x"][out["collector", "mask"]].tolist() == list(range(12))


def test_split_rejects_bad_input():
    with pytest.raises(ValueError, match="batch size"):
        split_trajectories(TensorDict({"collector": {"traj_ids": torch.zeros(())}}, batch_size=[]))
    with pytest.raises(KeyError, match="traj_ids"):
        split_trajectories(TensorDict({"a": torch.zeros(3)}, batch_size=[3]))


def test_trajectory_ids_strided_never_collide():
    workers = [TrajectoryIds(start=w, stride=3) for w in range(3)]
    ids = [i for _ in range(4) for w in workers for i in w.new(2).tolist()]
    assert len(set(ids)) == len(ids)
    assert workers[1].new(2).tolist() == [25, 28]


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype stage")  # torch's, for as_nested=True
def test_split_keyword_arguments_as_torchrls():
    """prefix, trajectory_key, done_key and as_nested read and write TorchRL's keys."""
    ids = torch.tensor([7, 7, 8, 8, 8, 9])
    plain = TensorDict({"traj_ids": ids, "x": torch.arange(6.0)}, batch_size=[6])
    assert split_trajectories(plain)["mask"].sum(-1).tolist() == [2, 3, 1]  # no "collector" entry: no prefix
    nested_key = TensorDict({("meta", "tid"): ids, "x": torch.arange(6.0)}, batch_size=[6])
    out = split_trajectories(nested_key, trajectory_key=("meta", "tid"))
    assert out["meta", "mask"].sum(-1).tolist() == [2, 3, 1]
    mine = TensorDict({("mine", "traj_ids"): ids}, batch_size=[6])
    assert split_trajectories(mine, prefix="mine")["mine", "mask"].shape == (3, 3)
    end = torch.tensor([0, 1, 0, 0, 1, 0], dtype=torch.bool).unsqueeze(-1)
    no_ids = TensorDict({"x": torch.arange(6.0), ("next", "end"): end}, batch_size=[6])
    out = split_trajectories(no_ids, done_key="end")
    assert out["traj_ids"].tolist() == [[0, 0, 0], [1, 1, 1], [2, 0, 0]]
    assert out["x"].tolist() == [[0, 1, 0], [2, 3, 4], [5, 0, 0]]
    nested = split_trajectories(batch([4, 4, 5, 5, 5, 6]), as_nested=True)
    assert nested.batch_size[0] == 3 and ("collector", "mask") not in nested.keys(True)
    assert [t.squeeze(-1).tolist() for t in nested["observation"].unbind(0)] == [[1, 2], [3, 4, 5], [6]]
