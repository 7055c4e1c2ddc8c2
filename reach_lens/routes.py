"""Layer routes: which layers run, in order (skips and repeats allowed), checked before anything runs them.

The generation engine runs any route (``Request(route=...)``, ``probes.route``); as hooks (``interventions.Route``)
only a skip-only route runs, each skipped layer silenced.
"""

import operator
from typing import Optional, Sequence

LayerRoute = tuple[int, ...]  # a route: layer indices, run in order; the full path is (0, ..., L-1)


def validate_route(path: Sequence[int], n_layers: int, max_len: Optional[int] = None) -> LayerRoute:
    """Check a route (layer indices, run in order) and return it as a tuple; max_len defaults to 2·n_layers."""
    max_len = 2 * n_layers if max_len is None else max_len
    try:
        path = tuple(operator.index(layer) for layer in path)
    except TypeError:
        raise ValueError(f"route {list(path)} has a layer that is not an integer") from None
    if not path:
        raise ValueError("route is empty; it needs at least one layer")
    for layer in path:
        if not 0 <= layer < n_layers:
            raise ValueError(f"route {list(path)} has layer {layer!r}, out of range for a "
                             f"{n_layers}-layer model (0..{n_layers - 1})")
    if len(path) > max_len:
        raise ValueError(f"route of length {len(path)} exceeds max_len {max_len}: {list(path)}")
    return path


def is_skip_only(path: Sequence[int]) -> bool:
    """True if the route only deletes layers (strictly increasing), so a skip mask can run it."""
    return all(a < b for a, b in zip(path, path[1:]))
