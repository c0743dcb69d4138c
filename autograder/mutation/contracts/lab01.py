"""Lab 01's contracts (the KV cache): what each exercise's markdown and check (autograder/lab01/) allow.

* ex1 causal_attention(q, k, v): q (B, Hq, Tq, D), k and v (B, Hkv, Tk, D), Tk >= Tq >= 1, Hq a multiple of Hkv
  (MHA, GQA, MQA), any D, float32/float64/bfloat16/float16, on the CPU or off it (meta); scores in the hundreds
  and every visible score far below -1e4.
* ex2 LayerKVCache: built with and without dtype=/device= (meta included), driven through writes of 1 to more
  than max_seq_len positions (overflows), filling exactly to capacity, and resets; the trace holds every returned
  k_all/v_all (values, and whether they are views of the buffers), the length and both buffers after each
  operation, and for a rejected write the ValueError and which of the numbers the markdown asks its message to
  name (where the write starts, how many positions, the capacity) it names.
* ex3 generate_kv_cache: minigpt models of 1 to 3 layers (MHA, GQA, MQA; float32 and bfloat16; on the CPU or off
  it), prompts of 1 token to the context's end, 0 or more new tokens, greedy and seeded sampling, stop tokens and
  stop strings, requests that do not fit. The run records the devices and dtype of what the model is fed (tokens,
  positions, each layer cache's buffers) and the device each generator is made for and sampled with. A model off
  the CPU (meta) has no values and no generators: there make_generator stands in a CPU generator (recording the
  device asked for) and sample_next a CPU token (the same stream for both versions), as a GPU's would be read back.
* ex4 fuse_weights(state, config): state dicts of minigpt models (1 to 3 layers, tied or not, scaled RoPE or not,
  float32/bfloat16, CPU or meta); every entry compared by value, dtype, shape, device and memory order (strides):
  the markdown asks for K-major matrices, "then .contiguous() (a transposed view has the right shape but the old
  memory order)".
* ex5 decode_step(w, config, token, position, k_cache, v_cache): the reference's fused weights of small models
  (1 to 3 layers, MHA/GQA/MQA, tied or not, scaled RoPE, large norm eps), caches holding anything (poison past
  the position), every position from 0 to the context's last; the logits and both caches after the call.
"""

from __future__ import annotations

import inspect
import re

import torch
from hypothesis import strategies as st

from autograder.mutation.equivalence import Contract, Raised, call_with, same_result

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]


def _randn(shape, seed, dtype, device, scale=1.0, shift=0.0, positive=False):
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(shape, generator=g, dtype=torch.float64)
    t = (t.abs() if positive else t) * scale + shift
    return t.to(dtype).to(device)


# ---------------------------------------------------------------- exercise 1: attention with the bottom-right mask


@st.composite
def _attention_inputs(draw):
    B, Hkv, group = draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.sampled_from([1, 2, 3]))
    Tk = draw(st.integers(1, 9))
    Tq = draw(st.sampled_from([1, Tk, draw(st.integers(1, Tk))]))
    D = draw(st.sampled_from([1, 2, 4, 8, 16]))
    dtype = draw(st.sampled_from(DTYPES))
    device = draw(st.sampled_from(["cpu", "cpu", "cpu", "meta"]))
    kind = draw(st.sampled_from(["plain", "plain", "hundreds", "far below -1e4"]))
    seed = draw(st.integers(0, 2**16))
    Hq = Hkv * group
    if kind == "far below -1e4" and dtype == torch.float16:      # float16 tops out at 65504: scores of -1e5 are -inf
        dtype = torch.bfloat16
    if kind == "far below -1e4":        # positive keys, large negative queries: every visible score << -1e4
        q = -_randn((B, Hq, Tq, D), seed, dtype, device, 2e4, 1e4, positive=True)
        k = _randn((B, Hkv, Tk, D), seed + 1, dtype, device, 1.0, 0.5, positive=True)
    else:
        scale = 30.0 if kind == "hundreds" else 1.0
        q = _randn((B, Hq, Tq, D), seed, dtype, device, scale)
        k = _randn((B, Hkv, Tk, D), seed + 1, dtype, device, scale)
    return (q, k, _randn((B, Hkv, Tk, D), seed + 2, dtype, device))


def _attention_corners(ns):
    out = []
    for device in ("cpu", "meta"):
        for B, Hq, Hkv, Tq, Tk, D in ((1, 1, 1, 1, 1, 1), (2, 4, 2, 1, 9, 8), (1, 6, 1, 3, 8, 16), (2, 4, 4, 6, 6, 8)):
            for dtype in (torch.float32, torch.bfloat16):
                out.append((_randn((B, Hq, Tq, D), 1, dtype, device), _randn((B, Hkv, Tk, D), 2, dtype, device),
                            _randn((B, Hkv, Tk, D), 3, dtype, device)))
    return out


# ---------------------------------------------------------------- exercise 2: the layer cache


@st.composite
def _cache_inputs(draw):
    B, S, H, D = draw(st.integers(1, 2)), draw(st.integers(1, 8)), draw(st.integers(1, 3)), draw(st.integers(1, 4))
    kwargs = dict(draw(st.sampled_from([{}, {"dtype": None}, {"device": None}, {"dtype": None, "device": None}])))
    if "dtype" in kwargs:
        kwargs["dtype"] = draw(st.sampled_from(DTYPES))
    if "device" in kwargs:
        kwargs["device"] = draw(st.sampled_from(["cpu", "meta", torch.device("cpu"), torch.device("meta")]))
    ops = draw(st.lists(st.one_of(st.tuples(st.just("update"), st.integers(1, S + 2), st.integers(0, 999)),
                                  st.just(("reset",))), min_size=1, max_size=6))
    return (B, S, H, D, kwargs, ops)


def _cache_corners(ns):
    return [(1, 8, 2, 4, {}, [("update", 6, 1), ("update", 3, 2), ("update", 2, 3), ("update", 1, 4)]),
            (2, 5, 3, 2, {"dtype": torch.bfloat16, "device": "meta"}, [("update", 4, 1), ("update", 2, 2), ("reset",),
                                                                    ("update", 5, 3)]),
            (1, 1, 1, 1, {"dtype": torch.float16}, [("update", 2, 0), ("update", 1, 1), ("update", 1, 2)]),
            (2, 10, 2, 4, {}, [("update", 4, 0), ("update", 1, 1), ("update", 1, 2), ("update", 3, 3), ("reset",),
                               ("update", 2, 4)])]


def _numbers(message: str) -> set[int]:
    return {int(n) for n in re.findall(r"\d+", message)}


def _cache_state(cache):
    return {"length": cache.length, "k": cache.k.clone(), "v": cache.v.clone()}


def _run_cache(cls, value):
    """The trace of one cache through the operations: what each returned or raised, and the state after it."""
    from autograder.checking.wire import storage_address

    B, S, H, D, kwargs, ops = value
    try:
        cache = cls(B, S, H, D, **kwargs)
    except Exception as err:                        # noqa: BLE001
        return [Raised(type(err).__name__)]
    trace = [_cache_state(cache)]
    dtype, device = kwargs.get("dtype", torch.float32), kwargs.get("device", "cpu")
    for op in ops:
        if op[0] == "reset":
            out = call_with(cache.reset, ())
        else:
            T, seed = op[1], op[2]
            k, v = _randn((B, T, H, D), seed, dtype, device), _randn((B, T, H, D), seed + 1000, dtype, device)
            start = cache.length
            try:
                k_all, v_all = cache.update(k, v)
                meta = k_all.device.type == "meta"
                out = {"k_all": k_all.clone(), "v_all": v_all.clone(),
                       "views": None if meta else (storage_address(k_all) == storage_address(cache.k),
                                                   storage_address(v_all) == storage_address(cache.v))}
            except ValueError as err:
                named = _numbers(str(err))
                out = {"raised": "ValueError", "names the start": start in named,
                       "names how many positions": T in named, "names the capacity": S in named}
            except Exception as err:                # noqa: BLE001
                out = Raised(type(err).__name__)
        trace.append((op, out, _cache_state(cache)))
    return trace


# ---------------------------------------------------------------- models (exercises 3 to 5)


def _gpt(n_layers, n_kv, group, head_dim, tied, scaled_rope, seed, dtype="float32", device="cpu", vocab=48,
         max_seq_len=24, d_ff=32, norm_eps=1e-5):
    from minigpt.config import Llama3RopeScaling, ModelConfig
    from minigpt.model import GPT

    n_heads = n_kv * group
    scaling = Llama3RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                original_max_position_embeddings=8) if scaled_rope else None
    cfg = ModelConfig(vocab_size=vocab, max_seq_len=max_seq_len, d_model=n_heads * head_dim, n_layers=n_layers,
                      n_heads=n_heads, n_kv_heads=n_kv, d_ff=d_ff, tie_embeddings=tied, norm_eps=norm_eps,
                      rope_theta=500000.0 if scaled_rope else 10000.0, rope_scaling=scaling)
    g = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng():
        model = GPT(cfg).eval()
    with torch.no_grad():                           # norms not all ones, weights large enough to vary the argmax
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.5 if p.ndim == 2 else 0.2) + (1.0 if p.ndim == 1 else 0.0))
    return model.to(dtype=getattr(torch, dtype), device=device)


def _models(devices=("cpu", "cpu", "meta"), dtypes=("float32", "bfloat16")):
    return st.builds(_gpt, st.integers(1, 3), st.sampled_from([1, 2]), st.sampled_from([1, 2, 3]),
                     st.sampled_from([2, 4, 8]), st.booleans(), st.booleans(), st.integers(0, 99),
                     st.sampled_from(list(dtypes)), st.sampled_from(list(devices)))


# ---------------------------------------------------------------- exercise 3: cached generation


@st.composite
def _generate_inputs(draw):
    from minigpt.sampling import SamplingParams

    model = draw(_models())
    V, S = model.config.vocab_size, model.config.max_seq_len
    prompt = draw(st.lists(st.integers(0, V - 1), min_size=1, max_size=S))
    n = draw(st.integers(0, S - len(prompt)) | st.integers(0, S + 2))          # some do not fit: ValueError
    sampling = draw(st.sampled_from([SamplingParams(), SamplingParams(temperature=0.9, top_k=40, top_p=0.9, seed=7),
                                     SamplingParams(temperature=1.3, seed=draw(st.integers(0, 9)))]))
    kw = draw(st.sampled_from(["default", "none", "some", "strings"]))
    if kw == "default":
        return ((model, prompt, n, sampling), {})
    if kw == "none":
        return ((model, prompt, n, sampling), {"stop_token_ids": ()})
    if kw == "some":
        return ((model, prompt, n, sampling), {"stop_token_ids": tuple(draw(st.lists(st.integers(0, V - 1),
                                                                                     min_size=1, max_size=3)))})
    from autograder.checking.models import LetterTokenizer

    return ((model, prompt, n, sampling), {"stop_token_ids": (), "stop_strings": (draw(st.sampled_from("abcd")),),
                                           "tokenizer": LetterTokenizer()})


def _generate_corners(ns):
    from minigpt.sampling import SamplingParams

    seeded = SamplingParams(temperature=0.9, top_k=40, top_p=0.9, seed=7)
    one = _gpt(1, 1, 2, 4, True, False, 1)
    return [((_gpt(1, 2, 1, 4, False, False, 0, device="meta"), [1, 2], 3, seeded), {"stop_token_ids": ()}),
            ((_gpt(2, 1, 2, 4, True, False, 2, device="meta"), [5], 2, SamplingParams()), {"stop_token_ids": ()}),
            ((one, [3, 4], 5, SamplingParams()), {"stop_token_ids": ()}),
            ((one, [7] * 23, 1, seeded), {"stop_token_ids": ()}),
            ((one, [7] * 24, 0, SamplingParams()), {}),
            ((_gpt(3, 1, 3, 2, False, True, 3, dtype="bfloat16"), [0], 23, seeded), {"stop_token_ids": ()})]


def _run_generate(generate, value):
    """The Generation (or what was raised) and what the model and the sampler were handed, call by call."""
    (model, *_), _ = value
    fed, sampled, made = [], [], {}
    glob = inspect.unwrap(generate).__globals__
    real_make, real_sample = glob.get("make_generator"), glob.get("sample_next")

    def make_generator(params, device="cpu"):
        asked = str(torch.Generator(device=None).device if device is None else torch.device(device))
        gen = real_make(params, "cpu" if asked == "meta" else device)    # meta has no generators: a CPU stand-in
        made[id(gen)] = asked
        return gen

    def sample_next(logits, params, generator=None):
        used = None if params.greedy else (None if generator is None else made.get(id(generator), "not ours"))
        sampled.append((str(logits.device), used))   # greedy never touches the generator: where it lives is moot
        if logits.device.type == "meta":             # no values: the same stand-in token for both versions
            return torch.full(logits.shape[:-1], (7 * len(sampled) + 3) % logits.shape[-1], dtype=torch.long)
        return real_sample(logits, params, generator)

    def hook(module, args, kwargs):
        tokens = args[0] if args else kwargs.get("tokens")
        positions = args[1] if len(args) > 1 else kwargs.get("positions")
        caches = args[2] if len(args) > 2 else kwargs.get("kv_caches")
        fed.append({"tokens": (str(tokens.device), tuple(tokens.shape)),
                    "positions": None if positions is None else str(positions.device),
                    "caches": None if caches is None else [(str(c.k.device), str(c.k.dtype), str(c.v.device),
                                                            str(c.v.dtype)) for c in caches]})

    handle = model.register_forward_pre_hook(hook, with_kwargs=True)
    glob["make_generator"], glob["sample_next"] = make_generator, sample_next
    try:
        result = call_with(generate, value)
    finally:
        glob["make_generator"], glob["sample_next"] = real_make, real_sample
        handle.remove()
    return {"result": result, "model_fed": fed, "sampled (logits' device, generator used, made for)": sampled}


# ---------------------------------------------------------------- exercise 4: the fused weights


@st.composite
def _fuse_inputs(draw):
    model = draw(_models(devices=("cpu", "cpu", "meta"), dtypes=("float32", "bfloat16", "float64")))
    return ({k: v.detach().clone() for k, v in model.state_dict().items()}, model.config)


def _fuse_corners(ns):
    out = []
    for args in ((1, 1, 1, 2, True, False, 0), (3, 1, 3, 8, False, True, 1), (2, 2, 2, 4, True, True, 2)):
        for device in ("cpu", "meta"):
            model = _gpt(*args, device=device)
            out.append(({k: v.detach().clone() for k, v in model.state_dict().items()}, model.config))
    return out


def _layout(x):
    """Every tensor with its memory order (strides) beside it."""
    if isinstance(x, torch.Tensor):
        return (x, x.stride())
    if isinstance(x, dict):
        return {k: _layout(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_layout(v) for v in x)
    return x


def _run_fuse(fuse_weights, value):
    return _layout(call_with(fuse_weights, value))


# ---------------------------------------------------------------- exercise 5: the decode step


def _step_case(model, token, position, seed, poison):
    from minigpt.engine import static_decode

    cfg = model.config
    w = static_decode.fuse_weights({k: v.detach().clone() for k, v in model.state_dict().items()}, cfg)
    shape = (cfg.n_layers, cfg.max_seq_len, cfg.n_kv_heads, cfg.head_dim)
    k = _randn(shape, seed, model.dtype, model.device)
    v = _randn(shape, seed + 1, model.dtype, model.device)
    if poison and model.device.type != "meta":
        k[:, position:], v[:, position:] = 1e3, -1e3
    return (w, cfg, token, position, k, v)


@st.composite
def _step_inputs(draw):
    model = draw(st.builds(_gpt, st.integers(1, 3), st.sampled_from([1, 2]), st.sampled_from([1, 2, 3]),
                           st.sampled_from([2, 4, 8]), st.booleans(), st.booleans(), st.integers(0, 99),
                           st.sampled_from(["float32", "float32", "float64", "bfloat16"]),
                           st.sampled_from(["cpu", "cpu", "cpu", "meta"]), st.sampled_from([48, 5]),
                           st.sampled_from([24, 9, 1]), st.sampled_from([32, 6]), st.sampled_from([1e-5, 0.1])))
    cfg = model.config
    return _step_case(model, draw(st.integers(0, cfg.vocab_size - 1)),
                      draw(st.sampled_from([0, cfg.max_seq_len - 1]) | st.integers(0, cfg.max_seq_len - 1)),
                      draw(st.integers(0, 999)), draw(st.booleans()))


def _step_corners(ns):
    one = _gpt(1, 1, 1, 2, True, False, 0, max_seq_len=1)
    mqa = _gpt(3, 1, 4, 4, False, True, 1, norm_eps=0.1)
    return [_step_case(one, 3, 0, 0, False), _step_case(mqa, 5, 0, 1, True), _step_case(mqa, 7, 23, 2, True),
            _step_case(mqa, 7, 11, 3, True), _step_case(_gpt(2, 2, 2, 8, True, False, 4, device="meta"), 1, 5, 4, True)]


def _run_step(decode_step, value):
    """The logits and both caches after the step."""
    return {"logits": call_with(decode_step, value), "k_cache": value[4], "v_cache": value[5]}


CONTRACTS = {
    "ex1_code": Contract("causal_attention", lambda ns: _attention_inputs(), corners=_attention_corners, examples=150),
    "ex2_code": Contract("LayerKVCache", lambda ns: _cache_inputs(), run=_run_cache, corners=_cache_corners,
                         examples=150),
    "ex3_code": Contract("generate_kv_cache", lambda ns: _generate_inputs(), run=_run_generate,
                         corners=_generate_corners, examples=40),
    "ex4_code": Contract("fuse_weights", lambda ns: _fuse_inputs(), run=_run_fuse, corners=_fuse_corners,
                         examples=40),
    "ex5_code": Contract("decode_step", lambda ns: _step_inputs(), run=_run_step, corners=_step_corners,
                         examples=60),
}
