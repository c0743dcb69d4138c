"""/openapi.json is the truth (lab 08): schemathesis drives the app in process (ASGI) from its own schema, with a
fixed, derandomized example budget per operation over a tiny random model, and must find no 5xx and no response
that disagrees with the schema (status code, content type, headers, body). About 20-30 s on a 2-core machine."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import (content_type_conformance, negative_data_rejection, not_a_server_error,
                                 response_headers_conformance, response_schema_conformance, status_code_conformance,
                                 unsupported_method)
from serving_fixtures import tiny_model

from minigpt.serving.api_server import create_app
from minigpt.serving.async_engine import AsyncLLMEngine
from minigpt.serving.engine import EngineConfig, LLMEngine
from minigpt.tokenizer import load_tokenizer

EXAMPLES_PER_OPERATION = 20
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_headers_conformance,
          response_schema_conformance, negative_data_rejection, unsupported_method]



# Built at import, started by the fixture below: the schema is read from the app directly (no request, no engine).
ENGINE = AsyncLLMEngine(LLMEngine(tiny_model(4), EngineConfig(num_blocks=64, block_size=8), tokenizer=load_tokenizer(),
                                  model_name="tiny", adapter_names=("tiny-lora",)), num_threads=1)
APP = create_app(ENGINE, max_queue=64, shutdown_engine=False)
schema = schemathesis.openapi.from_dict(APP.openapi())
schema.app = APP


@pytest.fixture(scope="module", autouse=True)
def running_engine():
    ENGINE.start()
    yield
    ENGINE.shutdown()
    assert ENGINE.stats().num_blocks_used == 0


def test_the_schema_names_the_served_models_and_real_statuses():
    doc = APP.openapi()
    body = doc["components"]["schemas"]["CompletionRequest"]["properties"]["model"]
    assert body["enum"] == ["tiny", "tiny-lora"]
    post = doc["paths"]["/v1/completions"]["post"]["responses"]
    assert set(post) == {"200", "400", "404", "429", "500", "503"}
    assert set(post["200"]["content"]) == {"application/json", "text/event-stream"}
    assert set(doc["paths"]["/metrics"]["get"]["responses"]["200"]["content"]) == {"text/plain"}
    assert "HTTPValidationError" not in doc["components"]["schemas"]


def test_the_schema_publishes_structured_outputs_tools_and_logits_processing():
    """The new fields are in the schema schemathesis generates from (so the test below fuzzes them), bounded as the
    server checks them."""
    schemas = APP.openapi()["components"]["schemas"]
    for name in ("CompletionRequest", "ChatCompletionRequest"):
        props = schemas[name]["properties"]
        assert {"response_format", "presence_penalty", "frequency_penalty", "logit_bias"} <= props.keys(), name
    formats = {ref["$ref"].rsplit("/", 1)[1] for ref in schemas["ChatCompletionRequest"]["properties"]
               ["response_format"]["anyOf"][0]["oneOf"]}
    assert formats == {"ResponseFormatText", "ResponseFormatJSONObject", "ResponseFormatJSONSchema"}
    chat = schemas["ChatCompletionRequest"]
    assert {"tools", "tool_choice", "parallel_tool_calls"} <= chat["properties"].keys()
    assert chat["allOf"][0]["then"]["properties"]["logprobs"] == {"const": True}, "top_logprobs needs logprobs"
    prompt_ids = schemas["CompletionRequest"]["properties"]["prompt"]["anyOf"][2]["items"]
    assert prompt_ids["maximum"] == 4095, "token ids must be bounded by the served vocabulary"
    assert schemas["ChatChoice"]["properties"]["finish_reason"]["enum"] == ["stop", "length", "tool_calls"]


@schema.parametrize()
@settings(max_examples=EXAMPLES_PER_OPERATION, derandomize=True, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
def test_the_server_agrees_with_its_schema(case):
    case.call_and_validate(checks=CHECKS)
