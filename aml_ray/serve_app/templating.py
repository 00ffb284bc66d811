"""Rendering of the service's HTML pages: one Jinja2 environment and the security headers every page gets.

Pages load only this service's own assets (``/static``); the Content-Security-Policy says so to the
browser (no inline script, no third-party origin), and no page is cached or sends a Referer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.templating import Jinja2Templates
from starlette.responses import HTMLResponse

TEMPLATES_DIR = Path(__file__).resolve().parent / "templates"
STATIC_DIR = Path(__file__).resolve().parent / "static"
templates = Jinja2Templates(directory=str(TEMPLATES_DIR))

#: Content-Security-Policy of the server-rendered pages: own scripts, styles and images only.
PAGE_CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
            "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
#: ``Referrer-Policy: same-origin``: no URL of a page leaves the site, and the pages' own form posts carry
#: their real ``Origin`` (under ``no-referrer`` a browser sends ``Origin: null``, which
#: :mod:`aml_ray.serve_app.origin_check` refuses).
PAGE_HEADERS = {"Cache-Control": "no-store", "Referrer-Policy": "same-origin", "X-Content-Type-Options": "nosniff",
                "Content-Security-Policy": PAGE_CSP}


def render(request: Request, name: str, context: dict[str, Any] | None = None, *,
           status_code: int = 200) -> HTMLResponse:
    """A template as an HTML response with :data:`PAGE_HEADERS`.

    Args:
        request: the request (templates read ``request.url.path`` for the current navigation item).
        name: the template file under ``templates/``.
        context: template variables.
        status_code: the HTTP status (a refused form answers 4xx with the form and its messages).
    """
    response = templates.TemplateResponse(request, name, context or {}, status_code=status_code)
    response.headers.update(PAGE_HEADERS)
    return response
