"""The status page: a small read-only web page of the cluster, served by the control API at ``/status``.

Three static files (``static/status.{html,js,css}``), no build step: the script calls the JSON routes
(``/v1/nodes``, ``/v1/models``, ``/v1/replicas``, ``/v1/events``, ``/v1/rollouts``, ``/healthz``) every few
seconds and draws nodes and GPUs, models (desired/ready, phase, lag, p99 against the budget), rollouts
(versions, phase, step, stable/new weights, epoch, the last transition at its UTC time), replicas (state,
reason) and the latest events.  Models, nodes and replicas come a page at a time (``?limit=&after=``, 100 rows;
``/status?page=N`` for another size) with buttons to the next and previous pages, and a form filters models and
replicas by model and replicas by state (``?model=``, ``?state=``): a refresh costs a page's rows, not the
cluster's (10,000 models, 30,000 replicas).

How the browser authenticates (WHY a token form and ``sessionStorage``, not a cookie): the files
themselves hold no data and are served to anyone; every number on the page comes from a route that
requires a viewer token in the ``Authorization`` header, exactly as for the CLI.  The user pastes a
token (a viewer token is enough: ``sie token create --name NAME --role viewer``) into the page's form; the script
keeps it in ``sessionStorage`` (gone when the tab closes) and sends it as a bearer header.

- A cookie would be sent by the browser on its own, to every route, from any site: the operator
  routes (POST/DELETE) would need CSRF defences they do not need today.  A bearer header is never
  attached by the browser itself, so the API stays CSRF-free by construction.
- ``?token=`` in a URL lands in the browser's history, shell history, proxy logs and Referer headers.
- What ``sessionStorage`` costs: a script injected into the page could read the token.  So no script
  can be injected: the page's Content-Security-Policy allows only its own script file (no inline code,
  no other origin), and the script writes data into the page only as text (``textContent``), never as
  HTML.  The token is never logged: the API logs only that an unknown token was refused.
"""

# No ``from __future__ import annotations``: FastAPI reads the route functions' annotations as objects.
from collections.abc import Callable
from functools import cache
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import Response

STATIC = Path(__file__).resolve().parent / "static"
FILES = {"": ("status.html", "text/html; charset=utf-8"),
         "/app.js": ("status.js", "text/javascript; charset=utf-8"),
         "/app.css": ("status.css", "text/css; charset=utf-8")}

#: only the page's own files and its own API; no inline script or style, no frames, no forms posting away
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
           "Cache-Control": "no-cache", "X-Frame-Options": "DENY"}

#: ``/status`` and its script and stylesheet; no token needed (no data in them)
router = APIRouter(prefix="/status", include_in_schema=False)


@cache
def _read(name: str) -> bytes:
    return (STATIC / name).read_bytes()


def _serve(name: str, media_type: str) -> Callable[[], Response]:
    def serve() -> Response:
        return Response(_read(name), media_type=media_type, headers=HEADERS)
    return serve


for _suffix, (_name, _media_type) in FILES.items():
    router.add_api_route(_suffix, _serve(_name, _media_type), methods=["GET"])
