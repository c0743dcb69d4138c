"""Exercise 3: cached generation end to end, step by step against the naive generator.

The check grades the generator alone: it plugs the package's attention in (unless told to use the learner's), and
it accepts the package's LayerKVCache inside the learner's loop, so a learner whose Exercise 2 failed can go on with
`from minigpt.cache.contiguous import LayerKVCache`. The package's cached generator itself is refused."""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch

from autograder.checking.call_conditions import DEVICE_HINT, default_device_elsewhere
from autograder.checking.models import LetterTokenizer
from autograder.harness import assert_finite, quiet, token_list_checked, within
from autograder.lab01.common import ATOL, SMALL_CONFIGS, random_prompt, small_model
from autograder.checking.reference_guard import no_calls_into, own_work
from autograder.checking.wire import run_where, storage_address
from minigpt.attention import resolve_attention
from minigpt.config import ModelConfig
from minigpt.engine.cached_generation import generate_kv_cache
from minigpt.generate import Generation, generate_naive
from minigpt.model import GPT
from minigpt.sampling import SamplingParams
from minigpt.timing import fixed_threads


class _Recorder:
    """Records, per forward call of a model: tokens fed, positions, last-position logits, and the key/value
    shapes its attention receives."""

    def __init__(self, model: GPT, attention: Callable | None) -> None:
        self.model = model
        self.calls: list[dict[str, Any]] = []
        self.attn_shapes: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
        self.key_buffers: list[int] = []        # per attention call: address of the memory the keys live in
        self.key_dtypes: list[Any] = []         # per attention call: the keys' dtype
        inner = resolve_attention(attention if attention is not None else "sdpa")

        def recording_attention(q, k, v):
            self.attn_shapes.append((tuple(q.shape), tuple(k.shape)))
            self.key_buffers.append(storage_address(k))
            self.key_dtypes.append(k.dtype)
            return inner(q, k, v)

        model.set_attention(recording_attention)
        self.handle = model.register_forward_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs, output) -> None:
        tokens = args[0] if args else kwargs.get("tokens")
        positions = args[1] if len(args) > 1 else kwargs.get("positions")
        self.calls.append({"tokens": tuple(tokens.shape),
                           "positions": None if positions is None else positions.reshape(-1)[-tokens.shape[-1]:].tolist(),
                           "logits": output[:, -1].detach().float().clone()})

    def close(self) -> None:
        self.handle.remove()
        self.model.set_attention("sdpa")


GENERATE_WHAT = "Exercise 3 (generate_kv_cache)"


def _run(generate_fn: Callable, model: GPT, prompt: list[int], n: int, sampling: SamplingParams,
         attention: Callable | None, what: str, *, learner: bool = True, **kw: Any) -> tuple[Generation, _Recorder]:
    """Run a generator under a _Recorder; the learner's (`learner`) may not enter the package's cached generator."""
    rec = _Recorder(model, attention)
    watch = no_calls_into(generate_kv_cache, what=GENERATE_WHAT) if learner else contextlib.nullcontext()
    try:
        with quiet(), watch:
            out = generate_fn(model, list(prompt), n, sampling, **kw)
    except NotImplementedError:
        raise AssertionError("generate_kv_cache is not implemented yet (NotImplementedError)") from None
    except AssertionError:
        raise
    except Exception as err:
        raise AssertionError(f"{what}: your generator raised {type(err).__name__}: {err}") from None
    finally:
        rec.close()
    if not isinstance(out, Generation):
        raise AssertionError(f"{what}: return a minigpt.generate.Generation, got {type(out).__name__}")
    return token_list_checked(out, what), rec


def _diagnose(rec: _Recorder, ref: _Recorder, cfg: ModelConfig, prompt: list[int], what: str) -> None:
    """Per-step comparison of a cached run against the naive run: the first difference, with its likely cause."""
    P = len(prompt)
    for _, k_shape in rec.attn_shapes:
        if k_shape[1] != cfg.n_kv_heads:
            raise AssertionError(f"{what}: attention received keys with {k_shape[1]} heads, but the model has "
                                 f"{cfg.n_kv_heads} KV heads (and {cfg.n_heads} query heads). Under GQA cache the KV heads "
                                 "as they come out of wk/wv; the attention function groups the query heads over them.")
    if len(rec.calls) != len(ref.calls):
        raise AssertionError(f"{what}: expected {len(ref.calls)} forward calls (one prefill, then one per new token "
                             f"except the last), your generator made {len(rec.calls)}")
    first = rec.calls[0]
    if first["tokens"][-1] != P:
        raise AssertionError(f"{what}: the first forward call (prefill) should process the whole prompt of {P} tokens "
                             f"at once, it got tokens of shape {first['tokens']}")
    for step, call in enumerate(rec.calls[1:], start=1):
        if call["tokens"] != (1, 1):
            raise AssertionError(f"{what}: decode step {step} fed tokens of shape {call['tokens']} to the model; with a "
                                 "KV cache each decode step feeds only the newest token, shape (1, 1)")
    n_layers = cfg.n_layers
    # Attention key counts per call: the prefill sees P keys; decode step s sees P + s keys.
    for call_index in range(len(rec.calls)):
        for layer in range(n_layers):
            j = call_index * n_layers + layer
            if j >= len(rec.attn_shapes):
                break
            q_shape, k_shape = rec.attn_shapes[j]
            want_tk = P + call_index
            if k_shape[2] != want_tk:
                where = "prefill" if call_index == 0 else f"decode step {call_index}"
                hint = (" The cache length did not advance after the write?" if k_shape[2] < want_tk else
                        " Return only the stored positions [0, length + T), not the whole buffer.")
                raise AssertionError(f"{what}: at {where}, layer {layer}, attention received {k_shape[2]} keys, expected "
                                     f"{want_tk} (all positions so far).{hint}")
    _check_preallocated(rec, n_layers, what)
    for step, call in enumerate(rec.calls):
        want = list(range(P)) if step == 0 else [P + step - 1]
        if call["positions"] != want:
            got = call["positions"]
            raise AssertionError(f"{what}: {'prefill' if step == 0 else f'decode step {step}'} passed positions "
                                 f"{got if got is None or len(got) < 6 else got[:3] + ['...']} but the tokens sit at "
                                 f"{want if len(want) < 6 else want[:3] + ['...']}. RoPE must be offset by the cache length: "
                                 "positions = arange(length, length + T).")
    for step, (a, b) in enumerate(zip(rec.calls, ref.calls)):
        where = "prefill" if step == 0 else f"decode step {step} (position {P + step - 1})"
        assert_finite(a["logits"], f"{GENERATE_WHAT}, {what}: the logits at {where}", b["logits"])
        err = (a["logits"] - b["logits"]).abs().max().item()
        if not within(err, ATOL):
            hint = ("the prefill itself is wrong (mask? positions?)" if step == 0 else
                    "the prefill matched, so look at the decode path: keys/values written at the wrong index, "
                    "a causal mask aligned top-left instead of bottom-right, or a cache that was not advanced")
            raise AssertionError(f"{what}: logits at {where} differ from recomputing the whole sequence by up to "
                                 f"{err:.3g} (allowed {ATOL}); {hint}.")


def _check_preallocated(rec: _Recorder, n_layers: int, what: str) -> None:
    """Every decode step's keys must live in the same memory, layer by layer: a cache preallocated once and
    written in place, not one grown (torch.cat, a new tensor per step) and copied again at every token."""
    for step, call in enumerate(rec.calls[1:], start=1):
        if call["tokens"] != (1, 1):
            raise AssertionError(f"{what}: decode step {step} fed tokens of shape {call['tokens']} to the model; with a "
                                 "KV cache each decode step feeds only the newest token, shape (1, 1)")
    decode = [rec.key_buffers[c * n_layers:(c + 1) * n_layers] for c in range(1, len(rec.calls))]
    for step, buffers in enumerate(decode[1:], start=2):
        for layer, (first, now) in enumerate(zip(decode[0], buffers)):
            if now != first:
                raise AssertionError(f"{what}: at decode step {step}, layer {layer}, attention read the keys from new "
                                     "memory (not the buffer of decode step 1): the cache was grown or copied "
                                     "(torch.cat?) instead of preallocated once and written in place, which makes "
                                     "every step copy the whole cache (quadratic time). Allocate max length up front.")


def _check_contract_edges(generate_fn: Callable, attention: Callable | None) -> None:
    """What the step-by-step cases never ask: zero new tokens, a stop string (with its tokenizer), and a model in
    bfloat16 (the cache in the model's dtype)."""
    model = small_model("GQA 4q/2kv")
    prompt = random_prompt(5, model.config.vocab_size, seed=41)
    what = "model GQA 4q/2kv, prompt of 5 tokens, max_new_tokens=0"
    ref, _ = _run(generate_naive, model, prompt, 0, SamplingParams(), None, "naive", learner=False, stop_token_ids=())
    out, _ = _run(generate_fn, model, prompt, 0, SamplingParams(), attention, what, stop_token_ids=())
    if (out.tokens, out.finish_reason) != (ref.tokens, ref.finish_reason):
        raise AssertionError(f"{what}: expected no tokens and finish_reason {ref.finish_reason!r} (like "
                             f"generate_naive), got {out.tokens} and {out.finish_reason!r}")
    free, _ = _run(generate_naive, model, prompt, 16, SamplingParams(), None, "naive", learner=False, stop_token_ids=())
    stop = LetterTokenizer.decode(free.tokens[6:8])
    kw = dict(stop_token_ids=(), stop_strings=(stop,))
    what = f"model GQA 4q/2kv, prompt of 5 tokens, stop_strings=({stop!r},) with a tokenizer"
    ref, _ = _run(generate_naive, model, prompt, 16, SamplingParams(), None, "naive", learner=False,
                  tokenizer=LetterTokenizer(), **kw)
    # the learner's generator gets a tokenizer built where it runs (judged: the grader hands over data, not objects)
    out, _ = _run(generate_fn, model, prompt, 16, SamplingParams(), attention, what,
                  tokenizer=run_where(generate_fn, LetterTokenizer), **kw)
    if (out.tokens, out.finish_reason) != (ref.tokens, ref.finish_reason):
        raise AssertionError(f"{what}: expected {ref.tokens} ({ref.finish_reason!r}), got {out.tokens} "
                             f"({out.finish_reason!r}); pass stop_strings and tokenizer on to minigpt.generate.StopRule")
    _check_default_device_elsewhere(generate_fn, attention)
    half = small_model("GQA 4q/2kv").to(torch.bfloat16)
    what = "model GQA 4q/2kv in bfloat16, prompt of 5 tokens, 3 new tokens"
    out, rec = _run(generate_fn, half, prompt, 3, SamplingParams(), attention, what, stop_token_ids=())
    wrong = sorted({str(d) for d in rec.key_dtypes if d != torch.bfloat16})
    if wrong:
        raise AssertionError(f"{what}: attention received keys in {', '.join(wrong)}; allocate the cache in the "
                             "model's dtype (dtype=model.dtype), as the keys it stores come out of the model")


def _check_default_device_elsewhere(generate_fn: Callable, attention: Callable | None) -> None:
    """The generator on a model that is not on torch's default device: its caches, prompt, positions, decode
    tokens and sampling generator must all follow model.device (on a one-device machine a tensor made without
    device= meets the model by accident)."""
    model = small_model("GQA 4q/2kv")
    prompt = random_prompt(5, model.config.vocab_size, seed=43)
    params = SamplingParams(temperature=0.9, top_k=40, top_p=0.9, seed=11)
    what = f"model GQA 4q/2kv, prompt of 5 tokens, 6 new tokens, sampling {params}"
    ref, _ = _run(generate_naive, model, prompt, 6, params, None, "naive", learner=False, stop_token_ids=())
    try:
        with default_device_elsewhere():
            out, _ = _run(generate_fn, model, prompt, 6, params, attention, what, stop_token_ids=())
    except AssertionError as err:
        if "your generator raised" not in str(err):
            raise
        raise AssertionError(f"{str(err).rstrip('.')}. {DEVICE_HINT}.") from None
    if out.tokens != ref.tokens:
        raise AssertionError(f"{what}: with torch's default device moved off the model's, expected {ref.tokens}, got "
                             f"{out.tokens}. {DEVICE_HINT}.")


def check_generate_kv_cache(generate_fn: Callable, attention: Callable | None = None) -> None:
    """generate_fn(model, prompt, max_new_tokens, sampling, *, stop_token_ids, ...) -> Generation must give the
    same tokens as minigpt.generate.generate_naive (greedy and seeded sampling), with logits close at every step,
    one prefill call and one token per decode step. `attention`: the learner's attention function, plugged into
    the model for the whole check (default: the package's SDPA)."""
    own_work(generate_fn, (generate_kv_cache, generate_naive), what=GENERATE_WHAT)
    with fixed_threads(1):                  # tiny models: one thread is fastest and immune to a busy machine
        _check_generate(generate_fn, attention)


def _check_generate(generate_fn: Callable, attention: Callable | None) -> None:
    for name, cfg in SMALL_CONFIGS.items():
        model = small_model(name)
        S = cfg.max_seq_len
        cases = [(1, 12), (7, 20), (S - 9, 9), (S - 1, 1)]          # (prompt length, new tokens); two end at S
        for i, (P, N) in enumerate(cases):
            prompt = random_prompt(P, cfg.vocab_size, seed=10 * i + 1)
            what = f"model {name} (max_seq_len={S}), prompt of {P} tokens, {N} new tokens, greedy"
            ref, ref_rec = _run(generate_naive, model, prompt, N, SamplingParams(), None, "naive", learner=False, stop_token_ids=())
            out, rec = _run(generate_fn, model, prompt, N, SamplingParams(), attention, what, stop_token_ids=())
            _diagnose(rec, ref_rec, cfg, prompt, what)
            if out.tokens != ref.tokens:
                step = next((j for j, (a, b) in enumerate(zip(out.tokens, ref.tokens)) if a != b), min(len(out.tokens), len(ref.tokens)))
                raise AssertionError(f"{what}: tokens differ from generate_naive at new token {step}: expected "
                                     f"{ref.tokens[step:step + 3]}..., got {out.tokens[step:step + 3]}...")
            if (out.finish_reason, out.prompt_tokens) != (ref.finish_reason, ref.prompt_tokens):
                raise AssertionError(f"{what}: expected finish_reason={ref.finish_reason!r}, prompt_tokens={ref.prompt_tokens}, "
                                     f"got {out.finish_reason!r}, {out.prompt_tokens}")
        # Seeded sampling, and a stop token met along the way.
        prompt = random_prompt(5, cfg.vocab_size, seed=99)
        params = SamplingParams(temperature=0.9, top_k=40, top_p=0.9, seed=7)
        what = f"model {name}, prompt of 5 tokens, sampling {params}"
        ref, _ = _run(generate_naive, model, prompt, 24, params, None, "naive", learner=False, stop_token_ids=())
        out, _ = _run(generate_fn, model, prompt, 24, params, attention, what, stop_token_ids=())
        if out.tokens != ref.tokens:
            raise AssertionError(f"{what}: seeded sampling should give the same tokens as generate_naive: expected "
                                 f"{ref.tokens}, got {out.tokens}. Use minigpt.sampling.make_generator(sampling, device) "
                                 "once and sample_next(logits, sampling, generator) for every token.")
        stop = ref.tokens[5]
        ref, _ = _run(generate_naive, model, prompt, 24, params, None, "naive", learner=False, stop_token_ids=(stop,))
        out, _ = _run(generate_fn, model, prompt, 24, params, attention, what, stop_token_ids=(stop,))
        if (out.tokens, out.finish_reason) != (ref.tokens, ref.finish_reason):
            raise AssertionError(f"{what}, stop_token_ids=({stop},): expected {ref.tokens} ({ref.finish_reason!r}), got "
                                 f"{out.tokens} ({out.finish_reason!r}); use minigpt.generate.StopRule")
    _check_contract_edges(generate_fn, attention)
    # A request that does not fit must be refused like the naive generator does (check_request).
    model = small_model("GQA 4q/2kv")
    try:
        with quiet(), no_calls_into(generate_kv_cache, what=GENERATE_WHAT):
            generate_fn(model, [1] * 60, 5, SamplingParams())
    except ValueError:
        pass
    except Exception as err:
        raise AssertionError(f"a prompt of 60 tokens + 5 new ones in a context of 64 should raise ValueError "
                             f"(use minigpt.generate.check_request), got {type(err).__name__}: {err}") from None
    else:
        raise AssertionError("a prompt of 60 tokens + 5 new ones in a context of 64 should raise ValueError "
                             "(use minigpt.generate.check_request), nothing was raised")
