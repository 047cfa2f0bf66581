"""`sie status [--screenshot FILE]`: the control plane's status page, or a picture of it taken headless.

The page (``/status``, ``sie.control.api.status_page``) signs in with a token typed into its form and
keeps it in ``sessionStorage``: no token in a URL, no cookie.  A headless capture (a report, a CI artifact,
a README image) would otherwise need a script that types a token into the form.  ``--screenshot`` drives
headless Chromium (Debian's ``/usr/bin/chromium``, through Playwright, which downloads no browser) and
signs the page in without the token ever entering the page or a URL:

1. the page is opened with a placeholder in its ``sessionStorage`` slot, so its script starts signed in;
2. every request the page makes to this control plane is intercepted and its ``Authorization`` header
   replaced by the real token (``SIE_API_TOKEN``, else the local operator token file ``sie control``
   wrote, as for every other command with ``--control-url``); the page's script, and anything that could
   run in the page, only ever sees the placeholder;
3. once the page has drawn the API's data (``body[data-loaded]``), the screenshot is written.  A token the
   API refuses is an error naming the fix, never a picture of the sign-in form.

Exit codes: 0 written; 1 an error (one line: no browser, no Playwright, the API refused or did not answer).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from urllib.parse import urlsplit

import click

from sie.kernel.errors import SieError
from sie.kernel.settings import Settings

#: what the page's own script finds in its sessionStorage slot (``status.js`` TOKEN_KEY): a placeholder,
#: swapped for the real token on the wire only
PLACEHOLDER = "sie_screenshot-placeholder"
TOKEN_KEY = "sie.status.token"
#: a headless Chromium on a server: no sandbox as root, no GPU, nothing phoning home
CHROMIUM_ARGS = ("--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync")


def find_chromium(explicit: str | None) -> str:
    """``--browser``, else ``SIE_CHROMIUM``, else ``chromium``/``chromium-browser`` on the PATH."""
    for candidate in (explicit, os.environ.get("SIE_CHROMIUM"), shutil.which("chromium"),
                      shutil.which("chromium-browser")):
        if candidate:
            if not Path(candidate).is_file():
                raise SieError(f"browser {candidate}: no such file; pass --browser PATH to a Chromium")
            return candidate
    raise SieError("no Chromium found: install it (Debian: apt-get install chromium) or pass --browser PATH")


def capture(url: str, token: str, path: Path, browser_path: str, width: int, height: int, timeout_s: float) -> None:
    """Sign ``url``'s status page in with ``token`` (on the wire only) and write its full-page PNG to ``path``."""
    try:
        from playwright.sync_api import Error as PlaywrightError
        from playwright.sync_api import sync_playwright
    except ImportError:
        raise SieError("--screenshot needs Playwright: pip install 'sie[screenshot]' (it drives the installed "
                       "Chromium; no browser is downloaded)") from None
    base = url.rstrip("/")
    origin = "{0.scheme}://{0.netloc}".format(urlsplit(base))
    refused: list[int] = []

    def authorize(route, request) -> None:  # noqa: ANN001 - Playwright's Route and Request
        if "{0.scheme}://{0.netloc}".format(urlsplit(request.url)) != origin:
            route.abort()  # the page talks to its own control plane only (its CSP says so too)
            return
        headers = dict(request.headers)
        if headers.get("authorization") == f"Bearer {PLACEHOLDER}":
            headers["authorization"] = f"Bearer {token}"
        route.continue_(headers=headers)

    with sync_playwright() as pw:
        try:
            browser = pw.chromium.launch(executable_path=browser_path, args=list(CHROMIUM_ARGS), headless=True)
        except PlaywrightError as exc:
            raise SieError(f"could not start {browser_path} headless: {str(exc).splitlines()[0]}") from None
        try:
            context = browser.new_context(viewport={"width": width, "height": height})
            context.add_init_script(f"sessionStorage.setItem({TOKEN_KEY!r}, {PLACEHOLDER!r});")
            context.route("**/*", authorize)
            page = context.new_page()
            page.on("response", lambda r: refused.append(r.status) if r.status in (401, 403) else None)
            try:
                page.goto(f"{base}/status", timeout=timeout_s * 1000)
                page.wait_for_selector("body[data-loaded=true], #login:not([hidden])", timeout=timeout_s * 1000)
            except PlaywrightError as exc:
                raise SieError(f"the status page at {base}/status did not load within {timeout_s:g}s "
                               f"({str(exc).splitlines()[0]}); check --control-url") from None
            if refused or page.get_attribute("body", "data-loaded") != "true":
                raise SieError(f"the control plane at {base} refused the token (HTTP {refused[0] if refused else 401}):"
                               " set SIE_API_TOKEN to a viewer token (`sie token create --name NAME --role viewer`) "
                               "or run where the operator token file is readable")
            path.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(path), full_page=True)
        finally:
            browser.close()


@click.command("status")
@click.option("--control-url", default="http://127.0.0.1:8470", show_default=True, envvar="SIE_CONTROL_URL",
              help="The control plane whose status page to show (token: SIE_API_TOKEN, else the local operator "
                   "token file).")
@click.option("--screenshot", "screenshot", type=click.Path(dir_okay=False, path_type=Path),
              help="Write a full-page PNG of the status page here, taken with headless Chromium.")
@click.option("--browser", "browser_path", help="Chromium to drive [default: SIE_CHROMIUM, else chromium on PATH].")
@click.option("--width", type=click.IntRange(min=320), default=1500, show_default=True)
@click.option("--height", type=click.IntRange(min=240), default=900, show_default=True)
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=1), default=30.0, show_default=True,
              help="Seconds for the page to load and draw the API's data.")
@click.pass_obj
def command(settings: Settings, control_url: str, screenshot: Path | None, browser_path: str | None, width: int,
            height: int, timeout_s: float) -> None:
    """The status page of a control plane: its address, or (--screenshot FILE) a PNG of it, taken headless."""
    from sie.control.api.auth import client_token

    url = control_url.rstrip("/")
    if screenshot is None:
        click.echo(f"{url}/status  (sign in with a viewer token: sie token create --name NAME --role viewer; "
                   "`sie status --screenshot FILE` takes a picture of it headless)")
        return
    token = client_token(settings)
    if not token:
        raise SieError(f"no token for {url}: set SIE_API_TOKEN (a viewer token is enough) or run where "
                       f"{settings.api_token_file} is readable")
    capture(url, token, screenshot, find_chromium(browser_path), width, height, timeout_s)
    click.echo(f"wrote {screenshot} ({screenshot.stat().st_size} bytes): {url}/status, {width}px wide")
