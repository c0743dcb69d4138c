"""GET /health (200 while the engine loop runs, else 503) and GET /metrics (Prometheus text) (lab 08)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from minigpt.serving.api.errors import _err, error_response
from minigpt.serving.api.state import server_state
from minigpt.serving.prometheus_metrics import CONTENT_TYPE
from minigpt.serving.protocol import HealthStatus

__all__ = ["router"]

router = APIRouter(tags=["health"])


@router.get("/health", response_model=HealthStatus, responses={503: _err("The engine loop is not running")})
async def health(request: Request) -> Response:
    if not server_state(request).engine.is_running:
        return error_response(503, "the engine loop is not running", "server_error")
    return JSONResponse({"status": "ok"})


@router.get("/metrics", response_class=Response, responses={200: {
    "description": "Prometheus metrics, text exposition format",
    "content": {"text/plain": {"schema": {"type": "string"}}}}})
async def metrics(request: Request) -> Response:
    return Response(server_state(request).metrics.render(), media_type=CONTENT_TYPE)
