"""Names a package exports but imports only when first used (PEP 562), so that importing
the package, or a light module of it, does not import its heavy parts."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, where: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: ``name`` comes from the module
    ``where[name]`` (absolute, or relative to the package) the first time it is asked for."""

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module if "." in module else f"{package}.{module}"), name)

    return __getattr__
