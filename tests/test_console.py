"""The steering console (/ui) in a real browser: Debian's Chromium, headless,
driven by Selenium through chromedriver, against an engine and bridge of the
module's own with API keys configured (the page must take the admin key from
the operator). Each step checks what the page shows against the API, and
saves a screenshot to a folder printed at the start.

`make test` installs Chromium and chromedriver (the Makefile's browser
target); without them these tests fail rather than skip."""

from __future__ import annotations

import json
import os
import pathlib
import urllib.parse

import openai
import pytest
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

from tests import harness, headless_chromium
from tests.conftest import MODEL
from tests.http_helpers import Reply

L0 = "sae_millm-tiny-res-l0"
ADMIN, INFERENCE = "console-admin-key", "console-inference-key"
KEYS = json.dumps({"keys": [{"name": "ops", "scopes": ["admin"], "key": ADMIN},
                            {"name": "app", "scopes": ["inference"], "key": INFERENCE}]})


class ConsoleStack(harness.OwnStack):
    def __init__(self, tmp: pathlib.Path):
        # Vectors the workbench builds go to a folder of this stack's own.
        super().__init__(tmp, {"MILLM_API_KEYS": KEYS}, MILLM_API_KEYS=KEYS,
                         MILLM_CONTROL_VECTORS_DIR=str(tmp / "control_vectors"))

    def api(self, method: str, path: str, body=None) -> Reply:
        import http.client

        conn = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=60)
        conn.request(method, path, body=json.dumps(body).encode() if body is not None else None,
                     headers={"Content-Type": "application/json",
                              "Authorization": f"Bearer {ADMIN}"})
        reply = conn.getresponse()
        out = Reply(reply.status, reply.read().decode(), dict(reply.getheaders()))
        conn.close()
        return out

    def sdk(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.base_url}/v1", api_key=INFERENCE, max_retries=0,
                             timeout=60)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    own = ConsoleStack(tmp_path_factory.mktemp("console"))
    try:
        yield own
    finally:
        own.stop()


@pytest.fixture(scope="module")
def shots(tmp_path_factory, request):
    """Where the screenshots go: MILLM_SCREENSHOTS_DIR, or a fresh temporary
    folder; printed past pytest's capture. docs/img/console-*.png are copies
    of 04-playground.png, 05-monitoring.png and 11-workbench-compare.png."""
    configured = os.environ.get("MILLM_SCREENSHOTS_DIR")
    folder = pathlib.Path(configured) if configured else tmp_path_factory.mktemp("screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        print(f"\nconsole screenshots: {folder}")
    return folder


@pytest.fixture(scope="module")
def browser(stack, shots):
    driver = headless_chromium.start(1280, 1000, page_load_timeout=30)
    try:
        yield driver
    finally:
        driver.quit()


def wait(driver, predicate, timeout: float = 30):
    # The page re-renders its tables as answers come: an element found a moment
    # ago may be gone, so a stale reference means "look again", not a failure.
    return WebDriverWait(driver, timeout, poll_frequency=0.2,
                         ignored_exceptions=(NoSuchElementException,
                                             StaleElementReferenceException)
                         ).until(lambda d: predicate())


def text(driver, selector: str) -> str:
    return driver.find_element(By.CSS_SELECTOR, selector).text


def fill(driver, selector: str, value) -> None:
    field = driver.find_element(By.CSS_SELECTOR, selector)
    field.clear()
    field.send_keys(str(value))


def tab(driver, name: str) -> None:
    driver.find_element(By.CSS_SELECTOR, f'#tabs button[data-tab="{name}"]').click()


def snap(driver, shots: pathlib.Path, name: str) -> None:
    driver.save_screenshot(str(shots / f"{name}.png"))


def search_word(stack) -> str:
    """' train' where the layer-0 records name a feature that fires on it
    (the shipped build's do); on another build, the strongest token of the
    feature that fires most often, so the page's search has a hit on any
    build."""
    page = json.loads(stack.api("GET", f"/api/saes/{L0}/features?query=train&limit=256").text)
    if any(t["token"].strip() == "train" for f in page["features"] for t in f["top_tokens"]):
        return "train"
    page = json.loads(stack.api("GET", f"/api/saes/{L0}/features?limit=256").text)
    densest = max(page["features"], key=lambda f: f["density"])
    return max(densest["top_tokens"], key=lambda t: t["count"])["token"].strip()


def train_feature(stack) -> int:
    """The layer-0 feature whose strongest tokens hold the search word
    (' train' on the shipped build) most often."""
    word = search_word(stack)
    page = json.loads(stack.api(
        "GET", f"/api/saes/{L0}/features?query={urllib.parse.quote(word)}&limit=256").text)
    return max(page["features"], key=lambda f: sum(
        t["count"] for t in f["top_tokens"] if t["token"].strip() == word))["index"]


def test_page_loads_and_takes_the_admin_key(stack, browser, shots):
    browser.get(f"{stack.base_url}/ui")
    # Without the key the page shows the API's refusal, never a blank page.
    wait(browser, lambda: browser.find_element(By.ID, "error").is_displayed())
    assert "401" in text(browser, "#error") and "API key" in text(browser, "#error")
    assert ADMIN not in browser.page_source  # the page's code holds no key
    fill(browser, "#key", ADMIN)
    browser.find_element(By.ID, "use-key").click()
    wait(browser, lambda: f"model {MODEL}" in text(browser, "#status"))
    assert not browser.find_element(By.ID, "error").is_displayed()
    rows = browser.find_elements(By.CSS_SELECTOR, "#sae-table tbody tr[data-sae]")
    assert {r.get_attribute("data-sae") for r in rows} == {L0, "sae_millm-tiny-res-l1"}
    snap(browser, shots, "01-saes")


def test_attaching_from_the_page_attaches_through_the_api(stack, browser, shots):
    browser.find_element(By.CSS_SELECTOR, f'button[data-action="attach"][data-id="{L0}"]').click()
    wait(browser, lambda: "attached" in text(browser, f'#sae-table tr[data-sae="{L0}"]'))
    saes = {s["id"]: s for s in json.loads(stack.api("GET", "/api/saes").text)["saes"]}
    assert saes[L0]["attached"] is True
    # The feature browser: what a feature fires on, searched by word.
    Select(browser.find_element(By.ID, "feature-sae")).select_by_value(L0)
    word = search_word(stack)
    fill(browser, "#feature-query", word)
    browser.find_element(By.CSS_SELECTOR, "#feature-form button[type=submit]").click()
    feature = train_feature(stack)
    wait(browser, lambda: browser.find_elements(By.CSS_SELECTOR,
                                                f'.feature[data-feature="{feature}"]'))
    card = text(browser, f'.feature[data-feature="{feature}"]')
    assert word in card and "of tokens" in card
    snap(browser, shots, "02-features")


def firing_feature(stack, text: str) -> int:
    """The layer-0 feature that fires hardest on `text`, read before any
    steering: active there by construction, on any build of the model."""
    stack.api("POST", f"/api/saes/{L0}/attach")
    reply = stack.api("POST", "/v1/chat/completions", {
        "model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 1,
        "steering_intensity": "off", "return_sae_activations": {
            "sae_id": L0, "positions": "prompt", "top_k": 1, "read_point": "pre_steering"}})
    positions = json.loads(reply.text)["millm"]["sae_activations"]["positions"]
    return max((p["features"][0] for p in positions if p["features"]),
               key=lambda f: f["value"])["index"]


def densest_feature(stack) -> int:
    """The layer-0 feature that fires on the most tokens of the records: the
    one most likely to light up a heat map of forty tokens, on any build."""
    page = json.loads(stack.api("GET", f"/api/saes/{L0}/features?limit=256").text)
    return max(page["features"], key=lambda f: f["density"])["index"]


def test_a_profile_made_on_the_page_steers_an_sdk_request(stack, browser, shots):
    read_text = "The train left."
    feature = firing_feature(stack, read_text)
    tab(browser, "profiles")
    fill(browser, "#profile-name", "trains")
    browser.find_element(By.ID, "add-entry").click()
    fill(browser, "#entry-table .e-layer", 0)
    fill(browser, "#entry-table .e-feature", feature)
    fill(browser, "#entry-table .e-strength", 6)
    browser.find_element(By.ID, "activate-new").click()
    browser.find_element(By.ID, "create-profile").click()
    wait(browser, lambda: "active" in text(browser, '#profile-table tr[data-profile="trains"]'))
    snap(browser, shots, "03-profiles")
    profile = json.loads(stack.api("GET", "/api/profiles/trains").text)["profile"]
    assert profile["active"] and profile["entries"][0]["feature"] == feature

    def ask(seed: int, **extra) -> str:
        reply = stack.sdk().chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Tell me a story."}],
            max_tokens=40, temperature=1.0, seed=seed, extra_body=extra)
        return reply.choices[0].message.content

    pairs = [(ask(seed), ask(seed, steering_intensity="off")) for seed in range(3)]
    assert all(steered != unsteered for steered, unsteered in pairs)
    # What steers is the page's profile: a tied SAE's feature reads exactly
    # the entry's strength above its unsteered value wherever it was active
    # (whether the story then mentions trains more is the model's business:
    # bench/steering_effect.py measures that).
    def read(point: str) -> list[float]:
        # The text the feature was chosen on, so it is active somewhere.
        body = {"model": MODEL, "messages": [{"role": "user", "content": read_text}],
                "max_tokens": 1, "return_sae_activations": {
                    "sae_id": L0, "features": [feature], "positions": "prompt",
                    "read_point": point}}
        reply = stack.api("POST", "/v1/chat/completions", body)
        assert reply.status_code == 200, reply.text
        return [p["features"][0]["value"]
                for p in json.loads(reply.text)["millm"]["sae_activations"]["positions"]]

    pairs = list(zip(read("pre_steering"), read("post_steering"), strict=True))
    assert any(before > 0 for before, _ in pairs), pairs
    for before, after in pairs:
        assert after - before == pytest.approx(6, abs=1e-3) if before > 0 else after >= 0
    browser.find_element(By.ID, "deactivate-profile").click()
    wait(browser, lambda: not json.loads(stack.api("GET", "/api/profiles/trains").text)[
        "profile"]["active"])


def test_the_profile_editor_writes_modes_and_conditions(stack, browser, shots):
    from selenium.webdriver.support.ui import Select

    stack.api("POST", f"/api/saes/{L0}/attach")
    tab(browser, "profiles")
    fill(browser, "#profile-name", "guarded")
    browser.find_element(By.ID, "add-entry").click()
    browser.find_element(By.ID, "add-entry").click()
    rows = browser.find_elements(By.CSS_SELECTOR, "#entry-table tbody tr")

    def row_fill(row, cls: str, value) -> None:
        field = row.find_element(By.CSS_SELECTOR, cls)
        field.clear()
        field.send_keys(str(value))

    row_fill(rows[0], ".e-feature", 5)
    Select(rows[0].find_element(By.CSS_SELECTOR, ".e-mode")).select_by_value("clamp")
    row_fill(rows[0], ".e-strength", 2)
    Select(rows[0].find_element(By.CSS_SELECTOR, ".e-when")).select_by_value("after_text")
    row_fill(rows[0], ".e-when-arg", "sea")
    Select(rows[1].find_element(By.CSS_SELECTOR, ".e-mode")).select_by_value("abort_when")
    Select(rows[1].find_element(By.CSS_SELECTOR, ".e-when")).select_by_value("feature")
    row_fill(rows[1], ".e-when-arg", 7)
    row_fill(rows[1], ".e-when-above", 3)
    if browser.find_element(By.ID, "activate-new").is_selected():
        browser.find_element(By.ID, "activate-new").click()  # it ends rows: keep it off
    browser.find_element(By.ID, "create-profile").click()
    row = '#profile-table tr[data-profile="guarded"]'
    wait(browser, lambda: "end the row" in text(browser, row))
    shown = text(browser, row)
    assert 'L0 #5 = 2 after "sea"' in shown and "while L0 #7 > 3" in shown
    snap(browser, shots, "03b-profile-modes")
    profile = json.loads(stack.api("GET", "/api/profiles/guarded").text)["profile"]
    assert profile["entries"] == [
        {"layer": 0, "feature": 5, "sae_id": "", "mode": "clamp", "value": 2.0,
         "when": {"after_text": "sea"}},
        {"abort_when": {"feature": 7, "above": 3.0, "layer": 0}}]
    stack.api("DELETE", "/api/profiles/guarded")


def test_playground_shows_two_different_texts_and_a_heat_map(stack, browser, shots):
    feature = densest_feature(stack)
    tab(browser, "playground")
    Select(browser.find_element(By.ID, "pg-sae")).select_by_value(L0)
    fill(browser, "#pg-features", f"{feature}, 31")
    fill(browser, "#pg-strength", 8)
    browser.find_element(By.ID, "pg-run").click()
    wait(browser, lambda: text(browser, "#pg-steered-text") and text(browser, "#pg-unsteered-text"))
    assert text(browser, "#pg-steered-text") != text(browser, "#pg-unsteered-text")
    assert text(browser, "#pg-lambda-applied").startswith("1.0")
    cells = browser.find_elements(By.CSS_SELECTOR, "#pg-steered-heat span")
    assert cells and any("rgba(255, 140, 0, 0)" not in (c.get_attribute("style") or "")
                         for c in cells)
    snap(browser, shots, "04-playground")


def test_monitoring_counters_move_after_traffic(stack, browser, shots):
    tab(browser, "monitoring")
    fill(browser, "#probe-name", "trains")
    Select(browser.find_element(By.ID, "probe-sae")).select_by_value(L0)
    fill(browser, "#probe-features", train_feature(stack))
    fill(browser, "#probe-threshold", 0.3)
    browser.find_element(By.ID, "create-probe").click()
    wait(browser, lambda: browser.find_elements(By.CSS_SELECTOR, '#probe-table tr[data-probe]'))
    browser.find_element(By.ID, "monitor-switch").click()
    wait(browser, lambda: "Reading every generation" in text(browser, "#monitor-state"))
    before = int(text(browser, "#monitor-total"))
    for seed in range(3):
        stack.sdk().chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "What is a train?"}],
            max_tokens=12, seed=seed, extra_body={"profile": "trains"})
    wait(browser, lambda: int(text(browser, "#monitor-total")) >= before + 3)
    row = text(browser, '#probe-table tr[data-probe="trains"]')
    assert "/ 3" in row  # read 3 generations
    snap(browser, shots, "05-monitoring")


def test_the_apis_refusal_is_shown(stack, browser, shots):
    fill(browser, "#probe-name", "too-wide")
    fill(browser, "#probe-features", 999)
    browser.find_element(By.ID, "create-probe").click()
    wait(browser, lambda: browser.find_element(By.ID, "error").is_displayed())
    message = text(browser, "#error")
    assert "400" in message and "past the width" in message and "field: feature" in message
    snap(browser, shots, "06-error")


def test_circuits_show_the_rung_language_and_a_dial(stack, browser, shots):
    tab(browser, "clusters")
    document = {"format": "millm.circuit.v1", "name": "edge", "rung": 1,
                "intensity_range": [0.5, 1.5], "members": [
                    {"layer": 0, "feature": train_feature(stack), "strength": 4.0}]}
    area = browser.find_element(By.ID, "document")
    area.clear()
    area.send_keys(json.dumps(document))
    browser.find_element(By.ID, "import-circuit").click()
    wait(browser, lambda: "suggested (attribution-supported)" in text(browser, "#circuit-table"))
    assert browser.find_elements(By.CSS_SELECTOR, 'input[data-dial="edge"]')
    snap(browser, shots, "07-circuits")


def test_the_playground_steers_a_gguf_model_too(stack, browser, shots):
    """The page names whatever model is loaded; on the GGUF export the same
    playground steers and reads activations (engines/gguf/steering.py)."""
    gguf = "millm-tiny-gguf:F32"
    stack.sdk().chat.completions.create(model=gguf, max_tokens=2,
                                        messages=[{"role": "user", "content": "Hi"}])
    assert stack.api("POST", f"/api/saes/{L0}/attach").status_code == 200
    try:
        browser.get(f"{stack.base_url}/ui")
        wait(browser, lambda: browser.find_element(By.ID, "key").is_displayed()
             or f"model {gguf}" in text(browser, "#status"))
        if f"model {gguf}" not in text(browser, "#status"):
            fill(browser, "#key", ADMIN)
            browser.find_element(By.ID, "use-key").click()
        wait(browser, lambda: f"model {gguf}" in text(browser, "#status"))
        tab(browser, "playground")
        wait(browser, lambda: browser.find_elements(By.CSS_SELECTOR,
                                                    f'#pg-sae option[value="{L0}"]'))
        Select(browser.find_element(By.ID, "pg-sae")).select_by_value(L0)
        fill(browser, "#pg-features", f"{train_feature(stack)}, 31")
        fill(browser, "#pg-strength", 8)
        browser.find_element(By.ID, "pg-run").click()
        try:
            wait(browser, lambda: text(browser, "#pg-steered-text")
                 and text(browser, "#pg-unsteered-text"))
        except Exception:
            raise AssertionError(f"the playground showed no texts; error: "
                                 f"{text(browser, '#error')!r}") from None
        assert text(browser, "#pg-steered-text") != text(browser, "#pg-unsteered-text")
        assert browser.find_elements(By.CSS_SELECTOR, "#pg-steered-heat span")
        snap(browser, shots, "08-playground-gguf")
    finally:
        stack.sdk().chat.completions.create(model=MODEL, max_tokens=2,
                                            messages=[{"role": "user", "content": "Hi"}])


def test_the_workbench_searches_explains_builds_and_compares(stack, browser, shots):
    """Search by word, open the card and explain the feature, build a vector
    from pairs (saved and listed), and compare steered with unsteered in one
    call: each step against the API."""
    tab(browser, "workbench")
    wait(browser, lambda: browser.find_elements(By.CSS_SELECTOR, f'#wb-sae option[value="{L0}"]'))
    Select(browser.find_element(By.ID, "wb-sae")).select_by_value(L0)
    Select(browser.find_element(By.ID, "wb-mode")).select_by_value("query")
    fill(browser, "#wb-query", search_word(stack))
    browser.find_element(By.ID, "wb-search").click()
    feature = train_feature(stack)
    wait(browser, lambda: browser.find_elements(By.CSS_SELECTOR,
                                                f'#wb-results [data-match="{feature}"]'))
    browser.find_element(By.CSS_SELECTOR, f'button[data-card="{feature}"]').click()
    wait(browser, lambda: browser.find_elements(By.CSS_SELECTOR, "#wb-promoted .chip"))
    fill(browser, "#wb-explanation", "fires on trains")
    browser.find_element(By.ID, "wb-save-explanation").click()
    wait(browser, lambda: (json.loads(stack.api(
        "GET", f"/api/saes/{L0}/features/{feature}").text)["explanation"] or {}).get(
        "text") == "fires on trains")
    snap(browser, shots, "09-workbench-card")

    pairs = ["The sea is wide and moving. | A train is a line of cars that runs on rails.",
             "Waves roll toward the shore. | It carries people from one station to another.",
             "Gulls fly over the water. | The train left the station at seven."]
    fill(browser, "#wb-vector-name", "page-sea")
    fill(browser, "#wb-vector-layer", 1)
    area = browser.find_element(By.ID, "wb-pairs")
    area.clear()
    area.send_keys("\n".join(pairs))
    browser.find_element(By.ID, "wb-build").click()
    try:
        wait(browser, lambda: browser.find_elements(By.CSS_SELECTOR,
                                                    '#wb-vector [data-vector="cv_page-sea"]'))
    except Exception:
        snap(browser, shots, "10-workbench-vector-failed")
        raise AssertionError(f"no vector shown; error: {text(browser, '#error')!r}") from None
    listed = json.loads(stack.api("GET", "/api/control_vectors").text)["control_vectors"]
    assert "cv_page-sea" in [v["id"] for v in listed]
    assert "Nearest SAE features" in text(browser, "#wb-vector")
    snap(browser, shots, "10-workbench-vector")

    assert stack.api("POST", "/api/profiles", {"name": "page-sea", "entries": [
        {"control_vector": "page-sea", "scale": 4}]}).status_code == 200
    tab(browser, "saes")
    tab(browser, "workbench")
    wait(browser, lambda: browser.find_elements(
        By.CSS_SELECTOR, '#wb-compare-profile option[value="page-sea"]'))
    Select(browser.find_element(By.ID, "wb-compare-profile")).select_by_value("page-sea")
    fill(browser, "#wb-compare-tokens", 16)
    browser.find_element(By.ID, "wb-compare").click()
    wait(browser, lambda: text(browser, "#wb-steered") and text(browser, "#wb-unsteered"))
    reply = json.loads(stack.api("POST", "/v1/chat/completions", {
        "model": MODEL, "messages": [{"role": "user", "content": "Tell me about the weather."}],
        "max_tokens": 16, "temperature": 0, "seed": 7, "profile": "page-sea",
        "steering_intensity": 1, "steering_compare": True}).text)
    assert text(browser, "#wb-steered") == reply["choices"][0]["message"]["content"].strip()
    assert text(browser, "#wb-unsteered") == reply["millm"]["unsteered"]["choices"][0][
        "message"]["content"].strip()
    spans = browser.find_elements(By.CSS_SELECTOR, "#wb-divergence span")
    assert len(spans) == len(reply["millm"]["divergence"][0]["tokens"])
    snap(browser, shots, "11-workbench-compare")
