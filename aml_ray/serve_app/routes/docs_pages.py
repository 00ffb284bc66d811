"""Reading pages: the user guide, the API guide, the API reference (``/docs``, ``/redoc``) and the
benchmark-proposal form.

``/docs`` (Swagger UI) and ``/redoc`` load their scripts and styles from this service
(``/static/docs/``: the files the ``fastapi-offline`` package ships), never from a CDN, so they work on
a network without Internet access; the app is created with FastAPI's own CDN pages switched off.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from aml_ray.serve_app.deps import ServiceDep, SessionDep
from aml_ray.serve_app.page_forms import refusal_messages
from aml_ray.serve_app.schemas import Track
from aml_ray.serve_app.text_fields import Line, Text
from aml_ray.serve_app.templating import render
from aml_ray.store.proposals import create_proposal

router = APIRouter(tags=["pages"], include_in_schema=False)
#: Where the app mounts the ``fastapi_offline`` package's static files.
DOCS_STATIC = "/static/docs"
#: The reference pages may load nothing from another origin (ReDoc's sidebar would fetch its logo from
#: its CDN: the browser blocks it); their inline start-up script and styles are allowed.
DOCS_CSP = ("default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
            "img-src 'self' data:; font-src 'self' data:; worker-src 'self' blob:; connect-src 'self'; "
            "frame-ancestors 'none'; base-uri 'none'")


def _local_only(response: HTMLResponse) -> HTMLResponse:
    response.headers["Content-Security-Policy"] = DOCS_CSP
    return response


@router.get("/docs", response_class=HTMLResponse)
def swagger_ui(request: Request) -> HTMLResponse:
    """Swagger UI over ``/openapi.json``, with its assets served locally."""
    return _local_only(get_swagger_ui_html(openapi_url="/openapi.json", title=f"{request.app.title} - API reference",
                               swagger_js_url=f"{DOCS_STATIC}/swagger-ui-bundle.js",
                               swagger_css_url=f"{DOCS_STATIC}/swagger-ui.css",
                               swagger_favicon_url=f"{DOCS_STATIC}/favicon.png",
                               swagger_ui_parameters={"validatorUrl": None}))


@router.get("/redoc", response_class=HTMLResponse)
def redoc(request: Request) -> HTMLResponse:
    """ReDoc over ``/openapi.json``, with its script served locally and no web fonts."""
    return _local_only(get_redoc_html(openapi_url="/openapi.json", title=f"{request.app.title} - API reference",
                          redoc_js_url=f"{DOCS_STATIC}/redoc.standalone.js", redoc_favicon_url=f"{DOCS_STATIC}/favicon.png",
                          with_google_fonts=False))


@router.get("/guide", response_class=HTMLResponse)
def user_guide(request: Request) -> HTMLResponse:
    """User documentation: workflow, modes and quotas, checklist, security, results and publication."""
    return render(request, "guide.html")


@router.get("/guide/api", response_class=HTMLResponse)
def api_guide(request: Request) -> HTMLResponse:
    """The Add / Search API guide: requests, responses, errors and retries, and the platform's own API."""
    return render(request, "api_guide.html")


class ProposalIn(BaseModel):
    """A benchmark proposal (seed: task, provenance, package and license; dataset context, evaluation goal)."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)
    contact_name: Line = Field(min_length=1, max_length=200)
    contact_email: Line = Field(min_length=3, max_length=320, pattern=r"^[^@\s]+@[^@\s]+$")
    benchmark_name: Line = Field(min_length=1, max_length=200)
    track: Track
    task: Text = Field(min_length=1, max_length=10_000)
    dataset_context: Text = Field(min_length=1, max_length=10_000)
    evaluation_goal: Text = Field(min_length=1, max_length=10_000)
    metrics: Text = Field(min_length=1, max_length=10_000)
    provenance: Text = Field(min_length=1, max_length=10_000)
    source_url: Line = Field(min_length=8, max_length=500, pattern=r"^https?://\S+$")
    package: Text = Field(min_length=1, max_length=10_000)
    license: Line = Field(min_length=1, max_length=200)


PROPOSAL_FIELDS = tuple(ProposalIn.model_fields)


@router.get("/benchmarks/propose", response_class=HTMLResponse)
def propose_page(request: Request) -> HTMLResponse:
    """The benchmark-proposal form."""
    return render(request, "propose.html", {"form": {}})


@router.post("/benchmarks/propose", response_class=HTMLResponse)
async def propose_submit(request: Request, session: SessionDep, service: ServiceDep) -> Response:
    """Store a proposal for the admins (``/admin/proposals``); 422 lists each missing or malformed field."""
    form = await request.form()
    values = {name: str(form.get(name) or "")[:10_000] for name in PROPOSAL_FIELDS}
    try:
        proposal = ProposalIn.model_validate({k: v for k, v in values.items() if v.strip()})
    except ValidationError as exc:
        status_code, messages = refusal_messages(exc)
        return render(request, "propose.html", {"form": values, "messages": messages}, status_code=status_code)
    row = create_proposal(session, proposal.model_dump())
    session.commit()
    return render(request, "propose.html", {"form": {}, "created": row}, status_code=201)
