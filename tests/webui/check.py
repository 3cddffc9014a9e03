"""`make webui-check`: Open WebUI against miLLM's bridge, driven in headless Chromium.

Starts an engine and bridge of its own on free loopback ports (the demo
models, as `make run` serves them), then Open WebUI from .venv-webui (pinned by
tests/webui/requirements.txt) in offline mode with an empty data dir, then
drives Open WebUI's chat page with Selenium through Debian's Chromium. For each
of millm-tiny and millm-tiny-gguf:Q8_0 it checks, in a fresh chat:

1. the model is listed in the page's model selector, and is chosen there;
2. a typed message gets an answer on the page that is not an error, and the
   bridge streamed it (text/event-stream, the page shows the streamed text);
3. a follow-up message is answered, and its request carried the first turn;
4. the chat gets a title in the sidebar (not "New Chat") after Open WebUI's
   title request to the bridge was answered;

saving screenshots of each step to a folder it prints (or --shots DIR).

Between Open WebUI and the bridge sits a small recording relay on loopback:
it passes every request and answer through unchanged, chunk by chunk, and
keeps what went by, which is how the check knows an answer was streamed and
what the model wrote for the title. Open WebUI calls the bridge from its
server (no browser Origin), so the bridge needs no CORS setting.

Nothing leaves the machine: where `unshare` can make a user and network
namespace, everything runs inside one whose only interface is loopback (so an
outside connection fails at once and visibly); Open WebUI runs with its offline
mode, no update check, no telemetry and no embedding model, and Chromium with
background networking, component updates, sync and reporting off.

Not collected by pytest (not a test_*.py file): Open WebUI's venv is several GB.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import pathlib
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from selenium import webdriver  # noqa: E402
from selenium.common.exceptions import (  # noqa: E402
    NoSuchElementException,
    StaleElementReferenceException,
    TimeoutException,
)
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

from tests import harness, headless_chromium  # noqa: E402

WEBUI_BIN = ROOT / ".venv-webui" / "bin" / "open-webui"
MODELS = ("millm-tiny", "millm-tiny-gguf:Q8_0")
FIRST = "What is a train?"
FOLLOW_UP = "What does it carry?"
ANSWER_TIMEOUT = 300  # a model switch loads the other model first

# Open WebUI's task prompts start with these lines (its config.py defaults).
TASK_MARKERS = {
    "title": "Generate a concise title",
    "tags": "Generate 1-3 broad tags",
    "follow_ups": "Predict 3-5 useful messages",
}

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
              "proxy-connection", "host", "content-length"}


def webui_env(data_dir: pathlib.Path, bridge_v1: str) -> dict[str, str]:
    """Open WebUI's settings: offline, single user, miLLM as its one OpenAI
    connection (docs/open-webui.md explains each)."""
    return {
        "DATA_DIR": str(data_dir),
        "WEBUI_SECRET_KEY": secrets.token_hex(16),
        "WEBUI_AUTH": "false",
        "OFFLINE_MODE": "true",
        "ENABLE_VERSION_UPDATE_CHECK": "false",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "ANONYMIZED_TELEMETRY": "false",
        "DO_NOT_TRACK": "true",
        "SCARF_NO_ANALYTICS": "true",
        "RAG_EMBEDDING_MODEL": "",
        "ENABLE_OLLAMA_API": "false",
        "ENABLE_OPENAI_API": "true",
        "OPENAI_API_BASE_URL": bridge_v1,
        "OPENAI_API_KEY": "unused",
    }


# --- the recording relay ----------------------------------------------------

class Relay(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, target_port: int):
        super().__init__(("127.0.0.1", 0), RelayHandler)
        self.target_port = target_port
        self.exchanges: list[dict] = []
        self.lock = threading.Lock()

    @property
    def port(self) -> int:
        return self.server_address[1]

    def chats(self, model: str, kind: str = "chat", prompt: str | None = None) -> list[dict]:
        """Finished chat completions for model of that kind (and, given prompt,
        whose last message is the user's prompt)."""
        with self.lock:
            return [x for x in self.exchanges if x.get("model") == model and x["kind"] == kind
                    and x.get("done") and (prompt is None or (
                        x["messages"] and x["messages"][-1]["role"] == "user"
                        and x["messages"][-1]["content"].strip() == prompt))]


def task_kind(body: dict) -> str:
    """'chat' for a chat turn; Open WebUI's background tasks put one prompt
    that starts with '### Task:' in a user message."""
    texts = [str(m.get("content", "")) for m in body.get("messages") or [] if isinstance(m, dict)]
    if not any(t.lstrip().startswith("### Task:") for t in texts):
        return "chat"
    for kind, marker in TASK_MARKERS.items():
        if any(marker in t for t in texts):
            return kind
    return "task"


class RelayHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"  # the body ends when the connection closes

    def log_message(self, *args):
        pass

    def do_GET(self):
        self.relay()

    def do_POST(self):
        self.relay()

    def relay(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else None
        record: dict = {"method": self.command, "path": self.path, "kind": "other"}
        if raw and self.path.endswith("/chat/completions"):
            body = json.loads(raw)
            record.update(kind=task_kind(body), model=body.get("model"),
                          stream=bool(body.get("stream")),
                          messages=[{"role": m.get("role"),
                                     "content": str(m.get("content", ""))[:300]}
                                    for m in body.get("messages") or []],
                          tools=len(body.get("tools") or []))
        with self.server.lock:
            self.server.exchanges.append(record)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
        conn = http.client.HTTPConnection("127.0.0.1", self.server.target_port, timeout=600)
        conn.request(self.command, self.path, body=raw, headers=headers)
        reply = conn.getresponse()
        record.update(status=reply.status, content_type=reply.getheader("Content-Type", ""))
        self.send_response(reply.status)
        for key, value in reply.getheaders():
            if key.lower() not in HOP_BY_HOP or (key.lower() == "content-length"
                                                 and not reply.chunked):
                self.send_header(key, value)
        self.end_headers()
        got = bytearray()
        chunks = 0
        while chunk := reply.read1(65536):
            got += chunk
            chunks += 1
            self.wfile.write(chunk)
            self.wfile.flush()
        conn.close()
        record["chunks"] = chunks
        if "kind" in record and record["kind"] != "other":
            record.update(answer_of(bytes(got), record["content_type"]))
        record["done"] = True


def answer_of(raw: bytes, content_type: str) -> dict:
    """The assistant text in a chat completion, streamed or not, and any error."""
    text = raw.decode(errors="replace")
    if content_type.startswith("text/event-stream"):
        parts, events, error = [], 0, None
        for line in text.splitlines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                error = event["error"]
                continue
            for choice in event.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    parts.append(piece)
                    events += 1
        return {"text": "".join(parts), "content_events": events, "error": error}
    try:
        body = json.loads(text)
    except ValueError:
        return {"text": "", "error": text[:300]}
    if "error" in body:
        return {"text": "", "error": body["error"]}
    return {"text": body["choices"][0]["message"].get("content") or "", "error": None}


# --- the browser --------------------------------------------------------------

def chromium() -> webdriver.Chrome:
    """The same Chromium as the console's tests: nothing beyond loopback."""
    try:
        return headless_chromium.start(1280, 860, page_load_timeout=60)
    except RuntimeError as exc:
        raise SystemExit(str(exc)) from None


def wait(driver, predicate, timeout: float = 60, what: str = ""):
    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.3,
                             ignored_exceptions=(NoSuchElementException,
                                                 StaleElementReferenceException)
                             ).until(lambda d: predicate())
    except TimeoutException:
        raise AssertionError(f"timed out after {timeout}s waiting for {what}") from None


def flat(text: str) -> str:
    return " ".join(text.split())


class Page:
    def __init__(self, driver, base: str, shots: pathlib.Path):
        self.d, self.base, self.shots = driver, base, shots
        self.n = 0

    def snap(self, name: str) -> str:
        self.n += 1
        path = self.shots / f"{self.n:02d}-{name}.png"
        self.d.save_screenshot(str(path))
        return str(path)

    def dismiss_whats_new(self) -> None:
        """The release notes dialog shown on a first visit."""
        for button in self.d.find_elements(By.TAG_NAME, "button"):
            if button.text.strip().startswith("Okay, Let's Go"):
                button.click()
                wait(self.d, lambda: not any(b.text.strip().startswith("Okay, Let's Go")
                                             for b in self.d.find_elements(By.TAG_NAME, "button")),
                     10, "the release notes dialog to close")
                return

    def new_chat(self) -> None:
        self.d.get(self.base + "/")
        wait(self.d, lambda: self.d.find_element(By.ID, "chat-input"), 60, "the chat page")
        time.sleep(1.5)  # the release notes dialog opens a moment after the page
        self.dismiss_whats_new()

    def choose_model(self, model: str) -> list[str]:
        self.d.find_element(By.ID, "model-selector-model-button").click()
        option = f'button[role="option"][data-value="{model}"]'
        wait(self.d, lambda: self.d.find_element(By.CSS_SELECTOR, option), 30,
             f"{model} in the model selector")
        listed = [o.get_attribute("data-value")
                  for o in self.d.find_elements(By.CSS_SELECTOR, 'button[role="option"]')]
        self.snap(f"{slug(model)}-models-listed")
        self.d.find_element(By.CSS_SELECTOR, option).click()
        wait(self.d, lambda: self.d.find_element(By.ID, "model-selector-model-button").text.strip()
             == model, 10, f"{model} to be the chosen model")
        return listed

    def assistant_messages(self):
        return self.d.find_elements(By.CSS_SELECTOR,
                                    'div[id^="message-"]:has(#response-message-model-name)')

    def send(self, text: str, answers_before: int, failed) -> dict:
        """Types text, presses Enter and waits until the new answer is complete
        (its Regenerate button shows) or the bridge refused it (failed())."""
        box = self.d.find_element(By.ID, "chat-input")
        box.click()
        box.send_keys(text)
        box.send_keys(Keys.ENTER)

        def finished():
            messages = self.assistant_messages()
            if len(messages) <= answers_before:
                return False
            return (failed() or messages[-1].find_elements(
                By.CSS_SELECTOR, 'button[aria-label="Regenerate"]'))

        wait(self.d, finished, ANSWER_TIMEOUT, f"an answer to {text!r}")
        time.sleep(1)  # the last pieces, or an error, render
        last = self.assistant_messages()[-1]
        content = last.find_elements(By.CSS_SELECTOR, "#response-content-container")
        errors = [e.text for e in last.find_elements(By.CSS_SELECTOR, '[class*="border-red"]')]
        return {"page_text": content[0].text if content else "", "message_text": last.text,
                "page_errors": errors}

    def chat_id(self) -> str:
        match = re.search(r"/c/([0-9a-f-]+)", self.d.current_url)
        assert match, f"no chat id in {self.d.current_url}"
        return match.group(1)

    def sidebar_title(self, chat_id: str) -> str:
        items = self.d.find_elements(
            By.CSS_SELECTOR, f'[data-sidebar-chat-id="{chat_id}"] a div[dir="auto"]')
        return (items[0].get_attribute("textContent") or "").strip() if items else ""

    def open_sidebar(self) -> None:
        for button in self.d.find_elements(By.CSS_SELECTOR, 'button[aria-label="Open Sidebar"]'):
            if button.is_displayed():
                button.click()
                time.sleep(0.8)
                return


def slug(model: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", model.lower()).strip("-")


# --- one model, one chat ------------------------------------------------------

def check_model(page: Page, relay: Relay, model: str, result: dict) -> None:
    """Fills result in as it goes; raises AssertionError where it cannot go on."""
    checks = result["checks"]
    page.new_chat()
    listed = page.choose_model(model)
    result["listed"] = listed
    checks["listed_and_chosen"] = model in listed

    turns = []
    for number, (prompt, kind) in enumerate(((FIRST, "first"), (FOLLOW_UP, "follow_up"))):
        def refused(p=prompt):
            done = relay.chats(model, prompt=p)
            return bool(done) and (done[-1]["status"] != 200 or bool(done[-1].get("error")))

        shown = page.send(prompt, number, refused)
        wait(page.d, lambda p=prompt: relay.chats(model, prompt=p), 30,
             f"the bridge's answer to {prompt!r} to be recorded")
        sent = relay.chats(model, prompt=prompt)[-1]
        bridge_error = sent.get("error")
        if bridge_error:
            message = bridge_error.get("message", "") if isinstance(bridge_error, dict) else ""
            if message and flat(message) in flat(shown["message_text"]):
                shown["page_errors"].append(message)
        page.snap(f"{slug(model)}-{kind}-answer")
        turn = {"prompt": prompt, "page_text": shown["page_text"],
                "page_errors": shown["page_errors"], "status": sent["status"],
                "content_type": sent["content_type"], "stream": sent["stream"],
                "content_events": sent.get("content_events", 0), "bridge_text": sent.get("text"),
                "bridge_error": sent.get("error"), "messages_sent": len(sent["messages"]),
                "tools_sent": sent["tools"]}
        turns.append(turn)
        answered = (sent["status"] == 200 and not sent.get("error") and not shown["page_errors"]
                    and bool(flat(shown["page_text"])))
        streamed = (sent["stream"] and sent["content_type"].startswith("text/event-stream")
                    and turn["content_events"] >= 1)
        # The page renders Markdown (or leaves what it cannot render as it is),
        # so compare the words with Markdown's marks left out on both sides.
        same = (flat(re.sub(r"[*_`#>]", "", sent.get("text") or ""))
                == flat(re.sub(r"[*_`#>]", "", shown["page_text"])))
        checks[f"{kind}_answered_not_error"] = answered
        if not answered:
            page.snap(f"{slug(model)}-{kind}-error")
            (page.shots / f"{slug(model)}-{kind}.html").write_text(page.d.page_source)
            raise AssertionError(f"{prompt!r} was not answered: bridge {sent['status']} "
                                 f"{bridge_error}, page {shown['message_text']!r}")
        checks[f"{kind}_streamed"] = bool(streamed)
        checks[f"{kind}_page_shows_streamed_text"] = same
        if kind == "follow_up":
            history = sent["messages"]
            checks["follow_up_carries_first_turn"] = (
                any(m["role"] == "user" and FIRST in m["content"] for m in history)
                and any(m["role"] == "assistant" for m in history))
    result["turns"] = turns

    chat_id = page.chat_id()
    wait(page.d, lambda: relay.chats(model, "title"), 120, "Open WebUI's title request")
    wait(page.d, lambda: page.sidebar_title(chat_id) not in ("", "New Chat"), 60,
         "a chat title in the sidebar")
    title = page.sidebar_title(chat_id)
    title_call = relay.chats(model, "title")[0]
    model_wrote = title_call.get("text") or ""
    result["title"] = {
        "shown": title,
        "request_status": title_call["status"],
        "model_wrote": model_wrote[:200],
        # Open WebUI keeps the model's title only when its reply holds the JSON
        # object it asked for; otherwise it names the chat after the first message.
        "source": "model" if title != FIRST else "open-webui-fallback (first message)",
    }
    checks["title_request_answered"] = title_call["status"] == 200 and not title_call.get("error")
    checks["title_in_sidebar"] = title not in ("", "New Chat")
    page.open_sidebar()
    page.snap(f"{slug(model)}-title-in-sidebar")
    result["tasks_answered"] = {
        kind: [x["status"] for x in relay.chats(model, kind)] for kind in TASK_MARKERS}


# --- processes ------------------------------------------------------------------

def start_webui(tmp: pathlib.Path, relay_port: int) -> tuple[harness.Process, int]:
    if not WEBUI_BIN.exists():
        raise SystemExit(f"{WEBUI_BIN} is missing: run `make webui-check` (it builds .venv-webui)")
    port = harness.free_port()
    data = tmp / "open-webui"
    data.mkdir()
    env = {**os.environ, **webui_env(data, f"http://127.0.0.1:{relay_port}/v1")}
    process = harness.Process([str(WEBUI_BIN), "serve", "--host", "127.0.0.1", "--port",
                               str(port)], env, tmp / "open-webui.log")
    harness.wait_http(process, f"http://127.0.0.1:{port}/health", timeout=300)
    return process, port


def outside_attempts(log: str) -> list[str]:
    """Lines of Open WebUI's log that tell of a connection it tried beyond
    loopback (inside the namespace such a try fails at once)."""
    patterns = ("Network is unreachable", "Name or service not known", "Temporary failure in name",
                "huggingface.co", "api.github.com", "Cannot connect to host", "ConnectionError")
    return [line[:300] for line in log.splitlines() if any(p in line for p in patterns)]


def isolate_or_not(args) -> int | None:
    """Re-run this script in a user + network namespace with loopback only,
    where the kernel allows it; None when it does not (then run here)."""
    if args.isolated or args.no_isolate or not shutil.which("unshare"):
        return None
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "--net", "--",
                            "ip", "link", "set", "lo", "up"], capture_output=True)
    if probe.returncode != 0:
        print("note: cannot make a network namespace here; running on the host's network",
              flush=True)
        return None
    inner = [sys.executable, str(pathlib.Path(__file__).resolve()), "--isolated",
             *(["--shots", args.shots] if args.shots else [])]
    script = 'ip link set lo up && exec "$@"'
    return subprocess.call(["unshare", "--user", "--map-root-user", "--net", "--",
                            "sh", "-c", script, "sh", *inner])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shots", help="folder for the screenshots (default: a new temp folder)")
    parser.add_argument("--no-isolate", action="store_true",
                        help="do not run inside a loopback-only network namespace")
    parser.add_argument("--isolated", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    code = isolate_or_not(args)
    if code is not None:
        return code

    tmp = pathlib.Path(tempfile.mkdtemp(prefix="millm-webui-"))
    shots = pathlib.Path(args.shots) if args.shots else tmp / "screenshots"
    shots.mkdir(parents=True, exist_ok=True)
    print(f"Open WebUI check: screenshots and logs in {shots} and {tmp}"
          f" ({'loopback-only network namespace' if args.isolated else 'host network'})",
          flush=True)
    results, failures = [], []
    stack = relay = webui = driver = None
    started = time.monotonic()
    try:
        (tmp / "millm").mkdir()
        stack = harness.OwnStack(tmp / "millm")
        relay = Relay(stack.http_port)
        threading.Thread(target=relay.serve_forever, daemon=True).start()
        webui, webui_port = start_webui(tmp, relay.port)
        print(f"miLLM bridge {stack.base_url}, relay :{relay.port}, "
              f"Open WebUI http://127.0.0.1:{webui_port} (up after "
              f"{time.monotonic() - started:.0f}s)", flush=True)
        driver = chromium()
        page = Page(driver, f"http://127.0.0.1:{webui_port}", shots)
        for model in MODELS:
            result: dict = {"model": model, "checks": {}}
            try:
                check_model(page, relay, model, result)
            except AssertionError as exc:
                page.snap(f"{slug(model)}-failed")
                result["checks"]["completed"] = False
                result["failure"] = str(exc)
            results.append(result)
            for name, ok in result["checks"].items():
                print(f"  {'ok  ' if ok else 'FAIL'} {model}: {name}", flush=True)
                if not ok:
                    failures.append(f"{model}: {name}")
            if "failure" in result:
                print(f"       {result['failure']}", flush=True)
            for turn in result.get("turns", []):
                print(f"       {turn['prompt']!r} -> {turn['page_text']!r} "
                      f"({turn['content_events']} streamed pieces, "
                      f"{turn['messages_sent']} messages, {turn['tools_sent']} tools sent)")
            if "title" in result:
                print(f"       title {result['title']['shown']!r} ({result['title']['source']}; "
                      f"the model wrote {result['title']['model_wrote']!r})", flush=True)
    finally:
        if driver is not None:
            driver.quit()
        if webui is not None:
            webui.stop()
        if relay is not None:
            relay.shutdown()
        if stack is not None:
            stack.stop()
    webui_log = (tmp / "open-webui.log").read_text(errors="replace") \
        if (tmp / "open-webui.log").exists() else ""
    attempts = outside_attempts(webui_log)
    summary = {"results": results, "outside_connection_attempts": attempts,
               "isolated": args.isolated, "seconds": round(time.monotonic() - started),
               "exchanges": relay.exchanges if relay else []}
    (shots / "summary.json").write_text(json.dumps(summary, indent=2))
    print(f"Open WebUI's log: {len(attempts)} line(s) about outside connections"
          + "".join(f"\n       {a}" for a in attempts[:10]))
    print(f"screenshots: {shots}  (summary.json beside them)")
    if attempts:
        # Nothing may reach beyond loopback: isolated, these failed at once;
        # on the host's network they may have gone out.
        failures.append("Open WebUI tried to reach outside hosts")
    if failures:
        print(f"FAILED: {', '.join(failures)}")
        return 1
    print(f"Open WebUI check passed for {', '.join(MODELS)} in {summary['seconds']}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
