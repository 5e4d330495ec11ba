"""The jobs page in a real headless browser (Debian's chromium) against a real `corpusmill serve`.

The browser is driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`: JSON messages
on file descriptors 3 and 4, so no websocket client is needed): it logs in through the form as a
person would, looks at the list and at a running and a finished job, screenshots both, switches to
Chinese, and cancels the running job with the page's button. A job whose input folder and run
directory are named with HTML must show those names as text; nothing may be fetched from anywhere
but the service. Skipped, saying why, where chromium is not installed (`.ci/run` installs it with apt
where it can).
"""
from __future__ import annotations

import base64
import fcntl
import json
import os
import queue
import shutil
import subprocess
import threading
from pathlib import Path

import httpx
import pytest

from tests.corpora import write_long_corpus, write_small_corpus
from tests.servers import HTTP_S, JOB_S, START_S, TOKEN, Server, follow, still_active, wait_until

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed "
                                "(apt-get install chromium; .ci/run does where apt works): the jobs page is not tested "
                                "in a browser")

EVIL_INPUT = "<img src=x onerror=document.title='pwned-input'>"
# no '=' in a run directory's name: pyarrow reads key=value folders as Hive partitions (see the report)
EVIL_OUT = "<b>bold-out<i>"
PNG = b"\x89PNG\r\n\x1a\n"


class Browser:
    """Headless chromium and one page of it, spoken to over the DevTools protocol on a pipe."""

    def __init__(self, profile: Path):
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        # the browser reads commands from its fd 3 and answers on its fd 4: hand both over above 10, then move
        keep = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_browser_r, from_browser_w)]
        for fd in (to_browser_r, from_browser_w):
            os.close(fd)
        args = [CHROMIUM, "--headless", "--remote-debugging-pipe", "--no-sandbox", "--disable-gpu",
                "--no-first-run", "--no-default-browser-check", "--disable-extensions", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--metrics-recording-only", "--mute-audio",
                f"--user-data-dir={profile}", "--window-size=1280,900", "about:blank"]
        self.proc = subprocess.Popen([shutil.which("bash") or "bash", "-c", f'exec "$0" "$@" 3<&{keep[0]} 4>&{keep[1]}', *args], pass_fds=keep,
                                     stdout=subprocess.DEVNULL, stderr=open(profile.parent / "chromium.log", "wb"))
        for fd in keep:
            os.close(fd)
        self._next_id = 0
        self._answers: dict[int, queue.Queue] = {}
        self._lock = threading.Lock()
        self.requests: list[str] = []  # every URL the page asked for
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        target = self.send("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page.enable", "Runtime.enable", "Network.enable"):
            self.send(domain, session=self.session)

    def _read(self) -> None:
        buffer = b""
        while True:
            chunk = os.read(self._from_browser, 1 << 16)
            if not chunk:
                return
            buffer += chunk
            while b"\0" in buffer:
                raw, buffer = buffer.split(b"\0", 1)
                message = json.loads(raw)
                if "id" in message:
                    with self._lock:
                        box = self._answers.get(message["id"])
                    if box is not None:
                        box.put(message)
                elif message.get("method") == "Network.requestWillBeSent":
                    self.requests.append(message["params"]["request"]["url"])

    def send(self, method: str, session: str | None = None, **params) -> dict:
        with self._lock:
            self._next_id += 1
            call_id = self._next_id
            box = self._answers[call_id] = queue.Queue()
        message = {"id": call_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        try:
            answer = box.get(timeout=HTTP_S)
        except queue.Empty:
            raise AssertionError(f"chromium did not answer {method} within {HTTP_S}s") from None
        if "error" in answer:
            raise AssertionError(f"{method}: {answer['error']}")
        return answer["result"]

    def js(self, expression: str):
        """The value of a JavaScript expression in the page (promises awaited)."""
        result = self.send("Runtime.evaluate", session=self.session, expression=expression, awaitPromise=True,
                           returnByValue=True)
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def go(self, url: str) -> None:
        self.send("Page.navigate", session=self.session, url=url)
        wait_until(lambda: self.js("document.readyState === 'complete' && location.href !== 'about:blank'"),
                   HTTP_S, f"{url} to load")

    def wait(self, expression: str, what: str, timeout: float = HTTP_S):
        return wait_until(lambda: self.js(expression), timeout, what)

    def screenshot(self, path: Path) -> bytes:
        data = base64.b64decode(self.send("Page.captureScreenshot", session=self.session, format="png")["data"])
        path.write_bytes(data)
        return data

    def close(self) -> None:
        try:  # no answer is waited for: the browser closes the pipe as it goes
            os.write(self._to_browser, json.dumps({"id": 0, "method": "Browser.close"}).encode() + b"\0")
        except OSError:
            pass
        try:
            self.proc.wait(timeout=HTTP_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_browser)


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("jobs-page") / "data"
    write_small_corpus(root / EVIL_INPUT, ids="<script>document.title='pwned-id'</script>")
    write_long_corpus(root / "long")
    return root


@pytest.fixture(scope="module")
def server(data_root):
    srv = Server(data_root.parent / "state", [data_root], "--workers", "1", "--max-concurrent", "2").start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def jobs(server) -> dict:
    """A finished dedup job over the HTML-named folder, and a long one still running."""
    with server.client() as c:
        small = c.post("/v1/jobs", json={"kind": "dedup", "format": "jsonl", "out": f"jobs/{EVIL_OUT}",
                                         "config": {"input": {"paths": [EVIL_INPUT], "part_size_mb": 0.001}}})
        assert small.status_code == 201, small.text
        long = c.post("/v1/jobs", json={"kind": "dedup", "config": {"input": {"paths": ["long"], "part_size_mb": 1,
                                                                               "block_size_mb": 1}}})
        assert long.status_code == 201, long.text
        finished = follow(c, small.json()["id"])
        assert finished["state"] == "succeeded", finished["error"]
    return {"finished": finished, "running": long.json()["id"]}


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    b = Browser(tmp_path_factory.mktemp("chromium") / "profile")
    yield b
    b.close()


def test_login_list_running_and_finished_job_pages(server, jobs, browser, tmp_path):
    b, done, running = browser, jobs["finished"], jobs["running"]
    b.go(server.url + "/jobs")  # not logged in: the login form
    assert b.js("location.pathname") == "/login"
    b.js("document.getElementById('token').value = 'not-the-token-0123456789'; document.getElementById('login').click()")
    b.wait("document.getElementById('login-error') !== null", "the wrong token to be refused")
    b.js(f"document.getElementById('token').value = {json.dumps(TOKEN)}; document.getElementById('login').click()")
    b.wait("location.pathname === '/jobs' && document.querySelector('#jobs') !== null", "the jobs list")
    assert b.js("document.cookie").find("corpusmill_session") == -1  # HttpOnly: no script sees the session
    rows = b.wait(f"[...document.querySelectorAll('#jobs tbody tr')].map(r => r.innerText).filter(t => t.includes("
                  f"{json.dumps(done['id'])}) || t.includes({json.dumps(running)})).length === 2 && "
                  "document.querySelector('#jobs').innerText", "both jobs listed")
    assert EVIL_OUT in rows and "succeeded" in rows  # the run directory's name, as text
    assert b.screenshot(tmp_path / "jobs-list.png").startswith(PNG)

    # the running job: its state, progress and log, refreshed by the page
    with server.client() as c:
        wait_until(lambda: (still_active(c, running).get("progress") or {}).get("tasks_total"), JOB_S,
                   "the long job to report task progress")
    b.go(f"{server.url}/jobs/{running}")
    b.wait("document.body.dataset.state === 'running' && document.getElementById('log').textContent.includes('engine:')",
           "the running job's page with its log")
    shot = b.screenshot(tmp_path / "running-job.png")
    assert shot.startswith(PNG) and len(shot) > 1000
    assert b.js("document.querySelector('#job .state').textContent") == "running"
    assert b.js("document.querySelector('#job progress') !== null")

    # the finished job: every HTML-holding value shown as text, nothing of it run
    b.go(f"{server.url}/jobs/{done['id']}")
    b.wait("document.body.dataset.state === 'succeeded' && document.getElementById('config') !== null",
           "the finished job's page")
    shot = b.screenshot(tmp_path / "finished-job.png")
    assert shot.startswith(PNG) and len(shot) > 1000
    dom = b.js("document.documentElement.outerHTML")
    assert "&lt;img src=x onerror=document.title='pwned-input'&gt;" in dom  # the config's input path
    assert "&lt;b&gt;bold-out&lt;i&gt;" in dom  # the run directory
    assert EVIL_INPUT in b.js("document.getElementById('config').textContent")
    assert b.js("document.querySelectorAll('main img, main b, main i, main script').length") == 0
    assert "pwned" not in b.js("document.title")
    assert b.js("document.querySelector('#job .state').textContent") == "succeeded"
    text = b.js("document.getElementById('job').innerText")
    ledger = done["ledger"]
    assert f"{ledger['input']}" in text and f"{ledger['duplicates']}" in text and "Counts add up" in text
    assert b.js("document.querySelector('a[href$=\"/report\"]').getAttribute('href')") == f"/v1/jobs/{done['id']}/report"
    report = b.js(f"fetch('/v1/jobs/{done['id']}/report').then(r => r.status + ' ' + r.headers.get('content-security-policy'))")
    assert report.startswith("200 ") and "script-src" not in report and "default-src 'none'" in report

    # Chinese labels, remembered for the next page
    b.go(f"{server.url}/jobs/{done['id']}?lang=zh")
    b.wait("document.body.dataset.state === 'succeeded'", "the page in Chinese")
    assert b.js("document.documentElement.lang") == "zh-CN"
    assert b.js("document.querySelector('#job .state').textContent") == "成功"
    assert "文档账目" in b.js("document.getElementById('job').innerText")
    b.screenshot(tmp_path / "finished-job-zh.png")
    b.go(server.url + "/jobs")
    b.wait("document.querySelector('#jobs h1') !== null", "the list")
    assert b.js("document.querySelector('#jobs h1').textContent") == "任务"
    b.go(server.url + "/jobs?lang=en")

    # everything the pages loaded came from the service itself
    assert b.requests and all(u.startswith(server.url + "/") or u == "about:blank" for u in b.requests), b.requests


def test_the_cancel_button_and_csrf(server, jobs, browser):
    b, running = browser, jobs["running"]
    b.go(f"{server.url}/jobs/{running}")
    b.wait("document.getElementById('cancel') !== null || document.body.dataset.state === 'cancelled'",
           "the running job's cancel button")
    # the session cookie alone cannot change anything: a POST needs the page's CSRF token
    status = b.js(f"fetch('/v1/jobs/{running}/cancel', {{method: 'POST'}}).then(r => r.status)")
    assert status == 403
    with server.client() as c:
        assert still_active(c, running)["cancel_requested"] is False
        b.js("document.getElementById('cancel').click()")
        final = follow(c, running, timeout=START_S)
    assert final["state"] == "cancelled"
    b.wait("document.body.dataset.state === 'cancelled'", "the page to show the job cancelled", timeout=START_S)


def test_cookie_sessions_over_http(server, jobs):
    """What the browser does, checked at the HTTP level: the cookie's attributes, CSRF, logout, bad cookies."""
    with httpx.Client(base_url=server.url, timeout=HTTP_S) as c:
        r = c.get("/jobs")
        assert r.status_code == 303 and r.headers["location"] == "/login?next=/jobs"
        login = c.get("/login")
        csp = login.headers["content-security-policy"]
        assert "default-src 'none'" in csp and "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
        assert c.post("/login", data={"token": "wrong-token-0123456789"}).status_code == 401
        r = c.post("/login", data={"token": TOKEN, "next": "https://elsewhere.example/"})
        assert r.status_code == 303 and r.headers["location"] == "/jobs"  # never sent to another site
        cookie = r.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/" in cookie
        assert TOKEN not in cookie
        assert c.get("/v1/jobs").status_code == 200  # the cookie reads the API
        r = c.post("/v1/jobs", json={"kind": "dedup", "config": {"input": {"paths": ["long"]}}})
        assert r.status_code == 403 and "X-CSRF-Token" in r.json()["detail"]
        page = c.get(f"/jobs/{jobs['finished']['id']}")
        assert page.status_code == 200 and TOKEN not in page.text
        csrf = page.text.split('name="csrf-token" content="')[1].split('"')[0]
        r = c.post("/v1/jobs", json={"kind": "dedup", "config": {"input": {"paths": ["nowhere"]}}},
                   headers={"X-CSRF-Token": csrf})
        assert r.status_code == 422  # past the session check, to the request's own
        assert c.post("/logout", data={"csrf": "wrong"}).status_code == 403
        r = c.post("/logout", data={"csrf": csrf})
        assert r.status_code == 303 and 'corpusmill_session=""' in r.headers["set-cookie"]
    with httpx.Client(base_url=server.url, timeout=HTTP_S, cookies={"corpusmill_session": "1.forged.00"}) as c:
        assert c.get("/v1/jobs").status_code == 401
        assert c.get("/jobs").status_code == 303
    with httpx.Client(base_url=server.url, timeout=HTTP_S) as c:
        assert c.get("/v1/jobs", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200  # the header still works
        assert c.get("/static/page.js").headers["content-type"].startswith("text/javascript")
        script = c.get("/static/page.js").text  # the page writes no markup from strings, anywhere
        assert not any(sink in script for sink in (".innerHTML", ".outerHTML", "insertAdjacentHTML", "document.write"))
        assert c.get("/jobs/0123456789abcdef").status_code == 303
        r = c.get("/login", headers={"Accept-Language": "zh-CN,zh;q=0.9,en;q=0.8"})
        assert '<html lang="zh-CN">' in r.text and "服务令牌" in r.text
