"""Drives latchkey's console in a real browser (Debian's chromium through Playwright), for
tests/it/console_browser.rs.

Usage: console_browser.py CONFIG_JSON. The config names the admin URL, the tokens and the
screenshot directory. The Rust test acts on the proxy side when asked: this script prints
`STEP NAME` and waits for a line on stdin before it goes on. It prints `RESULT {json}` last, and
exits non-zero (with the reason on stderr) when the page does not do what it should.
"""

import json
import sys

from playwright.sync_api import sync_playwright

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def step(name):
    print(f"STEP {name}", flush=True)
    answer = sys.stdin.readline().strip()
    if not answer.startswith("ok"):
        raise SystemExit(f"the test answered {answer!r} to step {name}")
    return answer[2:].strip()


def sign_in(browser, base, token):
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    page = context.new_page()
    page.on("dialog", lambda d: d.accept())
    page.goto(f"{base}/ui/login")
    page.fill("input[name=token]", token)
    with page.expect_navigation():
        page.click("main button[type=submit]")
    if page.url.rstrip("/") != f"{base}/ui":
        raise SystemExit(f"sign-in ended at {page.url}: {page.inner_text('body')}")
    return context, page


def main():
    cfg = json.loads(sys.argv[1])
    base, shots = cfg["admin"], cfg["shots"]
    result = {"pages": {}}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=cfg["chromium"], args=CHROMIUM_ARGS)
        console_errors = []

        # A read-only person: every page, no answer buttons.
        context, page = sign_in(browser, base, cfg["reader"])
        page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
        step("reader-signed-in")
        page.goto(f"{base}/ui/approvals")
        result["reader_approve_buttons"] = page.locator("button", has_text="Approve").count()
        context.close()

        context, page = sign_in(browser, base, cfg["approver"])
        page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
        page.screenshot(path=f"{shots}/console-overview.png", full_page=True)

        # Live traffic: the page is open before the request is made.
        page.goto(f"{base}/ui/traffic")
        page.wait_for_selector("#traffic-state.live", timeout=10_000)
        step("traffic-open")
        row = page.locator("#traffic tr.record", has_text="/v1/items")
        row.first.wait_for(timeout=10_000)
        result["traffic_row"] = row.first.inner_text()
        row.first.click()
        page.wait_for_selector("#traffic tr.detail a", timeout=5_000)
        result["detail"] = page.locator("#traffic tr.detail pre").first.inner_text()
        page.screenshot(path=f"{shots}/console-traffic.png", full_page=True)
        page.click("#traffic tr.detail a")
        page.wait_for_url(f"{base}/ui/explain?*")
        result["explain"] = page.locator("main").inner_text()
        page.screenshot(path=f"{shots}/console-explain.png", full_page=True)

        # Filtering: only denials. An allowed request made first never shows; the denial does.
        page.goto(f"{base}/ui/traffic")
        page.fill("input[name=decision]", "deny")
        with page.expect_navigation():
            page.press("input[name=decision]", "Enter")
        page.wait_for_selector("#traffic-state.live", timeout=10_000)
        step("traffic-filtered-open")
        denied = page.locator("#traffic tr.record", has_text="other.test")
        denied.first.wait_for(timeout=10_000)
        result["filtered_rows"] = page.locator("#traffic tr.record").all_inner_texts()
        result["filtered_url"] = page.url

        # Approvals: approve one parked request, deny another.
        for decision in ["approve", "deny"]:
            approval = step(f"parked-{decision}")
            page.goto(f"{base}/ui/approvals")
            form = page.locator(f"form[action='/ui/approvals/{approval}']").filter(
                has=page.locator(f"input[name=decision][value={decision}]")
            )
            if decision == "approve":
                page.screenshot(path=f"{shots}/console-approvals.png", full_page=True)
            form.locator("input[name=note]").fill(f"{decision}d in the browser test")
            form.locator("button[type=submit]").click()
            page.wait_for_load_state()
            result[f"{decision}_page"] = page.locator("main").inner_text()
            step(f"answered-{decision}")

        # A session with an open tunnel, revoked from its row: the tunnel is cut.
        session = step("session-open")
        page.goto(f"{base}/ui/sessions")
        row = page.locator("tr", has_text=session)
        row.locator("button", has_text="Revoke").click()
        page.wait_for_load_state()
        result["revoke_page"] = page.locator("main").inner_text()
        step("session-revoked")

        # A candidate policy chosen as a file (read into the form by the page's script).
        page.goto(f"{base}/ui/policy")
        page.set_input_files("input[type=file][data-load=candidate]", cfg["candidate_file"])
        page.wait_for_function("document.getElementById('candidate').value.length > 0")
        with page.expect_navigation():
            page.click("form[action='/ui/policy/diff'] button[type=submit]")
        result["diff_page"] = page.locator("main").inner_text()

        for name in ["sessions", "limits", "policy"]:
            page.goto(f"{base}/ui/{name}")
            result["pages"][name] = page.locator("main").inner_text()
            page.screenshot(path=f"{shots}/console-{name}.png", full_page=True)
        result["console_errors"] = console_errors
        context.close()
        browser.close()
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
