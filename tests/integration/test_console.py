"""The console (gateway/api/console/) in a real browser: Debian's chromium, headless, driven by Selenium. The page
loads behind the admin credential, shows the three members and the worker, and follows a node's death without a
reload (issue 62)."""

from __future__ import annotations

import base64
import shutil
import signal
import time

import httpx2
import pytest

from chaos.processes import NodeProcess
from mesh.crypto import generate_key

from tests.support.node_pairs import alive_members

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")

BASE = 23700  # this file's mesh ports: below the kernel's outgoing range, used by no other test
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")

pytestmark = pytest.mark.skipif(CHROMIUM is None or CHROMEDRIVER is None,
                                reason="Debian's chromium and chromium-driver are not installed (.ci/run installs them)")


def wait_for(predicate, bound_s: float, what: str):
    deadline = time.monotonic() + bound_s
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"not within {bound_s}s: {what}"
        time.sleep(0.2)


def node_args(i: int, *extra: str) -> list[str]:
    return ["--mesh-bind", f"127.0.0.1:{BASE + i}", "--join", f"127.0.0.1:{BASE}", "--node-name", f"console{i}",
            "--mesh-preset", "local", "--rpc-addr", f"127.0.0.1:{BASE + 100 + i}", "--retry-join-interval-secs",
            "0.5", "--health-check-interval-secs", "0.5", *extra]


def rows(driver, table: str) -> list[list[str]]:
    script = ("return Array.from(document.querySelectorAll('#' + arguments[0] + ' tbody tr'))"
              ".map(tr => Array.from(tr.cells).map(td => td.textContent));")
    return driver.execute_script(script, table)


def members_by_state(driver) -> dict[str, str]:
    return {cells[0]: cells[2] for cells in rows(driver, "members") if len(cells) >= 3}


@pytest.fixture
def browser():
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service
    options = Options()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def test_the_console_shows_the_cluster_and_follows_a_death_without_a_reload(engines, log_dir, browser):
    env = {"SMG_NODE_ENCRYPT": generate_key()}
    nodes = [NodeProcess(node_args(0, "--worker-urls", engines[0].url), log_dir, "console0", env=env)]
    try:
        nodes += [NodeProcess(node_args(i), log_dir, f"console{i}", env=env) for i in (1, 2)]
        wait_for(lambda: all(alive_members(n) == 3 for n in nodes), 60, "three members alive")
        node = nodes[0]

        # Behind the admin credential: nothing without it, and a browser is asked for it (Basic).
        refused = httpx2.get(node.url + "/console", timeout=10)
        assert refused.status_code == 401 and refused.headers["www-authenticate"].startswith("Basic")
        assert httpx2.get(node.url + "/console/state", timeout=10, auth=("admin", "wrong")).status_code == 401

        # The browser presents the admin token as Basic's password, as after its dialog.
        basic = base64.b64encode(f"admin:{node.admin_token}".encode()).decode()
        browser.execute_cdp_cmd("Network.enable", {})
        browser.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {"Authorization": f"Basic {basic}"}})
        browser.get(node.url + "/console")
        assert browser.title == "smg-node console"
        states = wait_for(lambda: (s := members_by_state(browser)) and len(s) == 3 and s, 20, "three members shown")
        assert set(states) == {"console0", "console1", "console2"} and set(states.values()) == {"alive"}
        workers = wait_for(lambda: [r for r in rows(browser, "workers") if engines[0].url in r], 20, "the worker")
        assert workers[0][3] == "yes"  # healthy
        assert "live: updated" in browser.find_element("id", "status").text

        browser.execute_script("window.consoleMarker = 'same page';")  # gone if the page were loaded again
        nodes[2].signal_machine(signal.SIGKILL)
        nodes[2].process.wait(10)
        wait_for(lambda: members_by_state(browser).get("console2") in ("dead", "failed"), 30,
                 "the console shows console2's death")
        assert browser.execute_script("return window.consoleMarker;") == "same page", "the page was reloaded"
        assert members_by_state(browser)["console1"] == "alive"
    finally:
        for n in nodes:
            n.kill()
