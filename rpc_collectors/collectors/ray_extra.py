"""``RayCollector`` on first use: it needs the optional ``ray`` extra, which importing the
package does not."""
from __future__ import annotations


def ray_collector() -> type:
    """The ``RayCollector`` class; an ``ImportError`` that names the extra where Ray is missing."""
    try:
        from rpc_collectors.collectors.ray import RayCollector
    except ModuleNotFoundError as err:
        if err.name != "ray":
            raise
        raise ImportError('RayCollector needs Ray: pip install "rpc_collectors[ray]"') from err
    return RayCollector
