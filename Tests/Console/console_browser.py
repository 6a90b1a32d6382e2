"""The operator console in a real browser: headless Debian Chromium driven by Selenium.

    console_browser.py ADMIN_URL PUBLIC_URL SMTP_SINK_DIR SCREENSHOT_DIR OPERATOR_EMAIL

Against a running trunk-sync whose mails go to the SMTP sink writing into SMTP_SINK_DIR
(scripts/smtp-sink.py) and whose TRUNK_SYNC_ADMIN_EMAILS holds OPERATOR_EMAIL. Creates an
app user through the public API (sign-in by mailed code, two sessions, events), then in the
browser: a non-operator cannot sign in; the operator signs in with the code from the sink,
sees the overview, finds the user, opens their events (formatted payloads, type filter),
revokes one session (whose token the API then refuses), exports and deletes the user (whose
other token the API then refuses). Then the attacker's side: a user whose name, metadata,
user agent, event types and payloads are HTML and script is shown as text and runs nothing;
the page's Trusted Types refuse HTML from strings; a page of another origin on the same host
(the public listener's, as an app's would be) can neither call the console's API with the
operator's cookie, nor load the admin listener's answers, nor keep a handle on a console
window it opens. Last, a sign-out that does not reach the server says so and keeps the
session; one that does ends it, in every tab of the console. No step may leave an error in the browser's console other
than the refusals it provokes. Prints `ok <step>` per step and writes a screenshot of each page into
SCREENSHOT_DIR.
"""
import base64
import glob
import json
import os
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.support.ui import Select, WebDriverWait

ADMIN, PUBLIC, SINK, SHOTS, OPERATOR = sys.argv[1:6]
MEMBER = f"carol-{uuid.uuid4().hex[:8]}@example.com"
os.makedirs(SHOTS, exist_ok=True)


def step(name):
    print(f"ok {name}", flush=True)


def http(method, url, body=None, token=None, headers=None):
    """(status, parsed JSON or None) of a request to the server."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    for name, value in (headers or {}).items():
        request.add_header(name, value)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            text = response.read()
            return response.status, json.loads(text) if text else None
    except urllib.error.HTTPError as error:
        text = error.read()
        return error.code, json.loads(text) if text else None


def mails_to(address):
    """Bodies of the mails the sink received for `address`, oldest first."""
    bodies = []
    for path in sorted(glob.glob(os.path.join(SINK, "*.json")), key=lambda p: int(os.path.basename(p)[:-5])):
        with open(path, encoding="utf-8") as file:
            record = json.load(file)
        if address in record.get("rcpt_tos", []):
            bodies.append(record["parsed"]["body"])
    return bodies


def code_for(address, count):
    """The code in the `count`-th mail to `address`, waiting for it (at most 15 s)."""
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        bodies = mails_to(address)
        if len(bodies) >= count:
            return re.search(r"\b(\d{6})\b", bodies[count - 1]).group(1)
        time.sleep(0.05)
    raise AssertionError(f"no mail number {count} for {address}")


def app_sign_in(number, email=MEMBER, user_agent=None):
    """A new app session for `email`, by the `number`-th code mailed to it. The server runs
    with a resend interval of 1 s: a 429 is waited out as its Retry-After says."""
    deadline = time.monotonic() + 15
    while True:
        status, _ = http("POST", f"{PUBLIC}/auth/v1/otp", {"email": email})
        if status != 429 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert status == 200, status
    code = code_for(email, number)
    status, session = http("POST", f"{PUBLIC}/auth/v1/verify", {"email": email, "token": code, "type": "email"},
                           headers={"User-Agent": user_agent} if user_agent else None)
    assert status == 200, (status, session)
    return session


def session_id(token):
    payload = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))["session_id"]


# --- An app user, made through the public API -------------------------------------------
first = app_sign_in(1)
second = app_sign_in(2)
token1 = first["access_token"]
token2 = second["access_token"]
assert session_id(token1) != session_id(token2)
user_id = first["user"]["id"]
events = []
for index in range(12):
    kind = "task" if index % 3 == 2 else "note"
    payload = {"index": index, "text": f"event {index}", "tags": ["a", "b"], "nested": {"done": index % 2 == 0}}
    events.append({"client_id": str(uuid.uuid4()), "type": kind, "payload": payload,
                   "client_timestamp": "2026-11-22T04:10:02.123Z"})
status, pushed = http("POST", f"{PUBLIC}/sync/v1/events", {"events": events}, token1)
assert status == 200, (status, pushed)
step("app user created through the API with two sessions and 12 events")

# --- The browser ---------------------------------------------------------------------------
options = webdriver.ChromeOptions()
options.binary_location = "/usr/bin/chromium"
for argument in ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,900",
                 "--disable-gpu", "--no-first-run", "--disable-extensions"]:
    options.add_argument(argument)
options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
options.add_experimental_option("prefs", {"download.default_directory": os.path.abspath(SHOTS),
                                          "download.prompt_for_download": False})
driver = webdriver.Chrome(service=Service(executable_path="/usr/bin/chromedriver"), options=options)
wait = WebDriverWait(driver, 15)


def console_errors(allowed=()):
    """Fails on any error in the browser's console since the last call, except entries that
    contain one of `allowed` (requests the test made fail on purpose)."""
    entries = driver.get_log("browser")
    errors = [e for e in entries if e["level"] in ("SEVERE", "ERROR")
              and not any(text in e["message"] for text in allowed)]
    assert not errors, f"browser console errors: {errors}"
    return entries


def shot(name):
    height = driver.execute_script("return Math.max(document.body.scrollHeight, 900)")
    driver.set_window_size(1280, min(height + 40, 4000))
    driver.save_screenshot(os.path.join(SHOTS, f"{name}.png"))
    driver.set_window_size(1280, 900)


def find(css):
    return wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, css)))


def visible(css):
    return wait.until(EC.visibility_of_element_located((By.CSS_SELECTOR, css)))


def text_in(css, text):
    wait.until(EC.text_to_be_present_in_element((By.CSS_SELECTOR, css), text))


def clickable(css):
    return wait.until(EC.element_to_be_clickable((By.CSS_SELECTOR, css)))


def console_cookie():
    """The console's cookie as the browser holds it (its Path is /admin/v1, so the page's
    own cookie list, /console/, would not show it)."""
    cookies = driver.execute_cdp_cmd("Network.getAllCookies", {})["cookies"]
    return [c for c in cookies if c["name"] == "trunk_sync_console"]


try:
    driver.get(f"{ADMIN}/console/")
    email = visible("#email-form input[type=email]")
    assert email.get_attribute("name") == "email"
    assert find("#email-form button[type=submit]")
    code_input = find("#code-form input[autocomplete=one-time-code]")
    assert find("#code-form button[type=submit]")
    shot("01-sign-in")
    console_errors()
    step("sign-in page: email and one-time-code forms")

    # A non-operator (an app user) gets the same neutral answer, no mail and no session.
    mails_before = len(mails_to(MEMBER))
    email.send_keys(MEMBER)
    clickable("#email-form button").click()
    text_in("#sign-in .status", "If this address may use the console")
    visible("#code-form")
    code_input.send_keys("000000")
    clickable("#code-form button").click()
    text_in("#sign-in .status", "wrong or has expired")
    assert not console_cookie(), "no session"
    assert driver.find_element(By.ID, "nav").get_attribute("hidden") is not None
    # The refused code is the one expected failure in the log (the browser reports the 403).
    console_errors(allowed=("/admin/v1/auth/verify - Failed to load resource: the server responded with a status of 403",))
    step("a non-operator cannot sign in")

    # The operator signs in with the code read from the SMTP sink.
    driver.get(f"{ADMIN}/console/")
    email = visible("#email-form input[type=email]")
    email.send_keys(OPERATOR)
    clickable("#email-form button").click()
    visible("#code-form")
    find("#code-form input").send_keys(code_for(OPERATOR, 1))
    # Asked for earlier, the non-operator's code would have been mailed by now: none was.
    assert len(mails_to(MEMBER)) == mails_before, "no console code is mailed to a non-operator"
    clickable("#code-form button").click()
    visible("#nav")
    text_in("#who", OPERATOR)
    cookie = console_cookie()
    assert cookie and cookie[0]["httpOnly"] and cookie[0]["sameSite"] == "Strict" and cookie[0]["path"] == "/admin/v1", cookie
    assert driver.execute_script("return document.cookie").find("trunk_sync_console") < 0, "HttpOnly"
    step("operator signed in with the mailed code")

    # Overview, refreshed live: requests/s appear with the second sample.
    text_in("#card-users .value", "1")
    text_in("#card-events .value", "12")
    # The card is drawn anew at each refresh: an element found just before one is stale.
    WebDriverWait(driver, 20, ignored_exceptions=[StaleElementReferenceException]).until(
        lambda d: re.fullmatch(r"\d+\.\d\d", d.find_element(By.CSS_SELECTOR, "#card-rps .value").text) is not None)
    text_in("#card-schema .detail", "no migration pending")
    step("overview with live figures")

    # Charts: one bar pair (requests, 5xx) per minute the API reports, one bar per day of 30,
    # today's carrying the 12 events pushed; axes labelled.
    token = cookie[0]["value"]
    status, overview = http("GET", f"{ADMIN}/admin/v1/overview", token=token)
    assert status == 200, (status, overview)
    def chart_bars(d):
        return (len(d.find_elements(By.CSS_SELECTOR, "#requests-chart rect.bar.requests")),
                len(d.find_elements(By.CSS_SELECTOR, "#requests-chart rect.bar.errors")),
                len(d.find_elements(By.CSS_SELECTOR, "#events-chart rect.bar.events")))
    minutes = len(overview["requests_per_minute"])
    # The page refreshes every 5 s: a minute may have begun since the API answered.
    WebDriverWait(driver, 20).until(lambda d: chart_bars(d)[0] in (minutes, minutes + 1) and chart_bars(d)[2] == 30)
    requests_bars, error_bars, day_bars = chart_bars(driver)
    assert requests_bars == error_bars, (requests_bars, error_bars)
    heights = driver.execute_script(
        "return [...document.querySelectorAll('#events-chart rect.bar')].map((r) => r.getBBox().height)")
    assert heights[-1] > 0 and all(h == 0 for h in heights[:-1]), heights
    assert any(driver.execute_script(
        "return [...document.querySelectorAll('#requests-chart rect.bar.requests')].map((r) => r.getBBox().height)")), \
        "some request counted"
    # Read in one script: the chart is drawn anew every 5 s, and an element found before
    # that is stale.
    axis = driver.execute_script(
        "return [...document.querySelectorAll('#events-chart text.axis')].map((t) => t.textContent)")
    assert "0" in axis and overview["events_per_day"][-1]["day"][5:] in axis, axis
    assert driver.find_element(By.CSS_SELECTOR, "#requests-chart").get_attribute("role") == "img"
    text_in("#card-schema .value", overview["schema_version"].split("_")[0])
    shot("02-overview")
    console_errors()
    step("overview charts: requests per minute, events per day")

    # Users: search, then the user's page.
    clickable("#nav a[data-view=users]").click()
    find("#user-table")
    search = visible("#user-search")
    search.clear()
    search.send_keys(MEMBER.split("@")[0])
    clickable("#user-search-form button").click()
    link = wait.until(EC.element_to_be_clickable((By.LINK_TEXT, MEMBER)))
    rows = driver.find_elements(By.CSS_SELECTOR, "#user-table tbody tr")
    assert len(rows) == 1, len(rows)
    assert "12" in rows[0].text
    shot("03-users")
    link.click()
    text_in("#user-email", MEMBER)
    text_in("#profile-events", "12")
    articles = wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#event-list article.event"))
    assert len(articles) == 12, len(articles)
    assert articles[0].get_attribute("data-seq") == "12", "newest first"
    payload = articles[0].find_element(By.CSS_SELECTOR, "pre.json").text
    assert payload.startswith("{\n  \"") and "\n    \"a\",\n" in payload, payload  # formatted, indented JSON
    assert json.loads(payload)["index"] == 11 and json.loads(payload)["nested"] == {"done": False}, payload
    step("found the user and opened their events")

    # Type filter.
    Select(find("#event-type")).select_by_value("task")
    clickable("#event-filter button").click()
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#event-list article.event")) == 4)
    kinds = {a.find_element(By.CSS_SELECTOR, ".tag").text for a in driver.find_elements(By.CSS_SELECTOR, "#event-list article.event")}
    assert kinds == {"task"}, kinds
    driver.save_screenshot(os.path.join(SHOTS, "04-user-top.png"))  # the first screen only (README)
    shot("04-user")
    console_errors()
    step("events filtered by type")

    # Revoke the session: its token is refused by the API at once.
    assert http("GET", f"{PUBLIC}/sync/v1/events?after=0", token=token1)[0] == 200
    clickable(f"button.revoke[data-session='{session_id(token1)}']").click()
    text_in("#user-status", "revoked")
    wait.until(lambda d: not d.find_elements(By.CSS_SELECTOR, f"button.revoke[data-session='{session_id(token1)}']"))
    status, body = http("GET", f"{PUBLIC}/sync/v1/events?after=0", token=token1)
    assert status == 401, (status, body)
    console_errors()
    step("revoked a session and its token is refused")

    # Export. First one whose end line is lost on the way, where the break does not show (a
    # proxy that passes on what it got and closes the connection): refused, nothing saved.
    download = os.path.join(SHOTS, f"trunk-sync-{user_id}.jsonl")
    driver.execute_script("""
        const real = window.fetch;
        window.fetch = async (url, init) => {
          const response = await real(url, init);
          if (!String(url).endsWith('/export')) return response;
          window.fetch = real;
          const lines = (await response.text()).split('\\n');
          return new Response(lines.slice(0, -2).join('\\n') + '\\n', { status: 200, headers: response.headers });
        };""")
    clickable("#export").click()
    text_in("#user-status", "The export is incomplete (it has no end line); nothing was saved.")
    assert not os.path.exists(download), download
    step("an export cut short where the break did not show is refused, nothing saved")
    clickable("#export").click()
    text_in("#user-status", "Exported the account and 12 event(s)")
    deadline = time.monotonic() + 10
    while not os.path.exists(download) and time.monotonic() < deadline:
        time.sleep(0.05)
    with open(download, encoding="utf-8") as file:
        exported = [json.loads(line) for line in file if line.strip()]
    assert exported[0]["kind"] == "account", exported[0]
    assert [event["seq"] for event in exported[1:-1]] == list(range(1, 13)), exported
    assert exported[-1] == {"kind": "end", "events": 12, "last_seq": 12}, exported[-1]
    os.remove(download)
    console_errors()
    step("exported the user's events")

    # Delete, after typing the address again: the user's other session ends too.
    status, _ = http("POST", f"{PUBLIC}/auth/v1/token?grant_type=refresh_token", {"refresh_token": first["refresh_token"]})
    assert status == 400, "the revoked session's refresh token is dead too"
    assert http("GET", f"{PUBLIC}/sync/v1/events?after=0", token=token2)[0] == 200
    clickable("#delete").click()
    confirm = visible("#confirm-email")
    confirm.send_keys("someone-else@example.com")
    assert not driver.find_element(By.ID, "confirm-delete").is_enabled()
    confirm.clear()
    confirm.send_keys(MEMBER)
    clickable("#confirm-delete").click()
    text_in("#users", f"Deleted {MEMBER} with 12 event(s).")
    status, _ = http("GET", f"{PUBLIC}/sync/v1/events?after=0", token=token2)
    assert status == 401, "deleting the user revoked their other session"
    search = visible("#user-search")
    search.send_keys(MEMBER.split("@")[0])
    clickable("#user-search-form button").click()
    visible("#no-users")
    shot("05-deleted")
    console_errors()
    step("deleted the user")

    # With the only user's events gone, the events chart says so instead of drawing bars.
    clickable("#nav a[data-view=overview]").click()
    text_in("#events-chart text.empty", "No events in the last 30 days")
    assert not driver.find_elements(By.CSS_SELECTOR, "#events-chart rect.bar"), "no bars"
    assert driver.find_elements(By.CSS_SELECTOR, "#requests-chart rect.bar.requests"), "requests still drawn"
    shot("06-overview-empty")
    console_errors()
    step("overview charts: empty state")

    # --- The attacker's side ------------------------------------------------------------
    # A user whose every field the console shows is markup or script: each would set
    # window.__xss if the page ever parsed it. Made through the public API, as any app user can.
    hostile_email = f"o'hara&co=1-{uuid.uuid4().hex[:8]}@example.com"
    hostile_agent = '<img src=x onerror="window.__xss=\'agent\'">'
    hostile_session = app_sign_in(1, hostile_email, user_agent=hostile_agent)
    hostile_token = hostile_session["access_token"]
    hostile_id = hostile_session["user"]["id"]
    hostile_name = '<img src=x onerror="window.__xss=\'name\'">"><script>window.__xss=\'name2\'</script>'
    metadata = {"full_name": hostile_name, "bio": "</pre><svg onload=\"window.__xss='bio'\"></svg>",
                "website": "javascript:window.__xss='link'",
                "<b onmouseover=\"window.__xss='key'\">key</b>": "'><iframe srcdoc=\"<script>parent.__xss='frame'</script>\">",
                "spreadsheet": "=HYPERLINK(\"http://evil.example\",\"x\")"}
    status, body = http("PUT", f"{PUBLIC}/auth/v1/user", {"data": metadata}, hostile_token)
    assert status == 200, (status, body)
    hostile_type = '<img src=x onerror="window.__xss=\'type\'">'
    hostile_payload = {"html": "</pre><script>window.__xss='payload'</script>",
                       "<img src=x onerror=\"window.__xss='payload-key'\">": ["\"><svg onload=\"window.__xss='nested'\">"],
                       "formula": "=cmd|' /C calc'!A0"}
    status, pushed = http("POST", f"{PUBLIC}/sync/v1/events", {"events": [
        {"client_id": str(uuid.uuid4()), "type": hostile_type, "payload": hostile_payload,
         "client_timestamp": "2026-11-22T04:10:02.123Z"}]}, hostile_token)
    assert status == 200, (status, pushed)

    def nothing_ran():
        assert driver.execute_script("return window.__xss") is None, driver.execute_script("return window.__xss")
        counts = driver.execute_script("""return {
            img: document.querySelectorAll('img').length, script: document.scripts.length,
            svg: document.querySelectorAll('main svg').length, iframe: document.querySelectorAll('iframe').length,
            b: document.querySelectorAll('b').length}""")
        # The brand icon and the page's one module; no element made from data.
        assert counts == {"img": 1, "script": 1, "svg": 0, "iframe": 0, "b": 0}, counts

    # A search for markup: shown back as text.
    hostile_search = '<img src=x onerror="window.__xss=\'search\'">'
    driver.get(f"{ADMIN}/console/#/users?" + urllib.parse.urlencode({"q": hostile_search}))
    text_in("#no-users", hostile_search)
    nothing_ran()
    search = visible("#user-search")
    assert search.get_attribute("value") == hostile_search
    search.clear()
    search.send_keys("o'hara&co")
    clickable("#user-search-form button").click()
    link = wait.until(EC.element_to_be_clickable((By.LINK_TEXT, hostile_email)))
    assert link.get_attribute("href").endswith(f"#/users/{hostile_id}"), link.get_attribute("href")
    link.click()
    text_in("#user-email", hostile_email)
    find("#session-table td.agent")
    articles = wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#event-list article.event"))
    assert len(articles) == 1, len(articles)
    profile = {dt.text: dd for dt, dd in zip(driver.find_elements(By.CSS_SELECTOR, "dl.profile dt"),
                                             driver.find_elements(By.CSS_SELECTOR, "dl.profile dd"))}
    assert profile["Name"].text == hostile_name, profile["Name"].text
    shown_metadata = json.loads(profile["User metadata"].find_element(By.CSS_SELECTOR, "pre").text)
    assert all(shown_metadata.get(key) == value for key, value in metadata.items()), shown_metadata
    assert driver.find_element(By.CSS_SELECTOR, "#session-table td.agent").text == hostile_agent
    assert articles[0].find_element(By.CSS_SELECTOR, ".tag").text == hostile_type
    assert json.loads(articles[0].find_element(By.CSS_SELECTOR, "pre.json").text) == hostile_payload
    options = [o.get_attribute("value") for o in driver.find_elements(By.CSS_SELECTOR, "#event-type option")]
    assert options == ["", hostile_type], options
    Select(find("#event-type")).select_by_index(1)  # its value is the markup: no CSS selector for it
    clickable("#event-filter button").click()
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#event-list article.event")) == 1)
    clickable("#delete").click()
    text_in("#delete-form", f"This deletes {hostile_email},")
    nothing_ran()
    shot("07-hostile-user")
    console_errors()
    step("markup in a user's data shows as text and runs nothing")

    # A link into the console names a user by id and nothing else: a dot segment would make the
    # page request another path (/admin/v1/users/.. is /admin/v1/), a bad escape would throw.
    for bad in ["..", "%2E%2E", "%E0%A4%A", "not-a-user", f"{hostile_id}%2F..", f"{hostile_id}x"]:
        driver.get(f"{ADMIN}/console/#/users")
        find("#users")
        driver.get(f"{ADMIN}/console/#/users/{bad}")
        text_in("#main h1", "Not found")
    driver.get(f"{ADMIN}/console/#/users/{hostile_id.upper()}")
    text_in("#user-email", hostile_email)
    console_errors()
    step("a link with anything but a user id opens nothing")

    # The browser itself holds the page to building from text: HTML from a string is refused.
    refused = driver.execute_script("""
        const sinks = {
          innerHTML: () => { document.getElementById('main').innerHTML = '<img src=x>'; },
          insertAdjacentHTML: () => document.body.insertAdjacentHTML('beforeend', '<img src=x>'),
          scriptText: () => { document.createElement('script').text = 'window.__xss = 1'; },
        };
        return Object.fromEntries(Object.entries(sinks).map(([name, sink]) => {
          try { sink(); return [name, 'accepted']; } catch (error) { return [name, error.name]; }
        }));""")
    assert refused == {"innerHTML": "TypeError", "insertAdjacentHTML": "TypeError", "scriptText": "TypeError"}, refused
    nothing_ran()
    console_errors(allowed=("TrustedHTML", "TrustedScript", "Trusted Type"))
    step("trusted types refuse HTML from strings")

    # Another origin on the same host: the public listener's (an app's page, which
    # TRUNK_SYNC_CORS_ORIGINS may name). Same site, so the browser sends the SameSite=Strict
    # cookie along: what keeps it out is the Origin check, the console's header and CORS.
    token = console_cookie()[0]["value"]
    driver.get(f"{PUBLIC}/healthz")
    outcome = driver.execute_async_script("""
        const [admin, id, email, done] = arguments;
        const outcome = {};
        const attempt = async (name, request) => {
          try { const r = await request(); outcome[name] = `answered ${r.type} ${r.status}`; }
          catch (error) { outcome[name] = 'refused'; }
        };
        (async () => {
          await attempt('read users', () => fetch(admin + '/admin/v1/users',
            { credentials: 'include', headers: { 'X-Trunk-Sync-Console': '1' } }));
          await attempt('delete user', () => fetch(admin + '/admin/v1/users/' + id, { method: 'DELETE',
            credentials: 'include', headers: { 'X-Trunk-Sync-Console': '1', 'Content-Type': 'application/json' },
            body: JSON.stringify({ confirm_email: email }) }));
          await attempt('sign out (no-cors)', () => fetch(admin + '/admin/v1/auth/logout',
            { method: 'POST', mode: 'no-cors', credentials: 'include', body: '{}' }));
          await attempt('load a console file (no-cors)', () => fetch(admin + '/console/icon.svg',
            { mode: 'no-cors', credentials: 'include' }));
          await attempt('load metrics (no-cors)', () => fetch(admin + '/metrics', { mode: 'no-cors' }));
          const image = new Image();
          image.src = admin + '/console/icon.svg';
          outcome['image'] = await new Promise((resolve) => {
            image.onload = () => resolve('loaded');
            image.onerror = () => resolve('refused');
          });
          done(outcome);
        })();""", ADMIN, hostile_id, hostile_email)
    # The no-cors sign-out is sent, cookie and all, and refused by the server for its Origin;
    # its answer (as every admin answer, Cross-Origin-Resource-Policy) is not even handed over.
    assert outcome == {"read users": "refused", "delete user": "refused", "sign out (no-cors)": "refused",
                       "load a console file (no-cors)": "refused", "load metrics (no-cors)": "refused",
                       "image": "refused"}, outcome
    # The session and the user are untouched.
    status, state = http("GET", f"{ADMIN}/admin/v1/session", token=token)
    assert status == 200 and state["signed_in"], (status, state)
    assert http("GET", f"{ADMIN}/admin/v1/users/{hostile_id}", token=token)[0] == 200
    # A console window it opens is out of its reach (Cross-Origin-Opener-Policy): its handle
    # reads as closed once the console loaded.
    main_window = driver.current_window_handle
    driver.execute_script("window.console_window = window.open(arguments[0] + '/console/')", ADMIN)
    WebDriverWait(driver, 15).until(lambda d: len(d.window_handles) == 2)
    popup = [handle for handle in driver.window_handles if handle != main_window][0]
    driver.switch_to.window(popup)
    visible("#nav")
    driver.switch_to.window(main_window)
    WebDriverWait(driver, 15).until(lambda d: d.execute_script("return window.console_window.closed"))
    driver.switch_to.window(popup)
    driver.close()
    driver.switch_to.window(main_window)
    console_errors(allowed=("CORS policy", "ERR_BLOCKED_BY_RESPONSE", "ERR_FAILED", "status of 403",
                            "favicon.ico"))
    step("another origin cannot use the console or load its answers")

    # A sign-out that cannot reach the server: the page says so, stays signed in, keeps the
    # cookie; the session is live.
    driver.get(f"{ADMIN}/console/")
    visible("#nav")
    driver.execute_cdp_cmd("Network.enable", {})
    driver.execute_cdp_cmd("Network.setBlockedURLs", {"urls": ["*/admin/v1/auth/logout"]})
    clickable("#sign-out").click()
    text_in("#sign-out-failed", "Not signed out")
    assert driver.find_element(By.ID, "nav").is_displayed() and console_cookie()
    assert http("GET", f"{ADMIN}/admin/v1/session", token=token)[1]["signed_in"]
    driver.execute_cdp_cmd("Network.setBlockedURLs", {"urls": []})
    console_errors(allowed=("ERR_BLOCKED_BY_CLIENT",))
    step("a sign-out that fails says so and keeps the session")

    # A second tab shows the hostile user; signing out in the first signs it out too.
    first_tab = driver.current_window_handle
    driver.switch_to.new_window("tab")
    second_tab = driver.current_window_handle
    driver.get(f"{ADMIN}/console/#/users/{hostile_id}")
    text_in("#user-email", hostile_email)
    driver.switch_to.window(first_tab)
    clickable("#sign-out").click()
    visible("#email-form")
    driver.switch_to.window(second_tab)
    visible("#email-form")
    assert hostile_email not in driver.find_element(By.TAG_NAME, "body").text
    console_errors()
    driver.close()
    driver.switch_to.window(first_tab)
    assert not console_cookie()
    status, _ = http("GET", f"{ADMIN}/admin/v1/overview", token=token)
    assert status == 401, "the session ended on the server"
    page_text = driver.find_element(By.TAG_NAME, "body").text
    assert OPERATOR not in page_text and hostile_email not in page_text, page_text
    console_errors()
    step("signed out, in every tab")
except BaseException:
    shot("failure")
    print("page at failure:", driver.current_url, driver.find_element(By.TAG_NAME, "body").text, file=sys.stderr)
    print("browser log:", driver.get_log("browser"), file=sys.stderr)
    raise
finally:
    driver.quit()
step("no console errors")
