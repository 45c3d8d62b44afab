"""``RunCheckpoint``: a whole run saved atomically and resumed, with clear errors for bad input.

The collector here is the single-process ``Collector`` (the multi-worker ones carry their state
through the same ``state_dict``; see test_resume.py). Stops for a SLURM requeue are simulated
by the signal handler the job installs; the real requeue is in test_requeue_slurm.py.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from conftest import CountEnv
from rpc_collectors import Collector, GymEnv, RunCheckpoint
from rpc_collectors.cluster import checkpoint as files
from rpc_collectors.cluster import requeue
from rpc_collectors.cluster import submission as slurm
from rpc_collectors.cluster.checkpoint import CheckpointError

TRAJ = ("collector", "traj_ids")
REPO = Path(__file__).resolve().parents[2]


def make(obs: int = 3) -> tuple[Collector, nn.Linear, torch.optim.Optimizer]:
    module = nn.Linear(obs, 2)
    collector = Collector(GymEnv(CountEnv()), None, frames_per_batch=20)
    return collector, module, torch.optim.Adam(module.parameters(), lr=1e-3)


class ListBuffer:
    """A replay buffer's checkpoint surface: ``state_dict`` / ``load_state_dict``."""

    def __init__(self) -> None:
        self.items: list[torch.Tensor] = []

    def state_dict(self) -> dict:
        return {"items": list(self.items)}

    def load_state_dict(self, state: dict) -> None:
        self.items = list(state["items"])


def test_a_resumed_run_continues_where_the_checkpoint_was(tmp_path):
    collector, module, optimizer = make()
    buffer = ListBuffer()
    ckpt = RunCheckpoint(tmp_path / "ckpt", collector=collector, modules={"net": module}, optimizers={"adam": optimizer},
                         replay_buffer=buffer)
    assert ckpt.resume() is None  # a fresh run
    before = [collector.next()[TRAJ] for _ in range(3)]
    buffer.items.append(torch.arange(3))
    module(torch.ones(3)).sum().backward()
    optimizer.step()
    ckpt.save({"step": 3})
    saved = {k: v.clone() for k, v in module.state_dict().items()}
    collector.shutdown()

    collector2, module2, optimizer2 = make()
    buffer2 = ListBuffer()
    ckpt2 = RunCheckpoint(tmp_path / "ckpt", collector=collector2, modules={"net": module2}, optimizers={"adam": optimizer2},
                          replay_buffer=buffer2)
    assert ckpt2.resume() == {"step": 3}
    assert len(buffer2.items) == 1 and torch.equal(buffer2.items[0], torch.arange(3))
    assert collector2.frames == 60
    for name, value in saved.items():
        assert torch.equal(module2.state_dict()[name], value)
    assert optimizer2.state_dict()["state"][0]["step"] == 1  # Adam's moments came back
    after = collector2.next()[TRAJ]
    assert set(after.tolist()).isdisjoint(torch.cat(before).tolist()), "a trajectory id of the saved run came back"
    collector2.shutdown()
    record = (tmp_path / "ckpt" / "run.json").read_text()
    assert '"start_frames": 0' in record and '"frames": 60' in record


def test_missing_and_corrupt_files_are_named(tmp_path):
    ckpt = RunCheckpoint(tmp_path)
    with pytest.raises(FileNotFoundError, match=str(ckpt.path)):
        ckpt.load()
    ckpt.save({"a": 1})
    data = ckpt.path.read_bytes()
    ckpt.path.write_bytes(data[: len(data) // 2])  # a truncated copy
    with pytest.raises(CheckpointError, match=f"{ckpt.path} is not a readable checkpoint"):
        ckpt.load()
    ckpt.path.write_bytes(b"not a checkpoint at all")
    with pytest.raises(CheckpointError, match=str(ckpt.path)):
        ckpt.load()
    torch.save({"model": 1}, ckpt.path)  # some other program's file
    with pytest.raises(CheckpointError, match="not an rpc_collectors checkpoint"):
        ckpt.load()


def test_a_checkpoint_of_another_env_is_refused_before_anything_changes(tmp_path):
    _, module, optimizer = make(obs=3)
    RunCheckpoint(tmp_path, modules={"net": module}, optimizers={"adam": optimizer}).save()
    _, other, other_opt = make(obs=4)  # an env with 4 observations: other shapes
    kept = {k: v.clone() for k, v in other.state_dict().items()}
    with pytest.raises(CheckpointError, match=r"another run: module 'net': 'weight' is \(\(2, 3\)"):
        RunCheckpoint(tmp_path, modules={"net": other}, optimizers={"adam": other_opt}).load()
    assert all(torch.equal(other.state_dict()[k], v) for k, v in kept.items())
    with pytest.raises(CheckpointError, match=r"its modules are \['net'\], here \['policy'\]"):
        RunCheckpoint(tmp_path, modules={"policy": module}, optimizers={"adam": optimizer}).load()
    with pytest.raises(CheckpointError, match="it lacks a collector state"):
        RunCheckpoint(tmp_path, collector=make()[0], modules={"net": module}, optimizers={"adam": optimizer}).load()


def test_bad_arguments_and_an_unwritable_folder_fail_before_any_job(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(ValueError, match=f"directory='{blocker}/ckpt' is not a writable folder"):
        RunCheckpoint(blocker / "ckpt")
    with pytest.raises(TypeError, match="modules=.* accepted: a dict of name -> object"):
        RunCheckpoint(tmp_path, modules=[nn.Linear(1, 1)])
    with pytest.raises(TypeError, match=r"optimizers\['adam'\]=.* has no state_dict"):
        RunCheckpoint(tmp_path, optimizers={"adam": object()})
    with pytest.raises(TypeError, match="replay_buffer=.* has no state_dict / load_state_dict"):
        RunCheckpoint(tmp_path, replay_buffer=[])
    with pytest.raises(ValueError, match="every=0"):
        RunCheckpoint(tmp_path, every=0)
    # submitting checks the folder and a checkpoint already there before any job is submitted
    with pytest.raises(ValueError, match=f"checkpoint_dir='{blocker}/ckpt' is not a writable folder"):
        slurm.submit(print, log_dir=tmp_path / "logs", requeue=True, checkpoint_dir=blocker / "ckpt")
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "checkpoint.pt").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match=str(tmp_path / "ckpt" / "checkpoint.pt")):
        slurm.submit(print, log_dir=tmp_path / "logs", requeue=True, checkpoint_dir=tmp_path / "ckpt")
    with pytest.raises(ValueError, match="signal_delay_s=120 is invalid with time_min=2"):
        slurm.SlurmConfig(log_dir=tmp_path, time_min=2, requeue=True)
    # a signal 5 s into each allocation would come while the job starts
    with pytest.raises(ValueError, match=r"signal_delay_s=115 is invalid with time_min=2 and requeue=True: .* 5 s after "
                                         r"it starts.*accepted: signal_delay_s <= 60"):
        slurm.SlurmConfig(log_dir=tmp_path, time_min=2, signal_delay_s=115, requeue=True)
    slurm.SlurmConfig(log_dir=tmp_path, time_min=2, signal_delay_s=60, requeue=True)
    cli = subprocess.run([sys.executable, str(REPO / "slurm" / "submit.py"), str(REPO / "examples" / "ppo.py"),
                          "--log-dir", str(tmp_path), "--requeue", "--checkpoint-dir", str(blocker / "x")],
                         capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert cli.returncode == 2 and f"checkpoint_dir='{blocker}/x' is not a writable folder" in cli.stderr


@pytest.fixture
def trainer_signals(monkeypatch):
    """This process as a requeueable job's trainer (job 7, one requeue left): its stop signals
    noted by :mod:`requeue`'s handlers, restored afterwards."""
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    previous = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGUSR2)
    requeue.install(trainer=True, max_requeues=1)
    yield
    requeue.reset()
    signal.signal(signal.SIGTERM, previous[0])
    signal.signal(signal.SIGUSR2, previous[1])
    os.environ.pop(requeue.ENV_REQUEUE, None)


def test_a_stop_signal_checkpoints_after_the_batch_and_ends_the_script(tmp_path, trainer_signals):
    """What a requeueable job's trainer does on SIGTERM (preemption): the batch in progress is
    trained on, then the run is saved, the collector shut down, and Requeued ends the script."""
    collector, module, _ = make()
    ckpt = RunCheckpoint(tmp_path, collector=collector, modules={"net": module}, every=2)
    seen = 0
    with pytest.raises(requeue.Requeued):
        for i, _batch in enumerate(collector):
            seen += 1
            if i == 2:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.1)  # the handler runs; the loop goes on to the end of this batch
            ckpt.after_batch({"batches": seen})
    assert seen == 3 and collector._closed
    resumed = RunCheckpoint(tmp_path, modules={"net": module}, collector=make()[0])
    assert resumed.resume() == {"batches": 3}
    assert resumed.allocations[0]["end"] == requeue.STOPPED and resumed.allocations[0]["frames"] == 60
    resumed.collector.shutdown()


@pytest.mark.parametrize("signalled", [0, 1, 2])
def test_the_time_limit_signal_requeues_a_run_with_frames_left_and_finishes_a_complete_one(
        tmp_path, monkeypatch, trainer_signals, signalled):
    """SLURM's time-limit signal during batch ``signalled`` of a 3-batch run: before the last, the
    run is saved and the job requeued; during the last, the run is complete, so the loop ends and
    ``finish`` records it finished in this allocation, with no requeue for an allocation that would
    have nothing to collect."""
    requeues = []
    monkeypatch.setattr(requeue, "requeue", lambda: requeues.append(1))
    collector = Collector(GymEnv(CountEnv()), None, frames_per_batch=20, total_frames=60)
    ckpt = RunCheckpoint(tmp_path, collector=collector)
    last = signalled == 2
    with contextlib.nullcontext() if last else pytest.raises(requeue.Requeued):
        for i, _batch in enumerate(collector):
            if i == signalled:
                os.kill(os.getpid(), signal.SIGUSR2)
                time.sleep(0.1)
            ckpt.after_batch()
        ckpt.finish()
    collector.shutdown()
    allocation, = files.read(ckpt.path)["allocations"]
    assert allocation["end"] == ("finished" if last else requeue.TIME_LIMIT)
    assert allocation["frames"] == 20 * (signalled + 1) and "signal_at" in allocation
    assert requeues == ([] if last else [1])


WRITER = textwrap.dedent("""
    import sys, torch
    from torch import nn
    from rpc_collectors import RunCheckpoint
    net = nn.Linear(2048, 2048)  # 16 MB a save
    ckpt = RunCheckpoint(sys.argv[1], modules={"net": net})
    step = 0
    while True:
        step += 1
        with torch.no_grad():
            net.bias.fill_(step)
        ckpt.save({"step": step})
        print(step, flush=True)
""")


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_a_kill_during_a_save_leaves_the_previous_checkpoint(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        lines = iter(proc.stdout.readline, "")
        assert "1" in (next(lines).strip(), next(lines).strip())  # one checkpoint is complete (and its log line)
        deadline = time.monotonic() + 60
        while not list(tmp_path.glob(".checkpoint.pt.*.tmp")):  # the next save is being written
            assert time.monotonic() < deadline and proc.poll() is None, "no save in progress seen"
            time.sleep(0.005)
        proc.kill()
    finally:
        proc.kill()
        proc.wait(30)
        proc.stdout.close()
    assert list(tmp_path.glob(".checkpoint.pt.*.tmp")), "the killed save left no temporary file"
    net = nn.Linear(2048, 2048)
    extra = RunCheckpoint(tmp_path, modules={"net": net}).load()
    assert extra["step"] >= 1 and (net.bias == extra["step"]).all()
    assert not list(tmp_path.glob(".checkpoint.pt.*.tmp")), "the killed save's temporary file is still there"


def test_a_temporary_file_a_live_save_holds_is_kept(tmp_path):
    RunCheckpoint(tmp_path).save({"a": 1})
    fd, live = files._locked_temporary(tmp_path / files.FILE_NAME)  # as a save in progress holds it
    try:
        stale = tmp_path / ".checkpoint.pt.killed.tmp"
        stale.write_bytes(b"half a checkpoint")
        RunCheckpoint(tmp_path).save({"a": 2})
        assert Path(live).exists() and not stale.exists()
    finally:
        os.close(fd)
        os.unlink(live)


def test_a_flipped_bit_is_refused(tmp_path):
    module = nn.Linear(64, 64)
    ckpt = RunCheckpoint(tmp_path, modules={"net": module})
    ckpt.save({"step": 1})
    data = bytearray(ckpt.path.read_bytes())
    data[len(data) // 2] ^= 0x10  # one bit, inside the weights: torch alone would load it
    ckpt.path.write_bytes(bytes(data))
    kept = {k: v.clone() for k, v in module.state_dict().items()}
    with pytest.raises(CheckpointError, match=f"{ckpt.path} is not a readable checkpoint .*SHA-256 checksum"):
        ckpt.load()
    assert all(torch.equal(module.state_dict()[k], v) for k, v in kept.items())


def test_a_checkpoint_written_before_checksums_still_loads(tmp_path):
    module = nn.Linear(4, 4)
    ckpt = RunCheckpoint(tmp_path, modules={"net": module})
    ckpt.save({"step": 1})
    ckpt.path.write_bytes(ckpt.path.read_bytes()[files.HEADER_SIZE:])  # torch's file alone, as saves wrote it before
    assert RunCheckpoint(tmp_path, modules={"net": nn.Linear(4, 4)}).load() == {"step": 1}


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB file system of its own (tmpfs), unmounted afterwards."""
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], check=True, timeout=30)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True, timeout=30)


def test_a_full_disk_names_the_folder_keeps_the_checkpoint_and_shuts_the_collector_down(small_disk):
    collector, module, _ = make()
    ckpt = RunCheckpoint(small_disk, collector=collector, modules={"net": module})
    collector.next()
    ckpt.save({"step": 1})
    collector.next()
    with pytest.raises(files.CheckpointWriteError,
                       match=rf"could not write checkpoint.pt to {small_disk}: .*\(the disk is full\); [0-9.]+ MiB free"):
        ckpt.save({"step": 2, "big": torch.zeros(2**19)})  # 2 MiB
    assert collector._closed
    assert not list(small_disk.glob(".checkpoint.pt.*.tmp"))
    resumed = RunCheckpoint(small_disk, collector=make()[0], modules={"net": module})
    assert resumed.load() == {"step": 1} and resumed.collector.frames == 20
    resumed.collector.shutdown()


class FrameBuffer:
    """A replay buffer that counts the frames written to it, with a checkpoint surface."""

    def __init__(self) -> None:
        self.frames = 0

    def extend(self, td) -> None:
        self.frames += td.numel()

    def state_dict(self) -> dict:
        return {"frames": self.frames}

    def load_state_dict(self, state: dict) -> None:
        self.frames = state["frames"]


@pytest.mark.timeout(120)
def test_saves_during_background_collection_count_what_the_buffer_holds(tmp_path):
    buffer = FrameBuffer()
    collector = Collector(GymEnv(CountEnv()), None, frames_per_batch=20, replay_buffer=buffer)
    ckpt = RunCheckpoint(tmp_path, collector=collector, replay_buffer=buffer)
    collector.start()
    try:
        for _ in range(8):
            deadline = time.monotonic() + 60
            while buffer.frames == 0:
                assert time.monotonic() < deadline, "background collection wrote nothing"
                time.sleep(0.01)
            ckpt.save()
            content = files.read(ckpt.path)
            assert content["replay_buffer"]["frames"] == content["collector"]["frames"] == content["frames"]
    finally:
        collector.async_shutdown(timeout=60)
