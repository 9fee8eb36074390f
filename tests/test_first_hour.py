"""A new user's first hour, on a fresh clone: the README's quick start and "Your own data" commands, as written
but at the smoke size, leave the checkout as git has it, and the tests that read the committed results still pass.

The commands are read from the README itself (its quick-start block, its own-data blocks), so a README edit that
would break a new user's first hour fails here. The servers (``tensorboard``, ``optuna-dashboard``) are opened in a
real browser by ``tests/test_first_hour_browser.py``; here their data is checked as files and storage.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: the tests that read the checkout's committed results and files: what a user's outputs could disturb
COMMITTED_READERS = ("tests/test_ledger.py", "tests/test_report_runs.py", "tests/test_product_text.py",
                     "tests/test_study_files.py")


def readme_blocks(readme: str, after: str) -> list[tuple[str, str]]:
    """The fenced blocks (language, text) of the README paragraph that starts with ``after``, up to the next bold
    paragraph or section."""
    start = readme.index(after)
    ends = [i for i in (readme.find("\n**", start + len(after)), readme.find("\n## ", start)) if i > 0]
    section = readme[start:min(ends) if ends else None]
    return re.findall(r"```(\w+)\n(.*?)```", section, flags=re.S)


def commands(block: str) -> list[str]:
    """A bash block's commands, comments dropped."""
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip() and not line.startswith("#")]


def at_smoke_size(command: str) -> str:
    """A quick-start command at the smoke size: the smoke budget, one epoch of a single run, a small image folder."""
    command = command.replace("--budget quick", "--budget smoke").replace("residual_variants-quick/",
                                                                          "residual_variants-smoke/")
    if "ablations.train" in command:
        command += " --max-epochs 1 --no-progress-bar"
    if "scripts/image_folder.py" in command:
        command += " --per-class 20"
    return command


def fresh_clone(tmp_path: Path) -> tuple[Path, dict]:
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True, capture_output=True)
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ABLATIONS_STORAGE", "WANDB"))}
    env |= {"HOME": str(home), "PYTHONPATH": str(clone), "PATH": f"{Path(sys.executable).parent}:{env['PATH']}"}
    return clone, env


def run(command: str, clone: Path, env: dict, timeout: float = 1800) -> subprocess.CompletedProcess:
    result = subprocess.run(command, shell=True, cwd=clone, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{command}\n{result.stderr[-3000:]}"
    return result


@pytest.mark.slow
def test_the_readme_s_first_hour_leaves_a_fresh_clone_clean_and_its_tests_passing(tmp_path):
    import optuna

    clone, env = fresh_clone(tmp_path)
    readme = (clone / "README.md").read_text()
    ((_, quick_start),) = readme_blocks(readme, "**A first look on a laptop**")
    ran = []
    for command in commands(quick_start):
        if command.split()[0] in ("tensorboard", "optuna-dashboard"):  # servers: the browser test opens them
            continue
        ran.append(run(at_smoke_size(command), clone, env))
    assert len(ran) == 4 and "30+30" in ran[0].stdout  # --list, the study, its report, one run

    (_, own_data), (_, study_file) = readme_blocks(readme, "**Your own data**")
    path = study_file.splitlines()[0].removeprefix("# ").replace("~", str(env["HOME"]))
    Path(path).write_text(study_file)
    outputs = [run(at_smoke_size(command), clone, env) for command in commands(own_data)]
    dry_run = outputs[2]
    assert "the data stays (dataset=imagefolder, data_dir=~/my_images)" in dry_run.stderr
    assert "data: imagefolder '~/my_images': 10 classes; grey images 32x32 (64 sampled) -> 1 channel(s)" in dry_run.stderr
    assert "dataset=imagefolder, data_dir=~/my_images" in dry_run.stdout and "dataset=digits" not in dry_run.stdout
    assert "completed trials of 'my_study-smoke' ended below the floor" in outputs[3].stderr  # one epoch: it says so

    # nothing the user ran touched the checkout: every output is in outputs/, which git ignores
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=clone, capture_output=True,
                            text=True, check=True).stdout
    assert status == ""
    out = clone / "outputs"
    for study in ("residual_variants-smoke", "my_study-smoke"):
        assert (out / study / "runs.csv").is_file() and list((out / "runs" / study / "agg").rglob("events.out.*"))
    assert (out / "residual_variants-smoke" / "report.html").is_file() and (out / "my_study-smoke" / "report.html").is_file()
    index = (out / "index.html").read_text()
    assert "residual_variants-smoke/report.html" in index and "my_study-smoke/report.html" in index
    storage = optuna.storages.RDBStorage(f"sqlite:///{out / 'optuna.db'}")
    names = set(optuna.get_all_study_names(storage))
    assert {"residual_variants-smoke", "residual_variants-smoke-tune", "my_study-smoke", "my_study-smoke-tune"} <= names
    assert not (clone / "results" / "residual_variants-smoke").exists() and not (clone / "run.json").exists()

    # the README's dashboard commands, opened in headless Chromium: data in every margin chart, no "Missing Tags",
    # the study's axes first in HParams; optuna-dashboard's study page says what its Best Trial is in a grid
    browser_checks(quick_start, clone, tmp_path)

    # the tests that read the committed results pass in the clone after all that
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *COMMITTED_READERS],
                           cwd=clone, env=env, capture_output=True, text=True, timeout=1800)
    assert tests.returncode == 0, tests.stdout[-3000:]
    assert subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=clone, capture_output=True,
                          text=True, check=True).stdout == ""


def browser_checks(quick_start: str, clone: Path, tmp_path: Path) -> None:
    """The quick start's ``tensorboard`` and ``optuna-dashboard`` commands (at the smoke size), as a person opens
    them; screenshots to ``$ABLATIONS_SCREENSHOTS`` when set (``docs/images``: the README's), else the test's
    folder."""
    import importlib.util

    from prerequisites import missing

    spec = importlib.util.spec_from_file_location("screenshots", REPO / "scripts" / "screenshots.py")
    shots = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shots)
    why = shots.missing_browser()
    if why:
        missing(why, shots.INSTALL)
    out = Path(os.environ.get("ABLATIONS_SCREENSHOTS") or tmp_path / "shots")
    lines = [at_smoke_size(c) for c in commands(quick_start)]
    logdir = shlex.split(next(c for c in lines if c.startswith("tensorboard ")))[2]
    seen = shots.tensorboard_check(clone / logdir, out)
    assert seen["drawn"] >= 5 and seen["missing"] == 0, seen
    listed = seen["hparams"]  # the study's columns before the metrics; none of the 60 configuration fields
    assert listed.index("test_acc") > max(listed.index(name) for name in ("variant", "depth", "lr")), listed
    assert "accelerator" not in listed and "embed_dim" not in listed, listed
    storage = shlex.split(next(c for c in lines if c.startswith("optuna-dashboard ")))[1]
    storage = storage.replace("sqlite:///", f"sqlite:///{clone}/", 1)
    page = shots.optuna_dashboard_check(storage, "residual_variants-smoke", out, expect="'Best Trial' is one seed")
    assert "0_how_to_read" in page and "Note tab and the HTML report" in page
    own = shots.optuna_dashboard_check(storage, "my_study-smoke", tmp_path / "own", expect="'Best Trial' is one seed")
    assert "my_study-smoke" in own
    assert shots.tensorboard_check(clone / "outputs" / "runs" / "my_study-smoke" / "agg", tmp_path / "own")["missing"] == 0


def test_the_readme_s_first_hour_commands_are_found_and_made_small(tmp_path):
    """The parsing the slow test relies on: the README's quick-start and own-data blocks exist, hold the commands a
    new user types, and shrink to the smoke size without a --set."""
    readme = (REPO / "README.md").read_text()
    ((language, quick_start),) = readme_blocks(readme, "**A first look on a laptop**")
    lines = commands(quick_start)
    assert language == "bash" and lines[1] == "python -m ablations.run --study residual_variants --budget quick"
    assert at_smoke_size(lines[1]).endswith("--budget smoke") and any(c.startswith("tensorboard ") for c in lines)
    assert any(c.startswith("optuna-dashboard sqlite:///outputs/optuna.db") for c in lines)
    (bash, own), (yaml_language, study) = readme_blocks(readme, "**Your own data**")
    assert (bash, yaml_language) == ("bash", "yaml") and study.startswith("# ~/my_study.yaml\n")
    assert not any("--set" in c for c in commands(own)) and "--budget smoke" in own
    assert shlex.split(at_smoke_size(commands(own)[0]))[-2:] == ["--per-class", "20"]
    tensorboard = next(c for c in lines if c.startswith("tensorboard "))
    assert shlex.split(at_smoke_size(tensorboard))[2] == "outputs/runs/residual_variants-smoke/agg"
