"""A batched-inference collector's batch assembly (``Transitions``), driven without processes:
each frame of a batch holds what chose its action and what its step gave, whatever the dtypes."""
from __future__ import annotations

import torch
from tensordict import TensorDict

from rpc_collectors.trainer.transitions import LARGE_ROW, Transitions

NUM_ENVS, WIDTH = 3, 600  # 600 bfloat16 values: a row of 1,200 bytes, past LARGE_ROW


def plane_rows() -> TensorDict:
    """The step plane's rows: an observation of a dtype numpy lacks (bfloat16), a small int32 entry."""
    rows = TensorDict(batch_size=[NUM_ENVS])
    for key in ("observation", ("next", "observation")):
        rows.set(key, torch.zeros(NUM_ENVS, WIDTH, dtype=torch.bfloat16))
    for key in ("position", ("next", "position")):
        rows.set(key, torch.zeros(NUM_ENVS, 3, dtype=torch.int32))
    rows.set("action", torch.zeros(NUM_ENVS, dtype=torch.int64))
    rows.set(("next", "reward"), torch.zeros(NUM_ENVS, 1))
    for flag in ("done", "terminated", "truncated"):
        rows.set(("next", flag), torch.zeros(NUM_ENVS, 1, dtype=torch.bool))
    return rows


def observation(env: int, step: int) -> torch.Tensor:
    return torch.full((WIDTH,), 4 * step + env, dtype=torch.bfloat16)


def position(env: int, step: int) -> torch.Tensor:
    return torch.tensor([env, step, -step], dtype=torch.int32)


def test_each_frame_holds_what_chose_its_action_and_what_its_step_gave():
    assert WIDTH * torch.bfloat16.itemsize >= LARGE_ROW
    rows = plane_rows()
    outputs = {"action": torch.zeros((), dtype=torch.int64), "logits": torch.zeros(2)}
    transitions = Transitions(rows, outputs, frames_per_batch=4, version_key="policy_version", prefetch=1)
    steps = [0] * NUM_ENVS
    for env in range(NUM_ENVS):
        rows["observation"][env], rows["position"][env] = observation(env, 0), position(env, 0)
    batches = []
    # envs acted for together, in turns of different sizes and orders: the copies see rows out of order
    for version, envs in enumerate([[0, 1, 2], [2, 0], [1], [0, 2, 1], [1, 0], [2], [0, 1, 2], [2, 1, 0]]):
        index = torch.tensor(envs)
        inputs = {key: rows.get(key).index_select(0, index) for key in transitions.obs_keys}
        logits = torch.stack([torch.tensor(envs, dtype=torch.float32), torch.full((len(envs),), float(version))], 1)
        chosen = {"action": torch.tensor(envs) * 10 + version, "logits": logits.t().contiguous().t()}  # not contiguous
        transitions.check(chosen, len(envs))
        batches += transitions.stage(envs, inputs, chosen, version)
        for env in envs:  # the env steps: its row holds the step's result and its next observation
            steps[env] += 1
            rows["next", "observation"][env] = rows["observation"][env] = observation(env, steps[env])
            rows["next", "position"][env] = rows["position"][env] = position(env, steps[env])
            rows["next", "reward"][env] = float(version)
            rows["next", "done"][env] = steps[env] % 3 == 0
        transitions.record(envs)
    frames = torch.cat([batch.clone() for batch in batches])
    assert len(frames) == 12 and frames["observation"].dtype == torch.bfloat16
    for frame in frames.unbind(0):
        env, version = int(frame["env_index"]), int(frame["policy_version"])
        step = int(frame["position"][1])  # the step whose observation chose this action
        assert (frame["observation"] == observation(env, step)).all()
        assert (frame["next", "observation"] == observation(env, step + 1)).all()
        assert (frame["next", "position"] == position(env, step + 1)).all()
        assert int(frame["action"]) == env * 10 + version
        assert frame["logits"].tolist() == [env, version]
        assert float(frame["next", "reward"]) == version
        assert bool(frame["next", "done"]) == ((step + 1) % 3 == 0)
        assert not frame["done"].any() and not frame["truncated"].any()
    for env in range(NUM_ENVS):  # each env's frames in order from its first step (the rest fill the next batch)
        mine = frames[frames["env_index"] == env]
        assert mine["position"][:, 1].tolist() == list(range(len(mine)))


def test_a_cut_hands_out_the_transitions_due_then_the_one_before_the_cut_marked_truncated():
    rows = plane_rows()
    transitions = Transitions(rows, {"action": torch.zeros((), dtype=torch.int64)}, frames_per_batch=4,
                              version_key=None, prefetch=1)
    steps = [0] * NUM_ENVS
    batches = []

    def act_and_step(envs: list[int]) -> None:
        index = torch.tensor(envs)
        inputs = {key: rows.get(key).index_select(0, index) for key in transitions.obs_keys}
        batches.extend(transitions.stage(envs, inputs, {"action": index.clone()}, 0))
        for env in envs:
            steps[env] += 1
            rows["next", "position"][env] = rows["position"][env] = position(env, steps[env])
        transitions.record(envs)

    for env in range(NUM_ENVS):
        rows["position"][env] = position(env, 0)
    act_and_step([0, 1, 2])
    act_and_step([0, 1, 2])  # each env holds its step 1; its step 0 is due
    assert batches == []
    cut = transitions.cut(1)
    assert len(cut) == 1
    frames = cut[0]
    assert frames["env_index"].tolist() == [0, 1, 2, 1] and frames["position"][:, 1].tolist() == [0, 0, 0, 1]
    assert frames["next", "truncated"].flatten().tolist() == [False, False, False, True]
    assert frames["next", "done"].flatten().tolist() == [False, False, False, True]
    act_and_step([2, 0])
    act_and_step([0, 2])  # staging moved the steps 1 of envs 2 and 0 into the batch: 2 of 4 places
    assert batches == []
    frames = transitions.cut(0)[0]  # the steps 2 due, then env 0's step 3 opens the next batch
    assert frames["env_index"].tolist() == [2, 0, 0, 2] and frames["position"][:, 1].tolist() == [1, 1, 2, 2]
    assert not frames["next", "truncated"].any()


def test_outputs_in_any_memory_layout_are_staged_by_value():
    """A policy may write expanded (stride 0, which torch calls contiguous at one env), transposed or
    sliced outputs, for one env or several: each frame holds the values."""
    rows = plane_rows()
    outputs = {"action": torch.zeros((), dtype=torch.int64), "value": torch.zeros(1), "pair": torch.zeros(2)}
    transitions = Transitions(rows, outputs, frames_per_batch=3, version_key=None, prefetch=1)
    batches = []
    for envs in ([0], [1, 2], [0], [1], [2], [0, 1, 2]):  # the last staging moves env 2's due transition
        n = len(envs)
        chosen = {
            "action": torch.tensor(7).expand(n),  # stride 0
            "value": torch.tensor([0.5]).expand(n, 1),  # stride (0, 1)
            "pair": torch.tensor([[1.0] * n, [2.0] * n]).t(),  # transposed
        }
        inputs = {key: rows.get(key).index_select(0, torch.tensor(envs)) for key in transitions.obs_keys}
        transitions.check(chosen, n)
        batches += transitions.stage(envs, inputs, chosen, 0)
        transitions.record(envs)
    (frames,) = batches
    assert frames["env_index"].tolist() == [0, 1, 2]
    assert frames["action"].tolist() == [7, 7, 7]
    assert frames["value"].flatten().tolist() == [0.5, 0.5, 0.5]
    assert frames["pair"].tolist() == [[1.0, 2.0]] * 3
