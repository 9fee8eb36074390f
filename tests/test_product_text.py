"""The product speaks of what it does, never of how it was made: no development history (work sessions, issue or
pull-request numbers, commit hashes, changelog prose such as "previously") in the prose of the documentation, code,
comments, tests, study files and generated reports, nor in the names of the result folders; nothing of the
arrangement it is developed with (a GPU lent for commands of a fixed length, the tool that lends it, the folder it
sends back): a user's GPU has no command limit; and no Python under ``results/``.

Technical uses of the words stay: pytest's ``scope="session"``, a process started in its own (POSIX) session.
A reference to another project's tracker is written as its address (``github.com/OWNER/REPO/issues/4``). This
file, which has to name what it looks for, is not read.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: what is checked: the documentation, the packages, the scripts, the tests, the examples, the study files, the
#: generated reports and the CI script
ROOTS = ("README.md", "docs", "ablations", "lit_modules", "data", "scripts", "tests", "examples", "results", ".ci",
         "pyproject.toml")
TEXT_SUFFIXES = (".md", ".py", ".yaml", ".yml", ".toml", ".sh", ".txt", ".cfg")
SKIP_DIRS = {".venv", "__pycache__", ".git", ".pytest_cache", ".ruff_cache", "runs"}

ISSUE = re.compile(r"issue ?#?[0-9]+", re.IGNORECASE)  # "issue 27", "Issue #22", "issue27-bench"
NUMBER_REF = re.compile(r"(?<![\w&/#:\"'])#[0-9]+\b")  # "#24", "PR #1849" (not a colour: color:#444, "#444444")
SESSION = re.compile(r"\bsession\b", re.IGNORECASE)
#: the technical uses of "session" (a line holding one of these may say it)
TECHNICAL_SESSION = (re.compile(r"""scope\s*=\s*["']session["']"""),  # pytest's fixture scope
                     re.compile(r"\b(own|new) session\b"),  # a POSIX session (start_new_session, setsid)
                     re.compile(r"\bHParams session\b"))  # TensorBoard's name for an HParams table row
SESSION_SUFFIX = re.compile(r"(^|[-_])s[0-9]+([-_]|$)")  # a folder named for a work session: "bench-s26-full"
HEX = re.compile(r"\b[0-9a-f]{7,40}\b")
#: changelog prose: what the product did before, or when a thing changed
CHANGELOG = re.compile(r"\bpreviously\b|\bformerly\b|\bha(?:s|ve) since\b|\bfound and fixed\b|\bno longer needs?\b"
                       r"|\bused to (?:count|be|block|take|fail|run|stop)\b", re.IGNORECASE)
#: the development arrangement: a GPU lent for commands of a fixed length by a tool, the folder its results come
#: back in
ARRANGEMENT = re.compile(r"\blent\b|\b\d+[- ]minutes? (?:commands?|calls?|limit)\b|\ballows \d+ minutes\b"
                         r"|\b(?:commands?|calls?) of (?:about |at most )?\d+ minutes\b|\bminutes a command\b"
                         r"|\bdevice tool\b|\$OUT\b|\bgpu_session\b|\bdevelopment machines?\b", re.IGNORECASE)
SELF = str(Path(__file__).resolve().relative_to(REPO))


def product_files() -> list[str]:
    """The repository's files under ``ROOTS`` (tracked or new, not ignored), as paths relative to the root."""
    try:
        listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "--", *ROOTS], cwd=REPO,
                                capture_output=True, text=True, check=True).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: every file under the roots
        listed = []
        for root in ROOTS:
            if (REPO / root).is_file():
                listed.append(root)
            for folder, dirs, names in os.walk(REPO / root):
                dirs[:] = [d for d in dirs if d not in SKIP_DIRS]
                listed += [str((Path(folder) / n).relative_to(REPO)) for n in names]
    return sorted(path for path in listed if (REPO / path).is_file())


def commit_hashes() -> list[str]:
    """Every commit of the repository's history (none outside a git checkout)."""
    try:
        return subprocess.run(["git", "rev-list", "--all"], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        return []


def history_in_line(line: str, commits: list[str]) -> list[str]:
    """What in ``line`` refers to how the project was made: work sessions, issue numbers, commit hashes, changelog
    prose, the development arrangement's words."""
    found = [m.group(0) for m in ISSUE.finditer(line)] + [m.group(0) for m in NUMBER_REF.finditer(line)]
    if SESSION.search(line) and not any(p.search(line) for p in TECHNICAL_SESSION):
        found.append("session")
    found += [token for token in HEX.findall(line) if any(c.startswith(token) for c in commits)]
    found += [m.group(0) for m in CHANGELOG.finditer(line)] + [m.group(0) for m in ARRANGEMENT.finditer(line)]
    return found


def history_in_path(path: str) -> list[str]:
    return [part for part in Path(path).parts
            if ISSUE.search(part) or SESSION.search(part.replace("_", " ")) or SESSION_SUFFIX.search(part)]


def test_the_checks_catch_history_and_let_technical_uses_pass():
    commits = commit_hashes() or ["0123456789abcdef0123456789abcdef01234567"]
    issue, hash_ = "iss" + "ue 27", commits[-1][:7]
    assert history_in_line(f"the designs of {issue}", commits) == [issue]
    assert history_in_line("after the " + "#" + "24 module moves", commits) == ["#24"]
    assert history_in_line("since " + "session" + " 26", commits) == ["session"]
    assert history_in_line(f"measured at commit {hash_}", commits) == [hash_]
    assert history_in_line('@pytest.fixture(scope="session")', commits) == []
    assert history_in_line("the CLI runs in its own session, so a test can kill it", commits) == []
    assert history_in_line("colour #1f77b4, github.com/owner/repo/issues/4, sha 0000000", commits) == []
    assert history_in_line('th{color:#444} colours.get(row, "#444444")', commits) == []
    assert history_in_line("with an HParams session of the cell's variant", commits) == []
    assert history_in_line("the killed attempt " + "used to" + " count", commits) == ["used to count"]
    assert history_in_line("Prev" + "iously the report read it", commits) == ["Previously"]
    assert history_in_line("one of its tests has" + " since moved", commits) == ["has since"]
    assert history_in_line("the rates were never used to choose; no longer doubly stochastic", commits) == []
    assert history_in_path("results/device/cpu/" + "issue" + "27-bench-s26-avx2") == ["issue27-bench-s26-avx2"]
    assert history_in_path("results/device/cpu/bench-" + "s26" + "-full") == ["bench-s26-full"]
    assert history_in_path("results/device/cpu-avx2/bench-overhead-2threads-5processes/bench.md") == []


def test_the_checks_catch_the_development_arrangement_and_let_ordinary_words_pass():
    commits = commit_hashes()
    for line, hit in (("No GPU was " + "lent while it was built", "lent"),
                      ("one command a " + "lent GPU machine runs", "lent"),
                      ("how many " + "9-minute commands it needs", "9-minute commands"),
                      ("9 minutes: the tool " + "allows 10 minutes", "allows 10 minutes"),
                      ("the budget is N " + "calls of 9 minutes", "calls of 9 minutes"),
                      ("one " + "command of about 9 minutes", "command of about 9 minutes"),
                      ("the " + "device tool allows it", "device tool"),
                      ("written under " + "$" + "OUT on the GPU", "$" + "OUT"),
                      ("scripts/" + "gpu_session.py writes one", "gpu_session"),
                      ("measured on the " + "development machine", "development machine")):
        assert history_in_line(line, commits) == [hit], line
    for line in ("a silent failure, an excellent fit", "a 10-minute run of the study", "$OUTPUT_DIR",
                 "--time-budget 90m stops the study", "the study's 60 s lock timeout"):
        assert history_in_line(line, commits) == [], line


def test_no_development_history_in_the_product():
    commits = commit_hashes()
    found = []
    for path in product_files():
        found += [f"{path}: folder or file name {part!r}" for part in history_in_path(path)]
        if path == SELF or not path.endswith(TEXT_SUFFIXES) and not path.startswith(".ci/"):
            continue
        try:
            text = (REPO / path).read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        for number, line in enumerate(text.splitlines(), 1):
            hits = history_in_line(line, commits)
            if hits:
                found.append(f"{path}:{number}: {', '.join(hits)}: {line.strip()[:120]}")
    assert not found, "development history in the product:\n" + "\n".join(found)


def test_no_python_under_results():
    scripts = [path for path in product_files() if path.startswith("results/") and path.endswith(".py")]
    assert not scripts, f"Python under results/ (a tool belongs in scripts/ with a --help): {scripts}"


@pytest.mark.parametrize("root", ROOTS)
def test_every_root_exists(root):
    """The roots checked are the project's: a root renamed away would silently drop out of the checks."""
    assert (REPO / root).exists(), root
