"""The web UI in a real browser: ``pt2reg serve`` (a real process) over a registry holding a
three-generation lineage and a multi-program bundle with dynamic dims and a custom op, driven
by headless Chromium (Debian's ``chromium`` + ``chromium-driver``, through Selenium; no browser
download). Screenshots of every page land in the test's tmp dir, and in ``$PT2REG_ARTIFACTS``
when set. Fails (never skips) without Chromium: ``scripts/test.sh`` installs it."""
from __future__ import annotations

import base64
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.services_server import make_token, registry_server
from tests.shared import built_once

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


def _build(out: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    subprocess.run([sys.executable, "-m", "tests.integration._web_registry", str(out / "home")], cwd=ROOT,
                   env=env, check=True, capture_output=True, timeout=300)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    built = built_once(tmp_path_factory, "web-registry", _build) / "home"
    home = tmp_path_factory.mktemp("web-home")
    shutil.copy(built / "registry.db", home / "registry.db")
    shutil.copytree(built / "store", home / "store")
    db, store = f"sqlite:///{home / 'registry.db'}", f"file://{home / 'store'}"
    with registry_server(db, store, log_dir=home / "logs") as srv:
        srv.tokens = {"admin": make_token(db, "ci-admin", ["admin"]),
                      "team": make_token(db, "team-reader", ["model:team/*:pull"])}
        yield srv


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        pytest.fail("Chromium missing: apt-get install -y chromium chromium-driver (scripts/test.sh does)",
                    pytrace=False)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1000", "--disable-extensions", "--no-first-run"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


class Shots:
    """Saves full-page screenshots under the test's tmp dir and ``$PT2REG_ARTIFACTS``."""

    def __init__(self, driver: Any, out: Path) -> None:
        self.driver, self.out = driver, out
        self.extra = Path(os.environ["PT2REG_ARTIFACTS"]) / "web-ui" if os.environ.get("PT2REG_ARTIFACTS") else None

    def __call__(self, name: str) -> Path:
        path = self.out / f"{name}.png"
        # the whole page, not only the window (a window is capped at the screen's height)
        size = self.driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
        clip = {"x": 0, "y": 0, "width": size["width"], "height": min(size["height"], 6000), "scale": 1}
        shot = self.driver.execute_cdp_cmd("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True,
                                                                      "clip": clip})
        path.write_bytes(base64.b64decode(shot["data"]))
        if self.extra is not None:
            self.extra.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, self.extra / path.name)
        return path


def _go(driver: Any, by: str, value: str) -> None:
    """Click the element ``(by, value)`` and wait until the page it leads to has replaced this
    one. Found afresh on each try: Chromium may still be settling the page it just loaded
    ("node does not belong to the document"), which a second try after a moment gets past."""
    from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, 15).until(lambda d: d.execute_script("return document.readyState") == "complete")
    for attempt in range(3):
        old = driver.find_element(By.TAG_NAME, "html")
        try:
            driver.find_element(by, value).click()
            break
        except (StaleElementReferenceException, WebDriverException) as exc:
            if attempt == 2 or not ("does not belong to the document" in str(exc)
                                    or isinstance(exc, StaleElementReferenceException)):
                raise
            time.sleep(0.2)
    WebDriverWait(driver, 15).until(lambda _: _detached(old))
    WebDriverWait(driver, 15).until(lambda d: d.execute_script("return document.readyState") == "complete")


def _detached(element: Any) -> bool:
    """Whether ``element``'s page has been replaced: selenium's ``staleness_of``, plus the form in
    which Chromium sometimes reports it ("node ... does not belong to the document")."""
    from selenium.common.exceptions import StaleElementReferenceException, WebDriverException

    try:
        element.is_enabled()
    except StaleElementReferenceException:
        return True
    except WebDriverException as exc:
        if "does not belong to the document" in str(exc):
            return True
        raise
    return False


def _login(driver: Any, base: str, token: str) -> None:
    from selenium.webdriver.common.by import By

    driver.delete_all_cookies()
    driver.get(base + "/")
    assert "/login" in driver.current_url  # not logged in: the form
    driver.find_element(By.ID, "token").send_keys(token)
    _go(driver, By.ID, "login")


def _text(driver: Any) -> str:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.TAG_NAME, "main").text


def test_browse_search_version_lineage_compare_audit(server: Any, browser: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    shot, d, base = Shots(browser, tmp_path), browser, server.url
    d.get(base + "/login")
    d.find_element(By.ID, "token").send_keys("pt2r_" + "x" * 43)
    _go(d, By.ID, "login")
    assert "unknown" in d.find_element(By.ID, "login-error").text.lower() or d.find_element(By.ID, "login-error").text
    shot("00-login-refused")

    _login(d, base, server.tokens["admin"])
    assert d.find_element(By.ID, "who").text == "ci-admin"
    cookie = d.get_cookie("pt2reg_session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    names = [r.find_element(By.TAG_NAME, "a").text for r in d.find_elements(By.CSS_SELECTOR, "tr.model-row")]
    assert names == ["other/x", "team/base", "team/distil", "team/enc", "team/ft"]
    assert "prod → 2" in _text(d)
    shot("01-models")

    box = d.find_element(By.ID, "q")
    box.clear()
    box.send_keys("enc task=translate")
    _go(d, By.ID, "search")
    assert [r.find_element(By.TAG_NAME, "a").text for r in d.find_elements(By.CSS_SELECTOR, "tr.model-row")] == ["team/enc"]
    shot("02-search")

    _go(d, By.LINK_TEXT, "team/enc")
    assert d.find_element(By.ID, "model-name").text == "team/enc"
    rows = d.find_elements(By.CSS_SELECTOR, "#versions tr")[1:]
    assert [r.find_elements(By.TAG_NAME, "td")[0].text for r in rows] == ["2", "1"]
    assert "prod" in rows[0].text and "prod" not in rows[1].text
    assert "1/1 passed" in rows[1].text  # the attestation of 1
    assert "alias.set" in d.find_element(By.ID, "alias-history").text
    shot("03-model")

    _go(d, By.ID, "compare")  # the form's default: 1 -> 2
    changes = d.find_element(By.ID, "signature-changes").text
    assert "tokens" in changes and "seq 2..16" in changes and "seq 2..32" in changes
    assert "1: seq 2..16 -> seq 2..32" in changes
    assert "shared" in d.find_element(By.ID, "chunks").text
    shot("04-compare")

    d.get(base + "/version?name=team/enc&number=1")
    tokens = d.find_element(By.CSS_SELECTOR, "#signature-encoder tr.input[data-name=tokens]").text
    assert "batch 1..8" in tokens and "seq 2..16" in tokens and "int64" in tokens
    assert "pt2reg_mylib::scale_add.default" in d.find_element(By.CSS_SELECTOR, "#program-post + p + table + p.ops").text
    text = _text(d)
    assert "seq + 1 3..17" in text  # the decoder's derived dim
    assert "pt2reg pull team/enc@sha256:" in d.find_element(By.ID, "cmd-1").get_attribute("value")
    assert "task" in d.find_element(By.ID, "metadata").text
    attestation = d.find_element(By.ID, "attestations").text
    assert "cpu-ci" in attestation and "passed" in attestation and "device=cpu" in attestation
    shot("05-version")

    d.get(base + "/version?name=team/distil&number=1")
    svg = d.find_element(By.ID, "lineage")
    assert {n.get_attribute("data-node") for n in svg.find_elements(By.CSS_SELECTOR, "a.node")} == {
        "team/distil@1", "team/ft@1", "team/base@1", "other/x@1"}
    shot("06-lineage-distil")
    _go(d, By.CSS_SELECTOR, '#lineage a.node[data-node="team/ft@1"] rect')
    assert d.find_element(By.ID, "version-title").text.startswith("team/ft@1")
    assert "run-7" not in _text(d)  # facts are the version's own: ft has none
    shot("06-version-with-lineage")  # docs/web-ui-version.png is this one
    _go(d, By.CSS_SELECTOR, '#lineage a.node[data-node="team/base@1"] rect')
    assert d.find_element(By.ID, "version-title").text.startswith("team/base@1")
    assert "s3://data/train" in _text(d) and "run-7" in _text(d)

    d.get(base + "/audit")
    assert "chain verified" in d.find_element(By.ID, "chain").text
    d.find_element(By.ID, "f-model").send_keys("team/enc")
    d.find_element(By.ID, "f-action").send_keys("alias")
    _go(d, By.ID, "filter")
    events = d.find_elements(By.CSS_SELECTOR, "#events tr.event")
    assert len(events) == 1 and "alias.set" in events[0].text and "team/enc" in events[0].text
    shot("07-audit")

    _go(d, By.ID, "logout")
    d.get(base + "/model?name=team/enc")
    assert "/login" in d.current_url


def test_a_team_token_never_sees_other_models(server: Any, browser: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    shot, d, base = Shots(browser, tmp_path), browser, server.url
    _login(d, base, server.tokens["team"])
    assert "other/x" not in d.page_source
    assert len(d.find_elements(By.CSS_SELECTOR, "tr.model-row")) == 4
    d.get(base + "/?q=x")
    assert "other/x" not in d.page_source and d.find_elements(By.ID, "no-models")
    d.get(base + "/?q=task=translate")
    assert "other/x" not in d.page_source
    for url in ("/model?name=other/x", "/version?name=other/x&number=1",
                "/compare?ref=team/enc@1&to_ref=other/x@1", "/model?name=other/nothing-here"):
        d.get(base + url)
        assert d.find_element(By.ID, "error-title").text.startswith("403"), url
        assert "other/" not in _text(d), url
    shot("10-forbidden")
    d.get(base + "/audit")  # audit:read is not in this token
    assert d.find_element(By.ID, "error-title").text.startswith("403")
    d.get(base + "/version?name=team/ft&number=1")
    svg = d.find_element(By.ID, "lineage")
    assert "other/x" not in d.page_source
    assert svg.find_elements(By.CSS_SELECTOR, 'g.restricted')  # other/x@1: a box, no name, no link
    assert {n.get_attribute("data-node") for n in svg.find_elements(By.CSS_SELECTOR, "a.node")} == {
        "team/ft@1", "team/base@1", "team/distil@1"}
    shot("11-lineage-restricted")
