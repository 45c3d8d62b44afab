"""The env and policy an evaluation runs, wherever it runs: normalisation statistics frozen (an
evaluation reads them, it does not update them), recorders dumped after each evaluation, and the
policy built for the env (TorchRL's ``policy_factory(env)``).

:class:`WorkerSetup` builds both in a worker process (``backend="process"`` or ``"ray"``): the
worker's collector calls its :meth:`~WorkerSetup.policy` first, then its :meth:`~WorkerSetup.env`,
which hands over the env the policy was built for.
"""
from __future__ import annotations

import inspect
import uuid
from typing import Any, Callable

from torch import nn

from rpc_collectors.single_process.envs import make_env

# in a worker: the env built for a policy, until its collector takes it
_BUILT: dict[str, Any] = {}


def is_factory(env: Any) -> bool:
    """Whether ``env`` builds envs (a gymnasium id, a class or another callable), not being one."""
    instance = all(callable(getattr(env, method, None)) for method in ("reset", "step"))
    return isinstance(env, (str, type)) or (callable(env) and not instance)


def open_env(env: Any) -> Any:
    """The env ``env`` is or builds (:func:`~rpc_collectors.single_process.envs.make_env`), its
    statistics frozen."""
    return freeze_norms(make_env(env, argument="env"))


def transform_of(env: Any) -> Any:
    """The transform of a ``TransformedEnv``, None for another env: ``"transform"`` must be among
    the env's attribute names (``getattr`` would have a batched env ask its sub-envs)."""
    return env.transform if "transform" in dir(env) else None


def freeze_norms(env: Any) -> Any:
    """``env`` with every transform that keeps running statistics frozen (TorchRL's ``VecNorm`` and
    ``VecNormV2``, the transforms with a ``freeze()`` method), in its transform and in a ``Compose``
    at any depth; ``ObservationNorm`` keeps the statistics it was given and needs nothing."""
    pending = [transform_of(env)]
    while pending:
        transform = pending.pop()
        if callable(getattr(transform, "freeze", None)):
            transform.freeze()
        else:
            # a Compose holds its transforms in .transforms
            pending.extend(getattr(transform, "transforms", ()))
    return env


def dump_transforms(env: Any, step: int | None) -> None:
    """Call ``dump(step=step)`` on ``env``'s transform (a ``VideoRecorder`` writes the frames of the
    evaluation, a ``Compose`` dumps each of its transforms), as TorchRL's collectors do."""
    dump = getattr(transform_of(env), "dump", None)
    if callable(dump):
        dump(step=step)


def counts_steps(env: Any) -> bool:
    """Whether ``env`` counts its steps itself (``"step_count"`` in its ``output_spec``, a
    ``StepCounter``): then it is given no step limit of the collector's, as in TorchRL."""
    spec = getattr(env, "output_spec", None)
    keys = spec.keys(True, True) if spec is not None else ()
    return any("step_count" in ((key,) if isinstance(key, str) else key) for key in keys)


def needs_env(policy_factory: Callable) -> bool:
    """Whether ``policy_factory`` must be given the env (TorchRL's ``(env) -> policy``): a factory
    that can be called without arguments is called so, as TorchRL's process backend calls it."""
    try:
        inspect.signature(policy_factory).bind()
    except TypeError:
        return True
    except ValueError:
        # no signature to read (some builtins)
        return False
    return False


def build_policy(policy_factory: Callable, env: Any) -> Any:
    """The policy ``policy_factory`` builds, given ``env`` if it needs it."""
    return policy_factory(env) if needs_env(policy_factory) else policy_factory()


def evaluation_mode(policy: Any) -> Any:
    """``policy`` in eval mode when it is an ``nn.Module`` (dropout off, batch norms fixed)."""
    if isinstance(policy, nn.Module):
        policy.eval()
    return policy


class WorkerSetup:
    """The env and policy of an evaluation in a worker process, as the collector there builds them.

    ``init_fn`` runs first (once per process), then ``env`` (an env factory) builds the env, whose
    statistics are frozen, and ``policy_factory`` the policy for it, in eval mode. Picklable: it
    travels to the worker inside the collector's arguments.
    """

    def __init__(self, env: Callable, policy_factory: Callable, init_fn: Callable | None = None,
                 ) -> None:
        self.env_factory, self.policy_factory, self.init_fn = env, policy_factory, init_fn
        # names the env handed from policy() to env() in the worker
        self.token = uuid.uuid4().hex

    def _build_env(self, **kwargs: Any) -> Any:
        return freeze_norms(make_env(self.env_factory, kwargs, argument="env"))

    def policy(self) -> Any:
        """The collector's ``policy_factory``: builds the env and the policy for it."""
        if self.init_fn is not None:
            self.init_fn()
        env = None
        if needs_env(self.policy_factory):
            env = _BUILT[self.token] = self._build_env()
        policy = self.policy_factory(env) if env is not None else self.policy_factory()
        return evaluation_mode(policy)

    def env(self, **kwargs: Any) -> Any:
        """The collector's ``create_env_fn``: the env the policy was built for (without
        ``create_env_kwargs``), else a new one."""
        built = _BUILT.pop(self.token, None)
        if built is not None and not kwargs:
            return built
        if built is not None and callable(getattr(built, "close", None)):
            built.close()
        return self._build_env(**kwargs)
