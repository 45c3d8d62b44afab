"""``RunCheckpoint``: save and resume a whole training run, and stop it for a SLURM requeue.

    ckpt = RunCheckpoint(directory, collector=collector, modules={"policy": policy},
    optimizers={"adam": adam}) extra = ckpt.resume() or {} # the last checkpoint's user dict; None
    on a fresh run for batch in collector:
        ...                                # train on the batch, push the weights
        ckpt.after_batch({"step": step})   # saves every `every` batches; after SLURM's stop signal:
                                           # saves, shuts the collector
                                           down, requeues the job, exits

The file format and its atomic write are in :mod:`.checkpoint`; the signals in :mod:`.requeue`.
"""
from __future__ import annotations

import contextlib
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any, Mapping

from rpc_collectors.cluster import checkpoint as files
from rpc_collectors.cluster import requeue, run_starts
from rpc_collectors.core import checks
from rpc_collectors.single_process.base_collector import BaseCollector


def _named(name: str, value: Any, needs: tuple[str, ...]) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise TypeError(f"{name}={value!r} is invalid; accepted: a dict of name -> object, e.g. "
                        f"{{'policy': policy}}")
    for key, obj in value.items():
        _check_methods(f"{name}[{key!r}]", obj, needs)
    return dict(value)


def _check_methods(label: str, obj: Any, needs: tuple[str, ...]) -> None:
    lacking = [method for method in needs if not callable(getattr(obj, method, None))]
    if lacking:
        raise TypeError(f"{label}={obj!r} has no {' / '.join(lacking)}; accepted: objects with "
                        f"{' and '.join(needs)} (collectors, torch modules, optimizers, TorchRL "
                        "replay buffers)")


class RunCheckpoint:
    """A run's checkpoint file ``<directory>/checkpoint.pt`` (and ``run.json``, its allocations).

    ``directory``: a folder every node reads (made if missing, checked writable now); default
    ``$RPC_COLLECTORS_CHECKPOINT_DIR``, which ``slurm.submit(..., checkpoint_dir=...)`` sets in the
    job. ``collector``, ``modules`` (name -> ``nn.Module``), ``optimizers`` (name -> optimizer) and
    ``replay_buffer`` are saved with their ``state_dict()`` and restored with ``load_state_dict``.
    ``every``: :meth:`after_batch` saves every that many batches (None: only when stopping).
    """

    def __init__(self, directory: str | os.PathLike | None = None, *, collector: Any = None,
                 modules: Mapping[str, Any] | None = None,
                 optimizers: Mapping[str, Any] | None = None,
                 replay_buffer: Any = None, every: int | None = None) -> None:
        if directory is None:
            directory = os.environ.get(files.ENV_DIR)
            if directory is None:
                raise TypeError(f"directory=None and ${files.ENV_DIR} is not set; accepted: a "
                                "folder path, or a SLURM job submitted with checkpoint_dir=...")
        self.directory = files.check_directory(directory, "directory")
        self.path = self.directory / files.FILE_NAME
        self.record_path = self.directory / files.RECORD_NAME
        files.remove_stale_temporaries(self.path)
        self.collector = collector
        if collector is not None:
            _check_methods("collector", collector, ("state_dict", "load_state_dict"))
        self.modules = _named("modules", modules, ("state_dict", "load_state_dict"))
        self.optimizers = _named("optimizers", optimizers, ("state_dict", "load_state_dict"))
        self.replay_buffer = replay_buffer
        if replay_buffer is not None:
            _check_methods("replay_buffer", replay_buffer, ("state_dict", "load_state_dict"))
        self.every = checks.optional_positive_int("every", every)
        self.batches = 0
        # which start of the run this is, once counted (resume or load)
        self.start: int | None = None
        self.allocations: list[dict] = []
        self.allocation = {"job_id": os.environ.get("SLURM_JOB_ID"),
                           "restart": requeue.restart_count(),
                           "host": socket.gethostname(), "start": files.now(), "start_frames": 0,
                           "frames": 0, "end": "running"}

    def exists(self) -> bool:
        return self.path.is_file()

    # ---------------------------------------------------------------- load
    def resume(self) -> dict | None:
        """Load the checkpoint if there is one (see :meth:`load`); None on a fresh run.
        Call it before collecting: it counts this start of the run, whose trajectory ids
        lie in a range of their own."""
        self._start()
        return self.load() if self.exists() else None

    def _start(self) -> None:
        """Count this start of the run (:mod:`.run_starts`), once, and give the
        collector its id range."""
        if self.start is None:
            self.start = self.allocation["run_start"] = run_starts.next_start(self.directory)
            if isinstance(self.collector, BaseCollector):
                self.collector.run_start = self.start

    def load(self) -> dict:
        """Restore every object from the checkpoint and return its user dict. FileNotFoundError if
        there is none; :class:`CheckpointError` naming the file if it is unreadable or of another
        run (other objects, keys or shapes); nothing is changed then."""
        content = files.read(self.path)
        self._check_same(content)
        self._start()
        if self.collector is not None:
            self.collector.load_state_dict(content["collector"])
        for group, objects in (("modules", self.modules), ("optimizers", self.optimizers)):
            for name, obj in objects.items():
                obj.load_state_dict(content[group][name])
        if self.replay_buffer is not None:
            self.replay_buffer.load_state_dict(content["replay_buffer"])
        self.allocations = [dict(a) for a in content.get("allocations", [])]
        for previous in self.allocations:
            # killed before it could checkpoint at its end
            if previous["end"] == "running":
                previous["end"] = ("ended without a final checkpoint (frames after its last one "
                                   "are collected again)")
        self.allocation["start_frames"] = self.allocation["frames"] = int(content["frames"])
        print(f"rpc_collectors: resumed from {self.path} at {content['frames']:,} frames "
              f"(allocation {len(self.allocations) + 1})", flush=True)
        return dict(content.get("extra") or {})

    def _check_same(self, content: dict) -> None:
        def fail(what: str) -> files.CheckpointError:
            return files.CheckpointError(f"{self.path} is the checkpoint of another run: {what}")

        for group, objects in (("modules", self.modules), ("optimizers", self.optimizers)):
            saved = content.get(group) or {}
            if sorted(saved) != sorted(objects):
                raise fail(f"its {group} are {sorted(saved)}, here {sorted(objects)}")
        for name, module in self.modules.items():
            differs = files.difference(content["modules"][name], module.state_dict())
            if differs:
                raise fail(f"module {name!r}: {differs}")
        for name, optimizer in self.optimizers.items():
            sizes = [len(g["params"]) for g in optimizer.state_dict()["param_groups"]]
            saved = [len(g["params"]) for g in content["optimizers"][name]["param_groups"]]
            if sizes != saved:
                raise fail(f"optimizer {name!r} has parameter groups of {saved} tensors there, "
                           f"{sizes} here")
        for key, obj in (("collector", self.collector), ("replay_buffer", self.replay_buffer)):
            if (obj is None) != (content.get(key) is None):
                raise fail(f"it {'lacks' if obj is not None else 'has'} a {key} state")
        if self.collector is not None:
            differs = files.difference(content["collector"], self.collector.state_dict())
            if differs:
                raise fail(f"the collector's state: {differs}")

    # ---------------------------------------------------------------- save
    def save(self, extra: Mapping[str, Any] | None = None, end: str = "running") -> Path:
        """Write the checkpoint (atomically) and ``run.json``; one line on stdout says so.

        A collector collecting in the background (``start()``) is held between two batches while
        the checkpoint is written, so its state counts exactly the frames in the replay buffer.
        A checkpoint that cannot be written (a full disk) shuts the collector down and raises
        :class:`~rpc_collectors.cluster.checkpoint.CheckpointWriteError`; the previous one stays."""
        held = getattr(self.collector, "between_batches", contextlib.nullcontext)
        try:
            with held():
                return self._save(extra, end)
        except files.CheckpointWriteError:
            if self.collector is not None:
                self.collector.shutdown()
            raise

    def _save(self, extra: Mapping[str, Any] | None, end: str) -> Path:
        started = time.monotonic()
        state = self.collector.state_dict() if self.collector is not None else None
        frames = int(state["frames"]) if state is not None else self.allocation["frames"]
        self.allocation.update(frames=frames, end=end, saved=files.now())
        if requeue.signalled_at() is not None:
            self.allocation["signal_at"] = round(requeue.signalled_at(), 3)
            self.allocation["signal_to"] = requeue.signalled_task()
        # collected, in no batch yet
        if state is not None and state.get("undelivered_frames") is not None:
            self.allocation["undelivered_frames"] = int(state["undelivered_frames"])
        content = {
            "format": files.FORMAT, "frames": frames, "collector": state,
            "modules": {name: m.state_dict() for name, m in self.modules.items()},
            "optimizers": {name: o.state_dict() for name, o in self.optimizers.items()},
            "replay_buffer": self.replay_buffer.state_dict() if self.replay_buffer is not None
            else None,
            "extra": dict(extra or {}), "allocations": [*self.allocations, self.allocation],
        }
        files.write_atomically(self.path, content)
        files.write_record(self.record_path, content["allocations"])
        print(f"rpc_collectors: checkpoint saved to {self.path} at {frames:,} frames "
              f"in {time.monotonic() - started:.1f} s", flush=True)
        return self.path

    def after_batch(self, extra: Mapping[str, Any] | None = None) -> None:
        """Call after each training step: saves every ``every`` batches. After SLURM's stop signal
        (a job submitted with ``requeue=True``) it saves, shuts the collector down, requeues the job
        and raises :class:`~rpc_collectors.cluster.requeue.Requeued`, which ends the script; unless
        the collector has collected its ``total_frames`` and SLURM does not requeue the job itself
        (the time-limit signal, a lone SIGTERM): then the loop ends and :meth:`finish` records the
        run as finished, in this allocation."""
        self.batches += 1
        if self.batches == 1:
            self.allocation["first_batch_at"] = round(time.time(), 3)
        reason = requeue.stop_requested()
        if reason is not None and getattr(self.collector, "completed", False) \
                and requeue.next_step(reason) in ("library", "none"):
            reason = None  # a stop after the last batch that SLURM follows with no allocation
        if reason is None:
            if self.every is not None and self.batches % self.every == 0:
                self.save(extra)
            return
        self.save(extra, end=reason)
        step = requeue.next_step(reason)
        if step != "none":
            # collector jobs that joined an elastic trainer come back with it
            requeue.requeue_followers()
        if self.collector is not None:
            self.collector.shutdown()
        if step == "library":
            requeue.requeue()
        signalled = requeue.signalled_at()
        after = "" if signalled is None else f" {time.time() - signalled:.1f} s after the signal"
        print(f"rpc_collectors: {reason}; the signal reached {requeue.signalled_task()}; job "
              f"{os.environ.get('SLURM_JOB_ID', '?')} {requeue.outcome(reason, step)}{after}, "
              f"{self.allocation['frames']:,} frames checkpointed", file=sys.stderr, flush=True)
        raise requeue.Requeued(reason)

    def finish(self, extra: Mapping[str, Any] | None = None) -> Path:
        """Save a last checkpoint, its allocation ending ``"finished"``."""
        return self.save(extra, end="finished")
