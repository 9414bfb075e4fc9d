"""Signs in to latchkey's console through a test OpenID Connect issuer in a real browser
(Debian's chromium through Playwright), for tests/it/console_oidc.rs.

Usage: console_oidc_browser.py CONFIG_JSON (the admin URL, the issuer's host and port, the
chromium path, a screenshot path). The issuer's /authorize signs the person in at once and sends
the browser back. Prints `RESULT {json}`: where the browser ended and what the page says.
"""

import json
import sys

from playwright.sync_api import sync_playwright


def main():
    cfg = json.loads(sys.argv[1])
    base = cfg["admin"]
    result = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=cfg["chromium"],
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                f"--host-resolver-rules=MAP {cfg['issuer_host']} 127.0.0.1",
            ],
        )
        # The issuer's certificate is signed by the test's own CA, which this browser does not
        # know; latchkey itself verifies it (--upstream-ca).
        context = browser.new_context(ignore_https_errors=True, viewport={"width": 1280, "height": 700})
        page = context.new_page()
        errors = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.goto(f"{base}/ui/login")
        page.screenshot(path=cfg["shot"], full_page=True)
        page.click("a[href='/ui/oidc/start']")
        page.wait_for_url(f"{base}/ui", timeout=15_000)
        page.wait_for_selector("nav .who", timeout=5_000)
        result["url"] = page.url
        result["who"] = page.locator("nav .who").inner_text()
        result["main"] = page.locator("main").inner_text()
        result["console_errors"] = errors
        context.close()
        browser.close()
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
