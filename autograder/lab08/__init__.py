"""Checks for Lab 08: a serving engine behind an OpenAI-compatible server, load-tested.

Each check runs the learner's function on small scripted cases, then (where the piece lives in a server) inside the
reference server: an in-thread uvicorn server on a free loopback port (`minigpt.serving.launch.serve_in_thread`) over
a tiny seeded random model, driven with the official `openai` client and raw HTTP (httpx), and stopped (thread
joined) at the end. Checks that run coroutines work from plain Python and from a Jupyter kernel (whose event loop is
already running) alike. Every check first refuses the package's reference handed in as the answer (the function
itself, code from the package, a thin wrapper that calls it while the check runs, also in the engine's and the
server's threads: autograder.checking.reference_guard).

Server (exercises 1 and 2; streaming.py, admission.py):
    check_sse_stream(sse_stream)   events are `data: <json>\n\n`, one per chunk, then `data: [DONE]\n\n`; the
                                   request is aborted if the stream stops early (consumer closed or task cancelled);
                                   through the server: the openai client's streamed completions and chats concatenate
                                   to the non-streamed text (greedy), the raw stream ends with [DONE], and a client
                                   that disconnects mid-stream frees every KV block (read from /metrics); an engine
                                   failure mid-stream is not ended with a clean [DONE] (the error propagates) and
                                   aborts the request
    check_admission(admitted)      refuses at once with QueueFull(retry_after) when every slot is taken, never admits
                                   past the capacity, gives the slot back on exit (also on error); through the server:
                                   with the engine paused and the queue full the next request gets 429 + Retry-After
                                   quickly, and after resuming everything admitted completes and slots are released
Load testing and routing (exercises 3 and 5, goodput.py, routing.py; no model):
    check_goodput(goodput_fn)        goodput_fn(records, ttft_limit, tpot_limit) -> requests/s meeting BOTH limits
                                     over the benchmark's duration (max end - min send, all records); failed never count
    check_route(route_fn)            route_fn(prompt_token_ids, replicas, *, block_size, prefix_blocks) -> replica:
                                     prefix affinity, every token of the first blocks matters, short prompts,
                                     spread, consistent hashing (removing / adding a replica moves only its keys;
                                     a ring placed by index is told so, a modulo is told so), independent of the
                                     replica list's order, and of the process: the same routes with Python's hash()
                                     salted differently (a ring from hash() would move every key on a restart)
    check_router(route_fn)           the learner's function inside the router (minigpt.serving.router) in front of
                                     two fake replicas on loopback: who served each request of a shared-prefix mix
Multi-LoRA (exercise 4, lora.py):
    check_lora_delta(lora_delta_fn)    the batched LoRA matmul on mixed batches equals MERGING each row's adapter
                                       into the weight (W + s B_a A_a) and running the row alone; -1 = no adapter;
                                       inputs untouched; no Python loop over rows (torch calls do not grow with N)
    check_lora_engine(lora_delta_fn)   the learner's function inside the engine: one packed step serves requests of
                                       different adapters; each greedy output equals generating with its adapter merged
    check_lora_server(lora_delta_fn)   the same behind the OpenAI-compatible server: the `model` field names the
                                       adapter (openai client, concurrent requests); an unknown adapter gets 404
                                       (model_not_found, as OpenAI answers)
Interview questions:
    the gateway (gateway_questions.py): check_q_gateway_replicas (answer_q1(goodput, throughput) per replica -> replicas =
                 ceil(rate / (goodput * utilization)), asked on figures the check draws),
                 check_q_affinity_pays (which workloads of AFFINITY_SCENARIOS prefix-aware routing helps)
    100 LoRA adapters (lora_questions.py): check_q1_adapter_mib, check_q2_hundred_adapters_share, check_q5_gather_mib (the
                 bytes exercise 4's per-row gather copies in a step, against a kernel reading each adapter once)
Shared (common.py): the tiny check model, the reference server in a thread (check_server), waits and guards.

Judged (autograder/judging/judge.py: the learner's functions arrive as wire.Remote handles), every verdict is decided here:
exercises 1 and 2 run their scripted cases and their live server where the learner's function lives (the kernel;
common.observe_where) and get back only what happened, as data; lora_delta's torch calls are counted there too, and
route's salted-hash case runs there (a salt changed in the judge would not reach the kernel's hash()). The LoRA
engine, the LoRA server and the router run here and call the judged function from their threads one call at a time
(common.one_call_at_a_time). No check runs @in_kernel.
"""

from autograder.lab08.admission import _check_admission_server, check_admission
from autograder.lab08.common import CHECK_CONFIG, MODEL_NAME, check_server
from autograder.lab08.gateway_questions import AFFINITY_SCENARIOS, check_q_affinity_pays, check_q_gateway_replicas
from autograder.lab08.goodput import check_goodput, goodput_cases
from autograder.lab08.lora import (SMALL_CONFIG, check_lora_delta, check_lora_engine, check_lora_server,
                                   count_torch_calls, served_lora_model, small_model)
from autograder.lab08.lora_questions import (Q_PRESET, Q_RANK, check_q1_adapter_mib, check_q2_hundred_adapters_share,
                                             check_q5_gather_mib)
from autograder.lab08.routing import REPLICAS4, check_route, check_router
from autograder.lab08.streaming import _check_sse_server, check_sse_stream
from minigpt.serving.replicas import read_metrics

__all__ = ["check_sse_stream", "check_admission", "CHECK_CONFIG", "MODEL_NAME", "check_server", "read_metrics",
           "check_goodput", "check_route", "check_router", "goodput_cases", "check_q_gateway_replicas",
           "check_q_affinity_pays", "AFFINITY_SCENARIOS", "REPLICAS4",
           "check_lora_delta", "check_lora_engine", "check_lora_server", "served_lora_model", "check_q1_adapter_mib",
           "check_q2_hundred_adapters_share", "check_q5_gather_mib", "SMALL_CONFIG", "small_model",
           "count_torch_calls", "Q_PRESET", "Q_RANK", "_check_sse_server", "_check_admission_server"]
