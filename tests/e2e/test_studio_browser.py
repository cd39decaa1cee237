"""``agentloop-studio`` driven by a real headless Chromium (Selenium over Debian's
``chromium-driver``; .ci/run installs both): the calculator's tools loaded and the calculator
called from its form; the calculator reward scoring an answer; two rows previewed on
tiny-qwen3 through the real servers and agent loops (a first preview cancelled while it
starts), their samples drawn turn by turn with rewards and advantages; a training run started
from the form, its first reward point drawn while it runs, stopped from the page and left
with its checkpoint. Each page's screenshot is written to ``$STUDIO_SCREENSHOTS`` when set
(``STUDIO_SCREENSHOTS=docs`` writes the ones docs/studio.md shows)."""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from recipes.calculator.data import make_rows
from tests.integration.trainer.studio_process import wait_until_up
from trainer.workers.fsdp import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.heavy(minutes=4)]

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
TOOLS = REPO / "recipes" / "calculator" / "tool_config.yaml"
REWARD = REPO / "recipes" / "calculator" / "reward.py"
SHOTS = os.environ.get("STUDIO_SCREENSHOTS")

try:
    from selenium import webdriver
    from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.expected_conditions import staleness_of
    from selenium.webdriver.support.wait import WebDriverWait
except ImportError:  # the dev extra installs it
    webdriver = None  # type: ignore[assignment]

needs_browser = pytest.mark.skipif(
    CHROMIUM is None or DRIVER is None or webdriver is None,
    reason="needs Debian's chromium and chromium-driver and selenium (.ci/run installs them)",
)


@pytest.fixture
def studio(tmp_path) -> Iterator[str]:
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trainer.cli.studio",
            "--port",
            str(port),
            "--runs-dir",
            str(tmp_path / "runs"),
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(process, url)
        yield url
    finally:
        process.send_signal(signal.SIGINT)  # its preview and run stop with it
        process.wait(60)


@pytest.fixture
def browser(tmp_path) -> Iterator[Any]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1200,900",
        f"--user-data-dir={tmp_path / 'chromium'}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=DRIVER), options=options)
    driver.implicitly_wait(0)
    try:
        yield driver
    finally:
        driver.quit()


def shot(driver: Any, name: str) -> None:
    """The whole page (beyond the window) as ``$STUDIO_SCREENSHOTS/studio-<name>.png``."""
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        png = driver.execute_cdp_cmd(
            "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}
        )
        (Path(SHOTS) / f"studio-{name}.png").write_bytes(base64.b64decode(png["data"]))


def type_into(driver: Any, element_id: str, text: str) -> None:
    field = driver.find_element(By.ID, element_id)
    field.clear()
    field.send_keys(text)


def submit(driver: Any, element_id: str, timeout_s: float = 120) -> None:
    """Click a form's button and wait for the page it posts to. A page that refreshes itself
    (a preview or a run in progress) can replace the button under the click: then the click
    did not happen, and it is tried again on the new page (for up to 10 s: on a loaded 2-core
    machine five tries in 1.5 s all met a page being replaced)."""
    for attempt in range(20):
        try:
            old = driver.find_element(By.TAG_NAME, "html")
            driver.find_element(By.ID, element_id).click()
            break
        except (StaleElementReferenceException, WebDriverException):
            if attempt == 19:
                raise
            time.sleep(0.5)
    WebDriverWait(driver, timeout_s).until(lambda _: replaced(old))


def replaced(element: Any) -> bool:
    """The page holding ``element`` is gone. Selenium's ``staleness_of`` knows one way of
    saying so; a page that refreshes itself as the posted one arrives can also make Chrome
    answer "Node with given id does not belong to the document" (a ``WebDriverException``),
    which ``staleness_of`` raises instead of reading as gone (CI, 2026-11-29)."""
    try:
        return bool(staleness_of(element)(None))
    except WebDriverException as exc:
        if "does not belong to the document" in str(exc):
            return True
        raise


def wait_for(driver: Any, found: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """``found()``'s first truthy value; the page may reload itself meanwhile (its refresh)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            value = found()
            if value:
                return value
        except (StaleElementReferenceException, WebDriverException):
            pass
        time.sleep(0.5)
    log = driver.find_elements(By.ID, "log")
    tail = log[0].text if log else driver.page_source[-3000:]
    raise AssertionError(f"{what} not seen in {timeout_s:.0f} s; page log:\n{tail}")


def text_of(driver: Any, element_id: str) -> str:
    """The element's text ("" if absent), read again if the page refreshed meanwhile."""
    for attempt in range(5):
        try:
            found = driver.find_elements(By.ID, element_id)
            return found[0].text if found else ""
        except (StaleElementReferenceException, WebDriverException):
            if attempt == 4:
                raise
            time.sleep(0.3)
    return ""


@needs_browser
def test_tools_reward_preview_and_a_run_from_the_browser(studio, browser, tmp_path):
    b = browser
    # ---- tools: load the calculator and call it from its form
    b.get(f"{studio}/tools")
    type_into(b, "tool-path", str(TOOLS))
    submit(b, "load-tools")
    type_into(b, "arg-calculator-expression", "17 * 23 + 4")
    submit(b, "call-calculator")
    assert text_of(b, "call-text") == "395"
    assert text_of(b, "call-status").startswith("ok in ")
    shot(b, "tools")

    # ---- reward: the calculator's reward file scores an answer against a row
    b.get(f"{studio}/reward")
    type_into(b, "reward-path", str(REWARD))
    submit(b, "load-reward")
    type_into(
        b,
        "reward-row",
        json.dumps({"data_source": "calculator", "reward_model": {"ground_truth": "395"}}),
    )
    type_into(b, "reward-answer", "The calculator says 395.\n#### 395")
    submit(b, "score")
    assert text_of(b, "reward-score") == "score: 1.0"
    shot(b, "reward")

    # ---- preview: the loaded tools and reward are the form's defaults; two typed rows
    b.get(f"{studio}/preview")
    form = {"tool": "field-actor_rollout_ref.rollout.multi_turn.tool_config_path"}
    assert b.find_element(By.ID, form["tool"]).get_attribute("value") == str(TOOLS)
    reward_field = b.find_element(By.ID, "field-custom_reward_function.path")
    assert reward_field.get_attribute("value") == str(REWARD)
    rows = "\n".join(json.dumps(r) for r in make_rows(2, seed=3, split="preview"))
    type_into(b, "preview-rows", rows)
    type_into(b, "field-actor_rollout_ref.rollout.response_length", "48")
    type_into(b, "field-actor_rollout_ref.rollout.multi_turn.max_assistant_turns", "2")
    submit(b, "preview")
    submit(b, "cancel")  # the first preview, cancelled while it starts
    wait_for(b, lambda: "cancelled" in text_of(b, "preview-state"), 90, "the cancel")
    assert b.find_element(By.ID, "preview-rows").get_attribute("value") == rows  # kept
    submit(b, "preview")
    assert "starting" in text_of(b, "preview-state") or "running" in text_of(b, "preview-state")
    wait_for(b, lambda: "done: 4 samples" in text_of(b, "preview-state"), 420, "the preview")
    rewards = [e.text for e in b.find_elements(By.CSS_SELECTOR, "td.reward")]
    assert len(rewards) == 4 and all(r in ("0", "1") for r in rewards)  # the 0/1 reward
    advantages = [e.text for e in b.find_elements(By.CSS_SELECTOR, "td.advantage")]
    assert len(advantages) == 4 and all(a.startswith(("+", "-")) for a in advantages)
    assert b.find_elements(By.CSS_SELECTOR, "#sample-0 .span.trained")
    command = text_of(b, "preview-command")
    assert command.startswith("agentloop-rollout actor_rollout_ref.model.path=tiny-qwen3 ")
    assert f"custom_reward_function.path={REWARD}" in command
    shot(b, "preview")

    # ---- train: a run from the form; its first reward point; stopped with a checkpoint
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in make_rows(16, seed=4, split="train")))
    run_dir = tmp_path / "run"
    b.get(f"{studio}/train")
    for key, value in {
        "data.train_files": str(data),
        "custom_reward_function.path": str(REWARD),
        "actor_rollout_ref.rollout.multi_turn.tool_config_path": str(TOOLS),
        "data.train_batch_size": "2",
        "actor_rollout_ref.rollout.n": "2",
        "actor_rollout_ref.actor.ppo_mini_batch_size": "2",
        "actor_rollout_ref.rollout.response_length": "48",
        "trainer.total_training_steps": "50",
        "trainer.save_freq": "100",
        "trainer.default_local_dir": str(run_dir),
    }.items():
        type_into(b, f"field-{key}", value)
    submit(b, "start")
    wait_for(b, lambda: b.find_elements(By.CSS_SELECTOR, "circle.reward-point"), 420, "step 1")
    shot(b, "train")
    assert text_of(b, "run-state") == "running"
    submit(b, "stop")
    ended = wait_for(
        b, lambda: "ended" in (state := text_of(b, "run-state")) and state, 300, "the stop"
    )
    assert ended == "ended (exit 0)"
    checkpoints = text_of(b, "checkpoints")
    assert checkpoints.startswith("global_step_")
    steps = len(b.find_elements(By.CSS_SELECTOR, "tr.step-row"))
    assert checkpoints.split(", ")[-1] == f"global_step_{steps}"  # the last step it trained
    assert (run_dir / f"global_step_{steps}" / "actor").is_dir()
    shot(b, "train-stopped")
