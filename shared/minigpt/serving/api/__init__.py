"""The OpenAI-compatible server's routes (lab 08), one module per endpoint family, as in vLLM's entrypoints:

* `completions` POST /v1/completions          * `chat` POST /v1/chat/completions
* `models` GET /v1/models, /v1/models/{id}    * `health` GET /health, /metrics

Each module holds a FastAPI `APIRouter` whose handlers sit at module level and read the engine and the settings from
`request.app.state.server` (`state.ServerState`). `generation` turns a validated request into engine requests (n
choices, several prompts, admission, disconnects, streaming); `errors` maps failures to OpenAI's error body;
`schema` makes /openapi.json exact. `minigpt.serving.api_server.create_app` assembles them.
"""
