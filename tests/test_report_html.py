"""The HTML report as a person sees it: ``python -m ablations.report --study NAME --runs runs.csv --html`` on a
committed study's runs.csv, opened in headless Chromium (Debian's chromium + chromium-driver, driven by
selenium): every variant has its row, every chart draws, the console stays clean, a column sorts by its numbers,
the page stays readable with JavaScript off, and the index links the report. Screenshots go to the test's folder
(``scripts/screenshots.py`` makes the committed ones with the same functions). Without a browser the tests skip;
under ``CI=true`` they fail (.ci/run installs it)."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from prerequisites import missing

from ablations import report
from ablations.studies.spec import load_spec

REPO = Path(__file__).resolve().parents[1]
STUDY = "modern_residuals"  # a committed study whose runs.csv carries the per-epoch curves and a tuning stage
SCRIPT = REPO / "scripts" / "screenshots.py"


def _screenshots():
    spec = importlib.util.spec_from_file_location("screenshots", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


shots = _screenshots()


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    root = tmp_path_factory.mktemp("html")
    results = root / "results"
    (results / "other_study").mkdir(parents=True)  # a study folder without a report: not in the index
    (results / "claims.md").write_text("# claims ledger\n")
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = report.main(["--study", STUDY, "--runs", str(REPO / "results" / STUDY / "runs.csv"), "--results-dir",
                            str(results), "--html", "--no-tensorboard"])
    assert code == 0, err.getvalue()
    return SimpleNamespace(root=root, results=results, html=results / STUDY / "report.html",
                           index=results / "index.html", spec=load_spec(STUDY), stdout=out.getvalue())


@pytest.fixture(scope="module")
def browser_ready():
    why = shots.missing_browser()
    if why:
        missing(why, shots.INSTALL)


def test_report_files_are_written_small_and_deterministic(page):
    text = page.html.read_text(encoding="utf-8")
    assert page.html.stat().st_size < 2 * 2**20  # the plotly bundle is shared: the page stays small
    assert (page.results / "plotly.min.js").stat().st_size > 2**20
    assert '<script src="../plotly.min.js"' in text
    assert str(page.html) in page.stdout and str(page.index) in page.stdout
    before = page.html.read_bytes()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert report.main(["--study", STUDY, "--runs", str(REPO / "results" / STUDY / "runs.csv"), "--results-dir",
                            str(page.results), "--html", "--no-tensorboard"]) == 0
    assert page.html.read_bytes() == before  # same runs.csv, same bytes


def test_report_page_in_chromium(page, browser_ready, tmp_path):
    labels = [v.label for v in page.spec.variants]
    with shots.browser() as driver:
        driver.get(page.html.as_uri())
        shots.wait_for(driver, "return document.readyState === 'complete'", "a loaded page")
        drawn = shots.wait_for(driver, "return document.querySelectorAll('.js-plotly-plot').length > 0 && "
                                       "Array.from(document.querySelectorAll('.js-plotly-plot')).every(function (d)"
                                       " { return d.querySelector('.scatterlayer .trace') !== null; }) && "
                                       "document.querySelectorAll('.js-plotly-plot').length", "every chart drawn")
        charts = driver.find_elements("css selector", "figure.chart")
        assert drawn == len(charts) == 5  # accuracy, paired Δ, the val curves and their Δ curves, tuning
        ids = {c.get_attribute("id") for c in charts}
        assert {"figure-accuracy", "figure-paired-delta", "figure-val-acc", "figure-delta-val-acc",
                "figure-tuning"} <= ids
        rows = driver.find_elements("css selector", "#table-main tbody tr")
        assert [r.find_element("css selector", "td").text for r in rows] == labels
        claims = driver.find_elements("css selector", "#claims-verdicts li")
        verdict = r"\*\*|held|resolved|equivalent|converged|absent|untestable"
        assert len(claims) == len(page.spec.claims) and all(re.search(verdict, c.text) for c in claims)
        images = driver.execute_script("return Array.from(document.querySelectorAll('#figures img')).map("
                                       "function (i) { return i.complete && i.naturalWidth; });")
        assert images and all(images)  # the report folder's PNGs, embedded
        # hover: plotly answers a hover on the accuracy chart's first point with its label
        hover = driver.execute_script(
            "var d = document.getElementById('chart-accuracy'); Plotly.Fx.hover(d, [{curveNumber: 1, pointNumber: 0}]);"
            "var t = d.querySelector('.hoverlayer'); return t ? t.textContent : '';")
        assert "mean" in hover and "95% CI" in hover
        # sorting: a click on the depth column's head orders the rows by the mean accuracy behind each cell
        head = driver.find_elements("css selector", "#table-main thead th")
        column = next(i for i, th in enumerate(head) if th.text.startswith("depth"))
        head[column].click()
        order = driver.execute_script(
            "return Array.from(document.querySelectorAll('#table-main tbody tr')).map(function (r) {"
            f" return parseFloat(r.children[{column}].getAttribute('data-sort')); }});")
        assert order == sorted(order) or order == sorted(order, reverse=True)
        assert len(order) == len(labels) and len(set(order)) > 1
        shots.shoot(driver, tmp_path / "report.png", height=1500)
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert not errors, errors


def test_report_page_without_javascript(page, browser_ready, tmp_path):
    labels = [v.label for v in page.spec.variants]
    with shots.browser(javascript=False) as driver:
        driver.get(page.html.as_uri())
        rows = driver.find_elements("css selector", "#table-main tbody tr")
        assert [r.find_element("css selector", "td").text for r in rows] == labels
        assert not driver.find_elements("css selector", ".js-plotly-plot")  # no chart drew itself
        twins = driver.find_elements("css selector", "figure.chart noscript img")
        assert len(twins) == 2 and all(i.size["width"] > 100 for i in twins)  # the band charts' PNG twins show
        assert driver.find_elements("css selector", "#figures img")
        shots.shoot(driver, tmp_path / "report-no-js.png", height=1200)


def test_index_links_every_report_and_the_ledger(page, browser_ready, tmp_path):
    with shots.browser() as driver:
        driver.get(page.index.as_uri())
        links = {a.text: a.get_attribute("href") for a in driver.find_elements("css selector", "a")}
        assert links[STUDY] == page.html.as_uri() and "other_study" not in links
        assert links["claims.md"] == (page.results / "claims.md").as_uri()
        driver.get(links[STUDY])
        assert driver.find_element("tag name", "h1").text == STUDY
        shots.shoot(driver, tmp_path / "index.png")
        assert not [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def test_a_page_outside_the_results_folder_carries_plotly_inline(tmp_path):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        code = report.main(["--study", STUDY, "--runs", str(REPO / "results" / STUDY / "runs.csv"), "--results-dir",
                            str(tmp_path / "results"), "--out", str(tmp_path / "elsewhere" / "x"), "--html",
                            "--no-tensorboard", "--no-figures"])
    assert code == 0
    text = (tmp_path / "elsewhere" / "x" / "report.html").read_text(encoding="utf-8")
    assert "plotly.min.js" not in re.findall(r"<script src=\"([^\"]+)\"", text) and len(text) > 4 * 2**20
    assert not (tmp_path / "elsewhere" / "plotly.min.js").exists()


def test_screenshots_script_says_what_it_needs():
    with contextlib.redirect_stderr(io.StringIO()) as err, pytest.raises(SystemExit) as exit_:
        shots.main([])
    assert exit_.value.code == 2 and "give --report and/or --tensorboard" in err.getvalue()


def test_a_page_written_beside_an_existing_shared_bundle_uses_it_with_its_results_elsewhere(tmp_path):
    """A study that ran in another checkout is reported with --results-dir there and --out into this checkout's
    results folder, which already holds the shared bundle: the page links it instead of inlining 5 MB."""
    (tmp_path / "here").mkdir()
    (tmp_path / "here" / "plotly.min.js").write_text("stale", encoding="utf-8")
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        code = report.main(["--study", STUDY, "--runs", str(REPO / "results" / STUDY / "runs.csv"), "--results-dir",
                            str(tmp_path / "there"), "--out", str(tmp_path / "here" / STUDY), "--html",
                            "--no-tensorboard", "--no-figures"])
    assert code == 0
    text = (tmp_path / "here" / STUDY / "report.html").read_text(encoding="utf-8")
    assert "../plotly.min.js" in re.findall(r"<script src=\"([^\"]+)\"", text) and len(text) < 2**20
    assert (tmp_path / "here" / "plotly.min.js").stat().st_size > 2**20  # the stale bundle is brought up to date
    assert not (tmp_path / "there" / "plotly.min.js").exists()


def test_a_table_the_report_cannot_rebuild_is_shown_from_its_files_and_said_to_be_kept(tmp_path):
    """A collapse table an earlier report made from the runs' event files stays on the page when the page is made
    again from a runs.csv without diagnostics: shown from its markdown, with a note that it is kept. A markdown
    file that is not a table (no .csv and .tex beside it) is not shown."""
    out = tmp_path / "results" / STUDY
    out.mkdir(parents=True)
    (out / "collapse.md").write_text("### kept: collapse\n\n| variant | similar blocks |\n|:--|--:|\n| standard | 3.25 |\n")
    for ext in ("csv", "tex"):
        (out / f"collapse.{ext}").write_text("x\n")
    (out / "notes.md").write_text("### not a table of the report\n")
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        code = report.main(["--study", STUDY, "--runs", str(REPO / "results" / STUDY / "runs.csv"), "--results-dir",
                            str(tmp_path / "results"), "--out", str(out), "--html", "--no-tensorboard",
                            "--no-figures"])
    assert code == 0
    text = (out / "report.html").read_text(encoding="utf-8")
    section = text[text.index('<section id="collapse">'):]
    section = section[:section.index("</section>")]
    assert ">3.25</td>" in section and "kept from an earlier report in this folder (collapse.md)" in section
    assert '<a href="#collapse">collapse</a>' in text and "not a table of the report" not in text
    assert text.count("kept from an earlier report") == 1  # the tables this report built are not marked kept


def test_every_committed_report_page_says_what_its_claims_file_says():
    """Each committed ``report.html`` carries its study's claim lines exactly as ``claims.md`` has them, and its
    one-line summary (the page's lede, its meta description, the index) counts the same verdicts: a page and its
    claims.md never disagree about a verdict."""
    from committed import committed

    from ablations.report.markup import md

    pages = committed("results/*/report.html")
    assert len(pages) >= 10
    for page in pages:
        text = page.read_text(encoding="utf-8")
        claims = (page.parent / "claims.md").read_text(encoding="utf-8")
        lines = [line for line in claims.splitlines() if line.startswith("- **")]
        assert lines, page
        for line in lines:
            assert md(line[2:], inline=True) in text, f"{page.parent.name}: {line[:80]}"
        counts = re.search(r"never written by hand \(([^)]*)\)", claims).group(1)
        summary = re.search(r'<meta name="description" content="[^"]*; claims: ([^"]*)\."', text).group(1)
        assert summary == counts, page.parent.name
