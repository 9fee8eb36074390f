"""Every import of the project's packages (in the packages, the scripts and the tests) resolves, including the
imports inside function bodies, which only run when their function does: a module moved or renamed leaves no stale
``from ablations.X import Y`` behind for a rarely-run path (a CLI's error branch, a benchmark section) to trip
over."""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROJECT = ("ablations", "lit_modules", "data")
FILES = sorted(p for top in (*PROJECT, "scripts", "tests") for p in (ROOT / top).rglob("*.py"))


def module_name(path: Path) -> str | None:
    """The dotted name of a file inside the project's packages (None for a script)."""
    rel = path.relative_to(ROOT).with_suffix("")
    if rel.parts[0] not in PROJECT:
        return None
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def imports(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, absolute module, imported names) of every project import in the file, at any depth."""
    this = module_name(path)
    package = (this if path.name == "__init__.py" else this.rpartition(".")[0]) if this else None
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                assert package, f"{path}:{node.lineno}: a relative import outside a package"
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                module = ".".join([*base, module] if module else base)
            found.append((node.lineno, module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name, []) for a in node.names]
    return [f for f in found if f[1].split(".")[0] in PROJECT]


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(ROOT)) for p in FILES])
def test_every_project_import_resolves(path):
    for line, module, names in imports(path):
        assert importlib.util.find_spec(module) is not None, f"{path.relative_to(ROOT)}:{line}: no module {module}"
        if names and names != ["*"]:
            loaded = importlib.import_module(module)
            for name in names:
                ok = hasattr(loaded, name) or importlib.util.find_spec(f"{module}.{name}") is not None
                assert ok, f"{path.relative_to(ROOT)}:{line}: {module} has no {name}"


def test_the_check_sees_imports_inside_functions(tmp_path):
    """The walk reaches a function body's import and resolves relative levels (a check that can fail)."""
    probe = ROOT / "ablations" / "run" / "cli.py"
    found = {(module, tuple(names)) for _, module, names in imports(probe)}
    assert ("data.fetch", ("ensure_all",)) in found  # in _download
    assert any(module == "ablations.run.study" for module, _ in found)  # from .study import ...


def test_the_packages_export_every_registered_class_from_their_registries():
    """``lit_modules.residual`` and ``data`` export each class their registries list, under its own name, and list it
    in ``__all__`` (no hand-kept list to fall behind a new variant or dataset)."""
    import data
    import lit_modules.residual as residual
    from data.names import DATASET_CLASSES
    from data.registry import DATASETS
    from lit_modules.names import RESIDUAL_CLASSES

    assert len(RESIDUAL_CLASSES) == len(residual.RESIDUALS) >= 23
    for name, cls in RESIDUAL_CLASSES.items():
        assert getattr(residual, cls) is residual.RESIDUALS[name] and cls in residual.__all__, name
    namespace: dict = {}
    exec("from lit_modules.residual import *", namespace)
    assert {cls for cls in RESIDUAL_CLASSES.values()} <= set(namespace)
    for name, path in DATASET_CLASSES.items():
        cls = path.split(":")[1]
        assert getattr(data, cls) is DATASETS[name] and cls in data.__all__, name
    assert all(hasattr(data, export) for export in data.__all__)
