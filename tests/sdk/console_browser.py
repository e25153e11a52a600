"""The console in a real browser: Debian's chromium driven through
chromedriver by selenium (tests/sdk/requirements.txt), against a gateway in
front of kvgate-sim instances that tests/http/console.rs started.

Reads its settings as JSON from the KVGATE_CONSOLE environment variable.
To have an instance killed it prints `KILL` and waits for a line on stdin.
Every body it fetches (and every page source the browser shows) is kept and
searched for the configured secrets at the end. Prints `ok …` on success.
"""

import json
import os
import sys
import time
import urllib.error
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

cfg = json.loads(os.environ["KVGATE_CONSOLE"])
BASE = cfg["url"]
bodies = []  # (where, text): everything the console answered
timings = {}


def fetch(path, headers=None, method="GET", data=None, read_for=None):
    """(status, headers, body) of one request; a streaming body is read for `read_for` seconds."""
    req = urllib.request.Request(BASE + path, data=data, method=method, headers=headers or {})
    try:
        resp = urllib.request.urlopen(req, timeout=10)
    except urllib.error.HTTPError as e:
        body = e.read().decode("utf-8", "replace")
        bodies.append((path, body))
        return e.code, e.headers, body
    if read_for:
        end, chunks = time.time() + read_for, []
        while time.time() < end:
            line = resp.fp.readline()
            if not line:
                break
            chunks.append(line.decode("utf-8", "replace"))
        body = "".join(chunks)
        resp.close()
    else:
        body = resp.read().decode("utf-8", "replace")
    bodies.append((path, body))
    return resp.status, resp.headers, body


def chat(key, text, stream=True, system=None):
    body = {
        "model": cfg["model"],
        "max_tokens": 4,
        "stream": stream,
        "messages": [
            {"role": "system", "content": system or cfg["system"]},
            {"role": "user", "content": text},
        ],
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    req = urllib.request.Request(
        BASE + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", "authorization": "Bearer " + key},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            r.read()
            return r.status, body
    except urllib.error.HTTPError as e:
        e.read()
        return e.code, body


def wait_for(what, seconds, f):
    end = time.time() + seconds
    while True:
        try:
            v = f()
            if v:
                return v
        except Exception:  # the DOM is re-rendered each second: retry
            pass
        if time.time() > end:
            raise AssertionError(f"not within {seconds} s: {what}")
        time.sleep(0.05)


def check(cond, what):
    if not cond:
        raise AssertionError(what)


# --- security, without a browser -------------------------------------------
admin = {"authorization": "Bearer " + cfg["admin_token"]}
for path in ["/console", "/console/api/state", "/console/api/events", "/console/api/config", "/console/api/decisions/0"]:
    status, _, _ = fetch(path)
    check(status == 401, f"{path} without the token answered {status}, not 401")
    status, _, _ = fetch(path, {"cookie": "kvgate_console=" + "0" * 64})
    check(status == 401, f"{path} with a wrong cookie answered {status}, not 401")
    status, _, _ = fetch(path, {"authorization": "Bearer " + cfg["keys"]["acme"]})
    check(status == 401, f"{path} with a tenant's key answered {status}, not 401")
status, _, _ = fetch("/console/login", method="POST", data=b"token=wrong", headers={"content-type": "application/x-www-form-urlencoded"})
check(status == 401, f"a wrong login answered {status}")
status, headers, _ = fetch("/console", admin)
check(status == 200, f"/console with the Bearer token answered {status}")
csp = headers.get("content-security-policy", "")
for part in ["default-src 'self'", "script-src 'self'", "object-src 'none'", "frame-ancestors 'none'"]:
    check(part in csp, f"CSP lacks {part!r}: {csp!r}")
check("unsafe-inline" not in csp and "unsafe-eval" not in csp and "http" not in csp, f"CSP allows too much: {csp!r}")

# --- the browser -------------------------------------------------------------
opts = webdriver.ChromeOptions()
opts.binary_location = cfg.get("chromium", "/usr/bin/chromium")
for a in ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1440,900", "--no-proxy-server"]:
    opts.add_argument(a)
opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
driver = webdriver.Chrome(service=Service(cfg.get("chromedriver", "/usr/bin/chromedriver")), options=opts)
driver.set_window_size(1440, 900)
try:
    driver.get(BASE + "/console")
    check("Admin token" in driver.page_source, "the login form is not shown")
    driver.find_element(By.ID, "token").send_keys("not-the-token")
    driver.find_element(By.ID, "sign-in").click()
    wait_for("the refusal", 5, lambda: "not the admin token" in driver.page_source)
    driver.find_element(By.ID, "token").send_keys(cfg["admin_token"])
    driver.find_element(By.ID, "sign-in").click()
    cookie = wait_for("the session cookie", 5, lambda: driver.get_cookie("kvgate_console"))
    check(cookie["httpOnly"] and cookie.get("sameSite") == "Strict", f"cookie flags: {cookie}")
    check(cookie["value"] != cfg["admin_token"], "the cookie holds the token itself")

    # Every instance is listed.
    def rows():
        return {r.get_attribute("data-id"): r.get_attribute("data-health") for r in driver.find_elements(By.CSS_SELECTOR, "tr.instance")}
    listed = wait_for("every instance listed", 5, lambda: rows() if len(rows()) == len(cfg["instances"]) else None)
    check(set(listed) == set(cfg["instances"]), f"listed {listed}, configured {cfg['instances']}")
    check(all(h == "healthy" for h in listed.values()), f"not all healthy at start: {listed}")

    # Some traffic, so the page has something to show.
    for i in range(8):
        other = "You answer questions about the fleet. " * (30 + i % 2 * 10)
        chat(cfg["keys"]["acme"], f"warm-up question {i}", system=other if i % 3 == 0 else None)

    # A request appears in the decisions within 2 s, with instance and reason.
    status, probe_body = chat(cfg["keys"]["probe"], "where does this one go?")
    check(status == 200, f"the probe request answered {status}")
    sent = time.time()

    def probe_row():
        for r in driver.find_elements(By.CSS_SELECTOR, "tr.decision"):
            if r.find_element(By.CSS_SELECTOR, "td.tenant").text == "probe":
                inst = r.find_element(By.CSS_SELECTOR, "td.instance").text
                reason = r.find_element(By.CSS_SELECTOR, "td.reason").text
                if inst in cfg["instances"] and reason:
                    return r, inst, reason
        return None

    row, inst, reason = wait_for("the probe's decision in the list", 2, probe_row)
    timings["decision_shown_s"] = round(time.time() - sent, 3)
    check(reason.split(" ")[0] in ("cold", "cache_hit", "cache_spread", "fallback", "affinity", "overflow", "balance", "failover"), f"reason {reason!r}")
    driver.save_screenshot(os.path.join(cfg["shots"], "console-1440x900.png"))

    # Its explain view names the same winner as POST /admin/explain.
    row.click()
    winner = wait_for("the explain view", 5, lambda: driver.find_element(By.ID, "explain-winner").get_attribute("data-winner"))
    bodies.append(("explain view", driver.find_element(By.ID, "explain-body").text))
    status, _, text = fetch(
        "/admin/explain/v1/chat/completions?tenant=probe",
        {**admin, "content-type": "application/json"},
        method="POST",
        data=json.dumps(probe_body).encode(),
    )
    check(status == 200, f"/admin/explain answered {status}: {text}")
    chosen = json.loads(text)["chosen"]
    check(winner == inst == chosen, f"explain view {winner!r}, list {inst!r}, /admin/explain {chosen!r}")
    driver.save_screenshot(os.path.join(cfg["shots"], "console-explain-1440x900.png"))
    driver.find_element(By.ID, "explain-close").click()

    # A tenant over its limit shows its refusals.
    codes = [chat(cfg["keys"]["tiny"], f"tiny {i}", stream=False)[0] for i in range(4)]
    check(codes.count(429) >= 1, f"the tiny tenant was never refused: {codes}")

    def refusals():
        for r in driver.find_elements(By.CSS_SELECTOR, "tr.tenant"):
            if r.get_attribute("data-id") == "tiny":
                t = r.find_element(By.CSS_SELECTOR, "td.refusals").text
                return t if "requests_per_minute" in t else None
        return None

    shown = wait_for("the tiny tenant's refusals", 3, refusals)
    check(f"requests_per_minute {codes.count(429)}" in shown, f"refusals shown {shown!r} for codes {codes}")

    # Killing an instance turns its row unhealthy within the health-check interval.
    print("KILL", flush=True)
    check(sys.stdin.readline().strip() == "killed", "the harness did not kill the instance")
    killed = time.time()
    budget = cfg["health_ms"] / 1000 * cfg["unhealthy_threshold"] + 1.0 + 0.5  # + one sample + slack
    wait_for(f"{cfg['kill']} unhealthy", budget, lambda: rows().get(cfg["kill"]) == "unhealthy")
    timings["unhealthy_shown_s"] = round(time.time() - killed, 3)

    # The same page at a phone's width.
    driver.set_window_size(390, 844)
    time.sleep(1.2)
    driver.save_screenshot(os.path.join(cfg["shots"], "console-phone-390.png"))
    bodies.append(("page", driver.page_source))

    # The page ran under its CSP: nothing was refused.
    logs = [e["message"] for e in driver.get_log("browser")]
    csp_errors = [m for m in logs if "Content Security Policy" in m or "Refused to" in m]
    check(not csp_errors, f"CSP violations: {csp_errors}")
finally:
    driver.quit()

# --- the data the page uses, read directly, then searched for secrets ----------
session = {"cookie": "kvgate_console=" + cookie["value"]}
for path in ["/console", "/console/api/state", "/console/api/config", "/console/api/decisions/0", "/console/assets/console.js", "/console/assets/console.css"]:
    status, _, _ = fetch(path, session)
    check(status == 200, f"{path} with the session cookie answered {status}")
status, _, events = fetch("/console/api/events", session, read_for=2.5)
check(status == 200 and "event: hello" in events and "event: state" in events, f"the event stream: {status} {events[:200]!r}")
leaks = [(where, s) for where, body in bodies for s in cfg["secrets"] if s in body]
check(not leaks, f"secrets in console answers: {[(w, s[:6] + '…') for w, s in leaks]}")
print("ok", json.dumps({"bodies_searched": len(bodies), **timings}))
