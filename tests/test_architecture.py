"""The house's layering holds: ``lint-imports`` (import-linter, contracts in ``pyproject.toml``) keeps every import
pointing down (data <- lit_modules <- ablations, and the tools inside ``ablations`` above what they use) and no
package holds a circle of imports; a copy of the tree with one import added upward, or one that closes a circle,
breaks the contract it should. Besides: no module imports another module's underscore-private names,
``ablations/`` keeps at most ten top-level modules, and ``docs/architecture.md`` shows the contracts' layers and
every package."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: import-linter's own TOML reader
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("ablations", "lit_modules", "data")


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` on the packages under ``root`` with the contracts of ``root/pyproject.toml``."""
    command = Path(sys.executable).with_name("lint-imports")
    if not command.is_file():
        command = shutil.which("lint-imports")
        if command is None:
            pytest.fail("lint-imports is not installed: pip install -e '.[dev]' (import-linter)")
    env = os.environ | {"PYTHONPATH": str(root)}
    return subprocess.run([str(command), "--no-cache", "--no-logo"], cwd=root, env=env, capture_output=True, text=True,
                          timeout=600)


def test_the_import_contracts_hold():
    result = lint_imports(REPO)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "Contracts: 3 kept, 0 broken." in result.stdout


@pytest.mark.parametrize(("path", "line", "broken"), [
    ("data/upward.py", "from ablations.cli import fail\n",
     "data <- lit_modules <- ablations: the data never imports the model, neither imports the tools BROKEN"),
    ("ablations/config/run_config.py", "from ablations.run import cli as _cli\n",
     "ablations: each tool above what it uses (| = independent of each other) BROKEN"),
    ("ablations/bench/child.py", "from . import tasks\n", "no circle of imports among the modules of any package BROKEN"),
], ids=["data imports ablations", "config imports run", "child and tasks in a circle"])
def test_an_upward_import_or_a_circle_breaks_its_contract(tmp_path, path, line, broken):
    for package in PACKAGES:
        shutil.copytree(REPO / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    planted = tmp_path / path
    planted.write_text((planted.read_text() if planted.exists() else "") + line)
    result = lint_imports(tmp_path)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-2000:]
    assert " ".join(broken.split()) in " ".join(result.stdout.split())  # (an upward import inside ablations also
    # closes a circle: the acyclic contract breaks with it)


def private_imports() -> list[str]:
    """``from X import _name`` of another module's private name, in the packages and scripts (tests may look inside)."""
    found = []
    for root in (*PACKAGES, "scripts"):
        for path in sorted((REPO / root).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            package = parts[:-1] if parts[-1] != "__init__" else parts[:-1]
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.ImportFrom) or node.module == "__future__":
                    continue
                base = package[: len(package) - node.level + 1] if node.level else []
                module = ".".join(base + ([node.module] if node.module else []))
                if module.split(".")[0] not in PACKAGES:
                    continue
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        found.append(f"{path.relative_to(REPO)}:{node.lineno}: from {module} import {alias.name}")
    return found


def test_no_module_imports_another_module_s_private_names():
    assert not private_imports(), "\n".join(private_imports())


def test_ablations_keeps_at_most_ten_top_level_modules():
    modules = sorted(p.name for p in (REPO / "ablations").glob("*.py"))
    assert len(modules) <= 10, modules


def contract_layers(contract_id: str) -> list[str]:
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    return next(c["layers"] for c in contracts if c["id"] == contract_id)


def test_the_architecture_page_shows_the_contracts_layers_and_every_package():
    """docs/architecture.md's picture of the layers is pyproject's (kept true by the contracts it copies), and its
    table names every package of ``ablations`` and the three top-level ones."""
    page = (REPO / "docs" / "architecture.md").read_text()
    section = page.split("## The layers inside `ablations`", 1)[1]
    block = section.split("```", 2)[1].strip().splitlines()
    assert block == [" | ".join(part.strip() for part in layer.split("|")) for layer in contract_layers("ablations")]
    assert contract_layers("packages") == ["ablations", "lit_modules", "data"]
    packages = [p.name for p in sorted((REPO / "ablations").iterdir()) if (p / "__init__.py").is_file()]
    named = [f"`ablations/{name}/`" for name in packages] + ["`data/`", "`lit_modules/`", "`scripts/`"]
    assert [n for n in named if f"| {n} |" not in page] == []
