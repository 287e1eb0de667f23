"""numba's compiler as the placement code uses it: cached where numba can write a cache.

numba caches compiled code beside the source or in the user's cache folder, and raises
at import where neither is writable (a read-only install and no writable home folder);
the code is then compiled anew in each process instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from numba import njit


def _cache_probe() -> None:
    """A function to cache, to see whether numba can write its cache (never called)."""


def _can_cache() -> bool:
    try:
        njit(cache=True)(_cache_probe)
    except RuntimeError:  # numba's "cannot cache function ...: no locator available"
        return False
    return True


#: Whether compiled code is cached on disk.
CACHE = _can_cache()


def jit(**options: Any) -> Callable[[Callable[..., Any]], Any]:
    """`numba.njit` with ``options``, cached where numba can write (`CACHE`)."""
    return njit(cache=CACHE, **options)
