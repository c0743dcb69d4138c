"""GET /v1/models and GET /v1/models/{model} (lab 08): the base model and its LoRA adapters."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request

from minigpt.serving.api.errors import ModelNotFound, _err
from minigpt.serving.api.state import ServerState, server_state
from minigpt.serving.protocol import ModelCard, ModelList

__all__ = ["router"]

router = APIRouter(tags=["models"])


def _card(state: ServerState, name: str, created: int) -> dict:
    root = state.core.model_name
    return {"id": name, "object": "model", "created": created, "owned_by": "minigpt", "root": root,
            "parent": None if name == root else root}


@router.get("/v1/models", response_model=ModelList)
async def list_models(request: Request) -> dict:
    state = server_state(request)
    created = int(time.time())
    return {"object": "list", "data": [_card(state, name, created) for name in state.served_models]}


@router.get("/v1/models/{model}", response_model=ModelCard,
            responses={404: _err("Unknown model (code model_not_found)")})
async def retrieve_model(model: str, request: Request) -> dict:
    state = server_state(request)
    if model not in state.served_models:
        raise ModelNotFound(model, state.served_models)
    return _card(state, model, int(time.time()))
