"""`python -m minigpt.serving`: the OpenAI-compatible server on loopback (lab 08). See `--help`."""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m minigpt.serving",
                                description="Serve a course model behind an OpenAI-compatible HTTP API.")
    p.add_argument("--checkpoint", default="target",
                   help="course checkpoint name (target, draft), .safetensors path, or a Hugging Face Llama-family folder")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="cap the context (default: the checkpoint's; lower it for long-context models)")
    p.add_argument("--engine", choices=["continuous", "naive"], default="continuous",
                   help="continuous batching (LLMEngine) or one request at a time (NaiveEngine)")
    p.add_argument("--weights", choices=["fp32", "int8", "int4"], default="fp32")
    p.add_argument("--host", default="127.0.0.1", help="bind address (loopback by default)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-queue", type=int, default=64, help="requests held at once (queued or running); past it, 429")
    p.add_argument("--retry-after", type=float, default=1.0, help="seconds in the 429's Retry-After header")
    p.add_argument("--num-blocks", type=int, default=256)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-num-seqs", type=int, default=16)
    p.add_argument("--max-num-batched-tokens", type=int, default=256)
    p.add_argument("--no-prefix-caching", action="store_true")
    p.add_argument("--prefix-cache", choices=["hash", "radix"], default="hash",
                   help="lab 02's chained block hashes or lab 13's radix tree")
    p.add_argument("--host-tier-blocks", type=int, default=0,
                   help="with --prefix-cache radix: keep this many evicted KV blocks in host memory and load them "
                        "back instead of recomputing (lab 13)")
    p.add_argument("--async-scheduling", action="store_true",
                   help="schedule the next step while the model runs this one (lab 12; vLLM's flag of that name)")
    p.add_argument("--static-decode", choices=["off", "eager", "compiled"], default="off",
                   help="decode-only steps with shapes fixed per batch-size bucket, eager or compiled (torch.compile; "
                        "replayed from CUDA graphs on a GPU) (lab 12; fp32 weights, no LoRA adapters)")
    p.add_argument("--batch-invariant", action="store_true",
                   help="each request's logits independent of its batch (lab 12; fp32 weights, no LoRA adapters)")
    p.add_argument("--lora-adapters", default=None, metavar="PATH",
                   help="serve these LoRA adapters (a file written by LoRAAdapters.save); a request names one in `model`")
    p.add_argument("--served-model-name", default=None, help="the `model` name clients use (default: the checkpoint)")
    p.add_argument("--header-timeout", type=float, default=30.0,
                   help="seconds a client has to send a request's head (request line and headers)")
    p.add_argument("--read-timeout", type=float, default=30.0,
                   help="seconds of silence allowed while a request's head or body is incomplete")
    p.add_argument("--keep-alive-timeout", type=int, default=5, help="seconds an idle keep-alive connection stays open")
    p.add_argument("--structured-outputs-backend", choices=["llguidance", "course"], default="llguidance",
                   help="what compiles response_format / tool grammars: llguidance (a production library) or the "
                        "course's own compiler (lab 10)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--log-level", default="warning")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import torch
    import uvicorn

    from minigpt.serving.api_server import create_app
    from minigpt.serving.async_engine import AsyncLLMEngine
    from minigpt.serving.engine import EngineConfig, LLMEngine
    from minigpt.serving.launch import uvicorn_config
    from minigpt.serving.naive import NaiveEngine

    if args.threads:
        torch.set_num_threads(args.threads)
    name = args.served_model_name or str(args.checkpoint)
    if args.engine == "naive":
        if args.weights != "fp32" or args.lora_adapters or args.async_scheduling or args.batch_invariant \
                or args.static_decode != "off":
            print("--weights, --lora-adapters, --async-scheduling, --static-decode and --batch-invariant apply to the "
                  "continuous engine only", file=sys.stderr)
            return 2
        engine = NaiveEngine.from_checkpoint(args.checkpoint, model_name=name, max_model_len=args.max_model_len)
    else:
        if (args.batch_invariant or args.static_decode != "off") and args.lora_adapters:
            print("--batch-invariant and --static-decode do not apply to LoRA adapters (their runner has neither)",
                  file=sys.stderr)
            return 2
        try:
            config = EngineConfig(num_blocks=args.num_blocks, block_size=args.block_size, max_num_seqs=args.max_num_seqs,
                                  max_num_batched_tokens=args.max_num_batched_tokens,
                                  enable_prefix_caching=not args.no_prefix_caching, weights=args.weights,
                                  async_scheduling=args.async_scheduling, batch_invariant=args.batch_invariant,
                                  static_decode=args.static_decode,
                                  prefix_cache=args.prefix_cache, host_tier_blocks=args.host_tier_blocks)
        except ValueError as err:
            print(err, file=sys.stderr)
            return 2
        if args.lora_adapters:                        # multi-LoRA serving (serving/lora.py, lora_runner.py)
            from minigpt.checkpoint import load_model
            from minigpt.serving.lora import LoRAAdapters
            from minigpt.serving.lora_runner import engine_with_adapters
            from minigpt.tokenizer import tokenizer_for
            model = load_model(args.checkpoint, max_seq_len=args.max_model_len)
            engine = engine_with_adapters(model, LoRAAdapters.load(args.lora_adapters, model), config,
                                          tokenizer=tokenizer_for(args.checkpoint), model_name=name)
        else:
            engine = LLMEngine.from_checkpoint(args.checkpoint, config, model_name=name, max_model_len=args.max_model_len)
    app = create_app(AsyncLLMEngine(engine, num_threads=args.threads), max_queue=args.max_queue,
                     retry_after_s=args.retry_after, structured_outputs_backend=args.structured_outputs_backend)
    config = uvicorn_config(app, args.host, args.port, log_level=args.log_level, header_timeout_s=args.header_timeout,
                            read_timeout_s=args.read_timeout, keep_alive_timeout_s=args.keep_alive_timeout)
    uvicorn.Server(config).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
