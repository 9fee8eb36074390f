"""Screenshots of what a person sees: a study's HTML report and TensorBoard's Custom Scalars tab with the seed
aggregates, taken by headless Chromium (Debian's ``chromium`` and ``chromium-driver``, driven by selenium).

    python scripts/screenshots.py --report results/residual_variants/report.html --out docs/images
    python scripts/screenshots.py --tensorboard outputs/runs/residual_variants-quick/agg --out docs/images

``--report`` writes ``<out>/report.png`` (the top of the page: claims and the main table) and
``report-charts.png`` (the interactive charts); ``--tensorboard`` starts TensorBoard on a free loopback port
with that log folder, opens its Custom Scalars tab once the aggregate margin charts have drawn, writes
``<out>/tensorboard-custom-scalars.png`` and stops TensorBoard. TensorBoard selects no run at first when a log folder
holds more than 40 runs (a study's seeds): give the study's ``agg`` folder then, whose runs it all selects. The tests
(tests/test_report_html.py, tests/test_first_hour.py: :func:`tensorboard_check`, :func:`optuna_dashboard_check`) use
the same functions. A missing browser is one line and exit 2.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

# Imported where they are used, not here: Selenium. Each takes from a tenth of a second to seconds to import, and the
# command-line tools start without them.

CHROMIUM = ("/usr/bin/chromium", "/usr/bin/chromium-browser")
CHROMEDRIVER = ("/usr/bin/chromedriver",)
INSTALL = "apt-get install chromium chromium-driver (Debian/Ubuntu), and the dev extra: pip install -e '.[dev]'"
WAIT_S = 300  # stops a page that never draws; never a measure of speed
#: where the servers' own output goes (never beside the screenshots: docs/images holds only the images)
LOGS = Path(tempfile.gettempdir()) / "ablations-screenshots"


def browser_paths() -> tuple[str, str] | None:
    """(chromium, chromedriver) when both are installed, else None."""
    chromium = next((p for p in (*CHROMIUM, shutil.which("chromium") or "") if p and Path(p).is_file()), None)
    driver = next((p for p in (*CHROMEDRIVER, shutil.which("chromedriver") or "") if p and Path(p).is_file()), None)
    return (chromium, driver) if chromium and driver else None


def missing_browser() -> str | None:
    """Why the browser cannot start ('' → it can): Chromium, its driver or selenium missing."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed"
    return None if browser_paths() else "Chromium or chromedriver is not installed"


@contextlib.contextmanager
def browser(*, javascript: bool = True, width: int = 1400, height: int = 1000) -> Iterator:
    """A headless Chromium (selenium WebDriver) that records the console; ``javascript=False``: pages run none."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver_path = browser_paths()
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
                "--no-first-run", "--disable-background-networking", "--disable-component-update",
                "--disable-sync", f"--window-size={width},{height}", "--force-device-scale-factor=1"):
        options.add_argument(arg)
    if not javascript:
        options.add_experimental_option("prefs", {"profile.managed_default_content_settings.javascript": 2})
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    driver.set_page_load_timeout(WAIT_S)
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(driver, script, what: str, timeout_s: float = WAIT_S):
    """Poll ``script`` (JavaScript returning a value in the page, or a Python callable) until it is truthy; its
    value."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = script() if callable(script) else driver.execute_script(script)
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"the page never showed {what}")
        time.sleep(0.25)


def shoot(driver, path: Path, *, element=None, height: int | None = None) -> Path:
    """A PNG of the page (``height``: of its top that many pixels) or of one element."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if element is not None:
        element.screenshot(str(path))
        return path
    if height is not None:
        driver.set_window_size(driver.get_window_size()["width"], height)
        time.sleep(0.3)
    driver.save_screenshot(str(path))
    return path


def charts_drawn(driver) -> int:
    """The number of plotly charts that have drawn their SVG."""
    return driver.execute_script(
        "return document.querySelectorAll('.js-plotly-plot .main-svg').length > 0 && "
        "Array.from(document.querySelectorAll('.js-plotly-plot')).every(function (d) { "
        "return d.querySelector('.scatterlayer .trace') !== null; }) && "
        "document.querySelectorAll('.js-plotly-plot').length;")


def report_screenshots(report: Path, out: Path) -> list[Path]:
    """``report.png`` (the top of the page) and ``report-charts.png`` (the first charts) of an HTML report."""
    with browser(height=1500) as driver:
        driver.get(Path(report).resolve().as_uri())
        wait_for(driver, "return document.readyState === 'complete'", "a loaded page")
        wait_for(driver, lambda: charts_drawn(driver), "every chart drawn")
        top = shoot(driver, out / "report.png", height=1500)
        charts = driver.find_element("id", "charts")
        driver.execute_script("arguments[0].scrollIntoView();", charts)
        time.sleep(0.5)
        return [top, shoot(driver, out / "report-charts.png")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving(command: list[str], port: int, log: Path, ready_path: str, ready=lambda body: True,
            what: str = "the server") -> Iterator[str]:
    """A local web server started by ``command`` on ``port`` (output to ``log``); its base URL once ``ready_path``
    answers with a body ``ready`` accepts. Stopped (terminate, then kill) after."""
    import urllib.request

    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as fh:
        proc = subprocess.Popen(command, stdout=fh, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + WAIT_S
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{what} exited: {Path(log).read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{ready_path}", timeout=30) as answer:
                    if ready(answer.read()):
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} never served {ready_path}")
            time.sleep(0.5)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def tensorboard(logdir: Path, log: Path):
    """TensorBoard on a free loopback port with ``logdir``, once it serves the Custom Scalars layout; its base URL."""
    port = free_port()
    return serving([sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--host", "127.0.0.1",
                    "--port", str(port), "--reload_interval", "1"], port, log, "/data/plugin/custom_scalars/layout",
                   ready=lambda body: b"category" in body, what="TensorBoard")


def custom_scalars_screenshot(logdir: Path, out: Path) -> Path:
    """``tensorboard-custom-scalars.png``: the Custom Scalars tab once its margin charts (the aggregate runs: no
    other run has their tags) have drawn."""
    with tensorboard(logdir, LOGS / "tensorboard.log") as base, browser(width=1600, height=1400) as driver:
        driver.get(f"{base}/#custom_scalars")
        wait_for(driver, "return document.readyState === 'complete'", "a loaded page")
        # the cards live in shadow roots: count the margin-chart cards that hold a drawn plot (an SVG path)
        count = ("function walk(n, f) { f(n); (n.shadowRoot ? [n.shadowRoot] : []).concat(Array.from(n.children))"
                 ".forEach(function (c) { walk(c, f); }); }"
                 "var k = 0; walk(document.body, function (n) { if (n.tagName === 'TF-CUSTOM-SCALAR-MARGIN-CHART-CARD')"
                 "{ var s = 0; walk(n, function (m) { if (m.tagName === 'path') s++; }); if (s > 20) k++; } });"
                 "return k;")
        wait_for(driver, count, "a drawn margin chart")
        time.sleep(2)
        return shoot(driver, out / "tensorboard-custom-scalars.png")


#: JavaScript: call ``f`` on every element of the page, through open shadow roots (TensorBoard's cards live in them)
WALK = ("function walk(n, f) { f(n); (n.shadowRoot ? [n.shadowRoot] : []).concat(Array.from(n.children))"
        ".forEach(function (c) { walk(c, f); }); }")


def tensorboard_check(logdir: Path, out: Path) -> dict:
    """TensorBoard on ``logdir`` as a person opens it: the Custom Scalars tab once its margin charts hold data
    (``tensorboard-custom-scalars.png``), then the HParams tab (``tensorboard-hparams.png``). Returns the margin
    charts holding data (a series of a run), those showing TensorBoard's "Missing Tags" warning (a run that lacks
    part of a chart's tags), and the HParams tab's hyperparameter names in the order it lists them."""
    count = (WALK + "var k = 0, m = 0; walk(document.body, function (n) {"
             " if (n.tagName === 'TF-CUSTOM-SCALAR-MARGIN-CHART-CARD') {"
             " if (Object.keys(n._nameToDataSeries || {}).length) k++;"
             " if ((n._missingTags || []).length) m++; } }); return [k, m];")
    with tensorboard(logdir, LOGS / "tensorboard.log") as base, browser(width=1600, height=1400) as driver:
        driver.get(f"{base}/#custom_scalars")
        wait_for(driver, "return document.readyState === 'complete'", "a loaded page")
        wait_for(driver, f"var r = (function () {{ {count} }})(); return r[0] > 0 && r;", "a drawn margin chart")
        time.sleep(3)  # the other cards of the open categories
        drawn, missing = driver.execute_script(count)
        shoot(driver, out / "tensorboard-custom-scalars.png")
        driver.get(f"{base}/#hparams")
        names = (WALK + "var out = []; walk(document.body, function (n) { if (n.tagName === 'PAPER-CHECKBOX' &&"
                 " n.closest && n.textContent.trim()) out.push(n.textContent.trim()); }); return out;")
        listed = wait_for(driver, f"var r = (function () {{ {names} }})(); return r.length > 2 && r;",
                          "the HParams tab's hyperparameters")
        time.sleep(2)
        shoot(driver, out / "tensorboard-hparams.png")
        return {"drawn": drawn, "missing": missing, "hparams": list(driver.execute_script(names)) or listed}


def optuna_dashboard(storage: str, log: Path):
    """optuna-dashboard on ``storage`` on a free loopback port, once it answers; its base URL."""
    port = free_port()
    command = Path(sys.executable).with_name("optuna-dashboard")
    return serving([str(command), storage, "--host", "127.0.0.1", "--port", str(port)], port, log, "/api/studies",
                   what="optuna-dashboard")


def optuna_dashboard_check(storage: str, study: str, out: Path, *, expect: str) -> str:
    """optuna-dashboard on ``storage``, opened on ``study``'s page once it shows ``expect`` (a grid study's
    ``0_how_to_read`` attribute), ``optuna-dashboard.png`` of its Best Trial panel and attributes; the page's text."""
    import json
    import urllib.request

    with optuna_dashboard(storage, LOGS / "optuna-dashboard.log") as base, browser(width=1500, height=1300) as driver:
        with urllib.request.urlopen(f"{base}/api/studies", timeout=60) as answer:
            studies = json.loads(answer.read())["study_summaries"]
        study_id = next(s["study_id"] for s in studies if s["study_name"] == study)
        driver.get(f"{base}/dashboard/studies/{study_id}")
        wait_for(driver, f"return document.body.innerText.indexOf({json.dumps(expect)}) >= 0", "the study's note")
        time.sleep(1)
        driver.execute_script(  # the Best Trial panel and, below it, the study's attributes with the line
            "var h = Array.from(document.querySelectorAll('h6, h5, h4, h3, p, span')).find(function (e) {"
            " return e.textContent.indexOf('Best Trial') === 0; }); if (h) h.scrollIntoView();")
        time.sleep(1)
        shoot(driver, out / "optuna-dashboard.png")
        return driver.execute_script("return document.body.innerText;")


def main(argv: list[str] | None = None) -> int:
    doc = (__doc__ or "").split("\n\n")
    p = argparse.ArgumentParser(prog="python scripts/screenshots.py", description=doc[0],
                                epilog="\n\n".join(doc[1:]), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--report", type=Path, help="an HTML report (results/<study>/report.html)")
    p.add_argument("--tensorboard", type=Path, metavar="LOGDIR", help="a study's TensorBoard folder with its agg runs")
    p.add_argument("--out", type=Path, default=Path("docs/images"), help="folder for the PNGs (default: docs/images)")
    args = p.parse_args(argv)
    if not (args.report or args.tensorboard):
        p.error("give --report and/or --tensorboard")
    why = missing_browser()
    if why:
        print(f"error: {why}; install: {INSTALL}", file=sys.stderr)
        return 2
    for path, what in ((args.report, "report"), (args.tensorboard, "TensorBoard folder")):
        if path is not None and not path.exists():
            print(f"error: {what} '{path}' does not exist", file=sys.stderr)
            return 2
    written = []
    if args.report:
        written += report_screenshots(args.report, args.out)
    if args.tensorboard:
        written.append(custom_scalars_screenshot(args.tensorboard, args.out))
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
