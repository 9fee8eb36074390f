"""A pytest plugin that registers a copy of ``standard`` under a new name before any test imports the registry.

    python -m pytest -p copy_of_standard ...      # with tests/ on PYTHONPATH

A new variant is its file ``lit_modules/residual/<name>.py`` and its line in ``lit_modules.names.RESIDUAL_CLASSES``.
This plugin makes both without touching the tree: the line is added to the registry's table, and the module
``lit_modules.residual.standard_copy`` (a subclass of ``Standard`` named ``standard_copy``) is served by an import
hook where the registry looks for the file. ``tests/test_new_variant.py`` runs the per-variant tests with it, so that
adding a variant never needs a test edited.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys

NAME, CLASS = "standard_copy", "StandardCopy"
MODULE = f"lit_modules.residual.{NAME}"
SOURCE = f'''
from .standard import Standard


class {CLASS}(Standard):
    """``standard`` under another name."""

    name = "{NAME}"
'''


class _CopyFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves ``MODULE`` from ``SOURCE``, as if it were a file of ``lit_modules/residual/``."""

    def find_spec(self, fullname, path, target=None):
        return importlib.util.spec_from_loader(fullname, self) if fullname == MODULE else None

    def create_module(self, spec):
        return None

    def exec_module(self, module) -> None:
        exec(compile(SOURCE, f"<{MODULE}>", "exec"), module.__dict__)


def register() -> None:
    """Add the copy to the registry's table; refused once the registry is built (it would not see the copy)."""
    if "lit_modules.residual" in sys.modules or "ablations.config" in sys.modules:
        raise RuntimeError("register the copy before lit_modules.residual and ablations.config are imported")
    from lit_modules import names

    names.RESIDUAL_CLASSES[NAME] = CLASS
    names.RESIDUAL_NAMES = tuple(names.RESIDUAL_CLASSES)
    sys.meta_path.insert(0, _CopyFinder())


register()
