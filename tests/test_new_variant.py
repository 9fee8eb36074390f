"""A new variant needs no test edited: every per-variant test is parametrized over the registry.

``copy_of_standard`` (a pytest plugin beside this file) registers ``standard`` under a new name, ``standard_copy``,
as a new variant is registered (its module and its line in ``lit_modules.names.RESIDUAL_CLASSES``), before any test
module reads the registry. The slow test runs every test of the fast tier that names the copy, and the tests of the
registry itself, with the plugin: each must pass, with no table edited.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NAME = "standard_copy"


def _pytest(*args: str) -> subprocess.CompletedProcess:
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "copy_of_standard", "-p", "no:cacheprovider",
                           *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=3000)


def test_the_plugin_registers_a_copy_that_builds_and_trains():
    """The copy is in the registry, the CLI's names and the study files' choices, and it is ``standard``'s model:
    the same parameters and the same outputs for the same seed."""
    code = f"""
import copy_of_standard, torch
from ablations.config import RESIDUAL_NAMES, RunConfig
from lit_modules import RESIDUALS, VisionTransformer
size = dict(img_size=8, patch_size=4, num_classes=3, embed_dim=8, depth=2, num_heads=2)
copy, ref = VisionTransformer("{NAME}", init_seed=0, **size), VisionTransformer("standard", init_seed=0, **size)
x = torch.randn(2, 3, 8, 8)
print(list(RESIDUALS)[-1], RESIDUAL_NAMES[-1], RunConfig(residual="{NAME}").residual,
      type(copy.blocks[0].ls1).__name__, torch.equal(copy(x), ref(x)))
"""
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == [NAME, NAME, NAME, "StandardCopy", "True"]


#: the test modules with a per-variant test parametrized over the registry (in the fast tier)
PER_VARIANT = {"test_attention", "test_autocast", "test_checkpoints", "test_diagnostics", "test_fast_paths",
               "test_frontier", "test_modern_sites", "test_pairing", "test_vit"}


@pytest.mark.slow  # every test module collected (~30 s), then each per-variant test of the copy
def test_a_copy_of_standard_under_a_new_name_passes_the_per_variant_tests_with_no_test_edited():
    result = _pytest("-v", "-rfE", "-m", "not slow", "tests", "-k",
                     f"{NAME} or registry_keys or name_tables_match_the_registries or cases_name_registered_variants")
    tail = result.stdout[-4000:] + result.stderr[-2000:]
    assert result.returncode == 0, tail
    ran = re.findall(rf"^tests/(\w+)\.py::\w+\[[^\]]*{NAME}[^\]]*\] PASSED", result.stdout, re.MULTILINE)
    assert PER_VARIANT <= set(ran), tail
    assert re.findall(r"::(\w+) PASSED", result.stdout) == [  # the registry's own tests, the copy included
        "test_name_tables_match_the_registries", "test_registry_keys", "test_retrofit_cases_name_registered_variants"]
