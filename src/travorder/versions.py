"""The versions a result depends on, recorded beside it (study outcomes, model manifests).

>>> import numpy
>>> {"python", "travorder", "numpy"} <= set(library_versions())
True
"""

from __future__ import annotations

import sys

import travorder

#: The libraries whose version is recorded when they are loaded: the simulator (numba),
#: the traversal orders (networkx), the features and the datasets (numpy, scipy, pandas).
VERSIONED = ("numpy", "numba", "networkx", "scipy", "pandas", "torch")


def library_versions() -> dict[str, str]:
    """Versions of Python, travorder and the libraries of `VERSIONED` loaded in this
    process."""
    versions = {"python": sys.version.split()[0], "travorder": travorder.__version__}
    versions.update({name: sys.modules[name].__version__ for name in VERSIONED
                     if name in sys.modules})
    return versions
