"""The arguments of TorchRL's ``AsyncBatchedCollector``, mapped onto ours before any process starts.

Ours runs every env in a worker process of this host and the policy in one inference loop of
the trainer's process, with observations and actions in shared memory. Arguments that select
that path are accepted; those that select another (env threads, a policy server process, Ray,
TorchRL transport objects, CUDA graphs, chunked messages) are refused here, each with a
``ValueError``/``TypeError`` naming it, its value and what is accepted.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from rpc_collectors.core import checks, worker_warnings
from rpc_collectors.core.protocol import WorkerSpec


@dataclass(frozen=True)
class Batching:
    """How the inference loop batches: TorchRL's ``InferenceServerConfig`` fields that map."""

    max_batch_size: int = 64
    min_batch_size: int = 1
    timeout: float = 0.01


def _refuse(name: str, value: Any, accepted: str, why: str = "") -> ValueError:
    return ValueError(
        f"AsyncBatchedCollector: {name}={value!r} is not "
        f"supported{': ' + why if why else ''}; accepted: {accepted}"
    )


def one_policy(policy: Any, policy_factory: Any) -> None:
    """One of ``policy`` and ``policy_factory``, as TorchRL's class asks."""
    if policy is not None and policy_factory is not None:
        raise TypeError("AsyncBatchedCollector: policy and policy_factory are "
                        "mutually exclusive; give one")
    if policy is None and policy_factory is None:
        raise TypeError("AsyncBatchedCollector: one of policy or policy_factory must be given")


def env_factories(create_env_fn: Any, num_envs: Any) -> list:
    """One env factory per env: TorchRL's list, or one factory and ``num_envs``."""
    if isinstance(create_env_fn, (list, tuple)):
        if num_envs is not None and num_envs != len(create_env_fn):
            raise ValueError(
                f"AsyncBatchedCollector: num_envs={num_envs!r} does not match the "
                f"{len(create_env_fn)} env factories in create_env_fn; "
                "accepted: None, or the length of the list"
            )
        factories = list(create_env_fn)
    elif callable(create_env_fn) or isinstance(create_env_fn, str):
        if num_envs is None:
            raise TypeError(
                f"AsyncBatchedCollector: create_env_fn={create_env_fn!r} is one factory and "
                "num_envs is None; accepted: a list of env factories (one per "
                "env), or one factory with num_envs=N"
            )
        factories = [create_env_fn] * checks.positive_int("num_envs", num_envs)
    else:
        raise TypeError(
            f"AsyncBatchedCollector: create_env_fn={create_env_fn!r} is not accepted; accepted: a "
            "list of env factories (callables or gymnasium ids), or one factory with num_envs=N"
        )
    if not factories:
        raise ValueError("AsyncBatchedCollector: create_env_fn=[] has no env "
                         "factory; accepted: a non-empty list")
    for factory in factories:
        if not (callable(factory) or isinstance(factory, str)):
            raise TypeError(
                f"AsyncBatchedCollector: create_env_fn holds {factory!r}, which is not an env "
                "factory; accepted: callables returning an env, or gymnasium ids"
            )
    return factories


def env_kwargs(create_env_kwargs: Any, num_envs: int) -> list[dict]:
    """One dict of factory keywords per env (TorchRL's dict for all, or list of dicts)."""
    if not isinstance(checks.env_kwargs(create_env_kwargs, "env"), (list, tuple)):
        return [dict(create_env_kwargs or {}) for _ in range(num_envs)]
    if len(create_env_kwargs) == num_envs:
        return [dict(kw) for kw in create_env_kwargs]
    raise ValueError(
        f"AsyncBatchedCollector: create_env_kwargs={create_env_kwargs!r} is invalid; accepted: "
        f"None, a dict, or a list of {num_envs} dicts"
    )


def batching(server_config: Any, max_batch_size: Any, min_batch_size: Any, server_timeout: Any,
             num_envs: int) -> Batching:
    """The batching of the forward pass, from the keywords or TorchRL's ``InferenceServerConfig``;
    ``min_batch_size`` at most ``num_envs`` (no forward pass sees more ready envs)."""
    keywords = (("max_batch_size", max_batch_size), ("min_batch_size", min_batch_size),
                ("server_timeout", server_timeout))
    given = {k: v for k, v in keywords if v is not None}
    if server_config is not None:
        if given:
            raise ValueError(
                f"AsyncBatchedCollector: server_config is given with {sorted(given)}; accepted: "
                "one of them (server_config holds max_batch_size, min_batch_size and timeout)"
            )
        backend = getattr(server_config, "service_backend", "thread")
        if backend != "thread":
            raise _refuse("server_config.service_backend", backend, "'thread'",
                          "the policy runs in an inference loop of the trainer's process")
        if getattr(server_config, "static_batch_size", None) is not None:
            raise _refuse("server_config.static_batch_size", server_config.static_batch_size,
                          "None", "CUDA-graph capture is not offered")
        given = {"max_batch_size": server_config.max_batch_size,
                 "min_batch_size": server_config.min_batch_size,
                 "server_timeout": server_config.timeout}
    out = Batching()
    size = checks.positive_int("max_batch_size", given.get("max_batch_size", out.max_batch_size))
    low = checks.positive_int("min_batch_size", given.get("min_batch_size", out.min_batch_size))
    if low > size:
        raise ValueError(
            f"AsyncBatchedCollector: min_batch_size={low} exceeds "
            f"max_batch_size={size}; accepted: at most max_batch_size"
        )
    if low > num_envs:
        raise ValueError(
            f"AsyncBatchedCollector: min_batch_size={low} exceeds the {num_envs} envs, so every "
            "forward pass would wait server_timeout for envs that cannot be ready; "
            f"accepted: at most num_envs ({num_envs})"
        )
    wait = checks.timeout("server_timeout", given.get("server_timeout", out.timeout), zero=True)
    return Batching(size, low, wait)


def backends(transport: Any, backend: Any, env_backend: Any, policy_backend: Any, env_exchange: Any,
             transition_chunk_size: Any) -> None:
    """Refuse the backends and transports that are not this collector's path."""
    if transport not in (None, "auto", "driver"):
        raise _refuse("transport", transport, "None, 'auto' or 'driver'",
                      "observations and actions always move through the step plane's shared memory")
    if backend not in (None, "multiprocessing"):
        raise _refuse("backend", backend, "None or 'multiprocessing'",
                      "envs step in worker processes and the policy runs in the trainer's process")
    if env_backend not in (None, "multiprocessing"):
        raise _refuse("env_backend", env_backend, "None or 'multiprocessing'",
                      "envs step in worker processes")
    if policy_backend not in (None, "threading"):
        raise _refuse("policy_backend", policy_backend, "None or 'threading'",
                      "the policy runs in an inference loop (a thread) of the trainer's process")
    if env_exchange not in ("auto", "shm"):
        raise _refuse("env_exchange", env_exchange, "'auto' or 'shm'",
                      "the step plane is shared memory")
    if transition_chunk_size not in ("auto", 1):
        raise _refuse("transition_chunk_size", transition_chunk_size, "'auto' or 1",
                      "each transition enters its batch as soon as its env answers")


def unsupported(**kwargs: Any) -> None:
    """Refuse TorchRL arguments whose feature is not offered (each must keep its default)."""
    defaults = {"reset_at_each_iter": False, "yield_completed_trajectories": False,
                "weight_sync": None, "weight_sync_model_id": "policy", "worker_affinity": None,
                "driver_affinity": None}
    for name, value in kwargs.items():
        if value is not defaults[name] and value != defaults[name]:
            raise _refuse(name, value, repr(defaults[name]))


def replay_write_mode(mode: str) -> None:
    """TorchRL's ``replay_write_mode``: ``"rollout"`` only, as ``yield_completed_trajectories``."""
    if mode == "trajectory":
        raise _refuse("replay_write_mode", mode, "None or 'rollout'",
                      "its batches carry no trajectory ids to tell whole trajectories apart")


def policy_lag(max_policy_lag: Any, policy_lag_mode: Any, num_envs: int,
               frames_per_batch: int) -> int | None:
    """``max_policy_lag``: None (no bound) or an int >= 1 with ``num_envs <= max_policy_lag *
    frames_per_batch``, kept by admission (:mod:`~rpc_collectors.trainer.batched_admission`);
    ``policy_lag_mode`` ``"admit"`` only."""
    if policy_lag_mode != "admit":
        raise _refuse("policy_lag_mode", policy_lag_mode, "'admit'",
                      "a dropped batch would leave a gap in its envs' streams, which carry no "
                      "trajectory ids to show it")
    if max_policy_lag is None:
        return None
    if type(max_policy_lag) is not int:
        raise _refuse("max_policy_lag", max_policy_lag, "None (no bound) or an int >= 1")
    if max_policy_lag < 1:
        raise _refuse("max_policy_lag", max_policy_lag, "None (no bound) or an int >= 1",
                      "an env's transition joins a batch once its next step completes, so the "
                      "last ones of a batch wait for acts that a bound of 0 would not admit")
    if num_envs > max_policy_lag * frames_per_batch:
        raise _refuse("max_policy_lag", max_policy_lag,
                      f"None, or an int >= num_envs / frames_per_batch = {num_envs} / "
                      f"{frames_per_batch}",
                      f"each of the {num_envs} envs holds its latest transition until its next "
                      "step, and more than max_policy_lag * frames_per_batch held transitions "
                      "cannot all join batches within the bound")
    return max_policy_lag


def version_key(value: Any, taken: Any) -> Any:
    """TorchRL's ``policy_version_key``: None (no key), or a key (a str or a tuple of str) of its
    own, apart from every key in ``taken`` (the batch's other keys) and from their nested keys, and
    not private (a name part starting with ``"_"``: batches drop those)."""
    if value is None:
        return None
    parts = (value,) if isinstance(value, str) else value
    if not (isinstance(parts, tuple) and parts and all(isinstance(p, str) and p for p in parts)):
        raise TypeError(
            f"AsyncBatchedCollector: policy_version_key={value!r} is not a key; accepted: None, or "
            "a str or a tuple of str, apart from the batch's other keys (e.g. 'policy_version')"
        )
    if any(part.startswith("_") for part in parts):
        raise ValueError(
            f"AsyncBatchedCollector: policy_version_key={value!r} is private (a name part starts "
            "with '_'), so batches drop it; accepted: None, or a key of its own "
            "without such a part (e.g. 'policy_version')"
        )
    return free_key(value, taken)


def free_key(value: Any, taken: Any) -> Any:
    """``value``, a key where versions go, if it is none of ``taken`` and
    neither holds the other."""
    parts = (value,) if isinstance(value, str) else value
    for key in taken:
        key = (key,) if isinstance(key, str) else tuple(key)
        common = min(len(key), len(parts))
        # the same key, or one nested in the other
        if key[:common] == parts[:common]:
            shown = key[0] if len(key) == 1 else key
            raise ValueError(
                f"AsyncBatchedCollector: policy_version_key={value!r} is a key of the batch "
                f"already ({shown!r}, which the env, the policy or the collector writes); "
                "accepted: None, or a key of its own (e.g. 'policy_version')"
            )
    return value


def policy_device(device: Any, device_config: Any) -> torch.device | None:
    """Where the policy runs: ``device``, or ``device_config.policy_device``; the other devices of
    TorchRL's ``InferenceDeviceConfig`` must be the CPU (batches are assembled there)."""
    if device_config is None:
        return checks.device("device", device)
    if device is not None:
        raise ValueError(
            "AsyncBatchedCollector: device and device_config are both given; accepted: one of them"
        )
    for name in ("output_device", "env_device", "storing_device"):
        value = checks.device(f"device_config.{name}", getattr(device_config, name, None))
        if value is not None and value.type != "cpu":
            raise _refuse(f"device_config.{name}", str(value), "None or 'cpu'",
                          "batches are assembled in the trainer's memory")
    return checks.device("device_config.policy_device",
                         getattr(device_config, "policy_device", None))


def worker_specs(factories: list, kwargs: list[dict], metrics: bool) -> list[bytes]:
    """What each env's worker builds its one-frame collector from (each factory checked picklable
    first); ``metrics``: False turns the env workers' phase clocks off too."""
    for i, factory in enumerate(factories):
        checks.picklable(f"create_env_fn[{i}]", factory)
    options = {"frames_per_batch": 1, worker_warnings.KEY: worker_warnings.for_workers()}
    if not metrics:
        options["metrics"] = False
    return [WorkerSpec(factory, None, {**options, "create_env_kwargs": kw}).dumps()
            for factory, kw in zip(factories, kwargs)]
