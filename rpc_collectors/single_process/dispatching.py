"""The metaclass that lets ``Collector(..., num_collectors=N, backend=...)`` build another
collector.

TorchRL 0.14.1's ``Collector`` doubles as a factory: given ``backend``, ``num_collectors``,
``sync`` or ``backend_options`` it builds the multi-worker collector they name. Those classes
live in a higher layer (:mod:`rpc_collectors.collectors`), so this layer names none of them: the
package registers the resolver (:func:`rpc_collectors.collectors.dispatch.resolve`) with
:func:`dispatch_with` when it is imported.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable

SELECTORS = ("backend", "backend_options", "num_collectors", "sync")

# resolve(args, kwargs, backend=, backend_options=, num_collectors=, sync=) ->
# (class or None, args, kwargs)
Resolver = Callable[..., tuple]


class DispatchingCollector(type):
    """Metaclass of the single-process ``Collector``: a call of that class itself is dispatched;
    its subclasses take only their own arguments."""

    resolver: Resolver | None = None

    @property
    def __signature__(cls) -> inspect.Signature:
        """The constructor's arguments, with the dispatch keywords (what
        ``inspect.signature`` shows)."""
        signature = inspect.signature(cls.__init__)
        selectors = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None)
                     for name in SELECTORS]
        return signature.replace(parameters=[*list(signature.parameters.values())[1:], *selectors])

    def __call__(cls, *args: Any, backend: Any = None, backend_options: Any = None,
                 num_collectors: Any = None, sync: Any = None, **kwargs: Any) -> Any:
        chosen = {"backend": backend, "backend_options": backend_options,
                  "num_collectors": num_collectors, "sync": sync}
        # a subclass of the dispatching class
        if isinstance(cls.__mro__[1], DispatchingCollector):
            given = {k: v for k, v in chosen.items() if v is not None}
            if given:
                raise TypeError(f"{given} are only accepted by Collector itself, not by its "
                                f"subclass {cls.__name__}; accepted: Collector(..., backend=..., "
                                "num_collectors=..., sync=..., backend_options=...)")
            return super().__call__(*args, **kwargs)
        if DispatchingCollector.resolver is None:
            raise RuntimeError("Collector's dispatch is not registered; import "
                               "rpc_collectors to register it")
        target, args, kwargs = DispatchingCollector.resolver(args, kwargs, **chosen)
        if target is None:
            return super().__call__(*args, **kwargs)
        return target(*args, **kwargs)


def dispatch_with(resolver: Resolver) -> None:
    """Register the function that turns ``Collector``'s dispatch keywords into a
    class and its arguments."""
    DispatchingCollector.resolver = resolver
