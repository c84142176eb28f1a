"""The console under test: served by uvicorn on a real socket, driven by real Chromium."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.support.ui import WebDriverWait

from onceflow.console.app import create_app
from onceflow.console.backend import Extras
from onceflow.console.server import console_server
from onceflow.console.settings import ConsoleSettings

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
# Flags that work on the project's machines (no GPU, no sandbox as root, nothing fetched).
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--window-size=1360,1000",
                  "--disable-dev-shm-usage")
START_TIMEOUT_S = 20.0
WAIT_S = 15.0
# Screenshots go to docs/images (shown in docs/console.md) when this is set; otherwise to
# a temporary directory, so a test run leaves the tree unchanged.
SCREENSHOTS_ENV = "ONCEFLOW_CONSOLE_SCREENSHOTS"
DOCS_IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"


class RunningConsole:
    """`create_app(settings)` served by uvicorn on a thread; `.url`, `.stop()`."""

    def __init__(self, settings: ConsoleSettings, extras: Extras | None = None) -> None:
        self.app = create_app(settings, extras=extras)
        self.server = console_server(self.app, settings.host, 0)
        self._thread = threading.Thread(target=self.server.run, name="console", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the console did not start")
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(10)


@contextlib.contextmanager
def running_console(bootstrap_servers: str, **settings) -> Iterator[RunningConsole]:
    console = RunningConsole(ConsoleSettings(bootstrap_servers, **settings))
    try:
        yield console
    finally:
        console.stop()


@contextlib.contextmanager
def chromium() -> Iterator[webdriver.Chrome]:
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        raise RuntimeError("Debian's chromium and chromium-driver are needed: make installs "
                           "them (scripts/setup.sh)")
    profile = tempfile.mkdtemp(prefix="onceflow-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def wait_for(driver: webdriver.Chrome, condition: Callable[[webdriver.Chrome], object],
             timeout_s: float = WAIT_S, message: str = "") -> object:
    return WebDriverWait(driver, timeout_s, poll_frequency=0.05).until(condition, message)


def text_of(driver: webdriver.Chrome, css: str) -> str:
    """The element's text now ("" when absent): read in one step in the page, because the
    live fragments replace elements between two WebDriver calls."""
    found = driver.execute_script(
        "const e = document.querySelector(arguments[0]); return e ? e.innerText : null;", css)
    return (found or "").strip()


def number_in(driver: webdriver.Chrome, css: str) -> int | None:
    text = text_of(driver, css).replace(",", "").strip()
    return int(text) if text.lstrip("-").isdigit() else None


def screenshot(driver: webdriver.Chrome, name: str, tmp_dir: Path) -> Path:
    directory = DOCS_IMAGES if os.environ.get(SCREENSHOTS_ENV) else tmp_dir
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"console-{name}.png"
    assert driver.save_screenshot(str(path)), f"no screenshot {path}"
    return path
