"""Lab 10's contracts (structured generation): the differential tests that show a mutant equivalent.

ex3_code  object_rules(name, members) -> {rule: [alternative, ...]}: plain data, compared as returned. Any rule name
          (two characters or more), any key text (quotes, backslashes, non-ASCII: the key is written as its JSON
          string), any value-rule names, each member required or not, no member at all.
ex4_code  generate_json(model, prompt, schema, max_new_tokens) -> token ids: any model on the course vocabulary
          (1 or 2 layers, GQA or not, any context, including one the prompt and the tokens asked for overflow, and
          logits far below -1e4), any prompt of at least one token, the lab's schemas (one where no token is ever
          allowed, one a bare string pattern), max_new_tokens from 0. Compared: the tokens, or the exception's type.
ex5_code  jump_forward_json(...): the same inputs; compared: the tokens and the token count of every forward pass
          (the judge counts them: forced tokens ride on the next pass).
"""

from __future__ import annotations

from hypothesis import strategies as st

from autograder.mutation.equivalence import Contract, Raised

# -- ex3: object_rules ---------------------------------------------------------------------------------------------

_rule_name = st.text(min_size=2, max_size=12)
_members = st.lists(st.tuples(st.text(max_size=6), _rule_name, st.booleans()), max_size=5,
                    unique_by=lambda m: m[0]).map(lambda ms: [list(m) for m in ms])


def _object_inputs(ns: dict):
    return st.tuples(_rule_name, _members)


def _object_corners(ns: dict) -> list:
    return [("obj", []),
            ("obj", [["name", "value.name", True]]),
            ("obj", [["é", "value.ok", False], ['say "hi"\\', "value.name", True], ["\u2603\n", "value.age", False]]),
            ("obj.all_optional", [["a", "v.a", False], ["b", "v.b", False], ["c", "v.c", False]])]


# -- ex4, ex5: constrained decoding on a model ---------------------------------------------------------------------

SCHEMAS = [
    {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 99}},
     "required": ["ok", "n"]},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]},
                                      "size": {"type": "integer", "minimum": 1, "maximum": 12},
                                      "tag": {"type": "string", "maxLength": 4}}, "required": ["color"]},
    {"type": "integer", "minimum": -50, "maximum": 5000},
    {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 3},
    # no token of the course vocabulary spells either character alone: after '{"s":"' no token is allowed
    {"type": "object", "properties": {"s": {"enum": ["\u2603", "\u2604"]}}, "required": ["s"]},
    {"type": "string", "pattern": "[0-9]{4}-[0-9]{2}-[0-9]{2}"},
    {"type": "boolean"},
]


def _model(ns: dict, spec: tuple):
    """The checks' small GPT (autograder/lab10/common.decoding_model) in a drawn shape: (seed, n_layers,
    n_kv_heads, context, logit shift, eager to end)."""
    from autograder.lab10.common import decoding_model

    seed, n_layers, n_kv_heads, context, shift, eager = spec
    return decoding_model(seed, eager_to_end=eager, logit_shift=shift, d_model=32, n_layers=n_layers,
                          n_kv_heads=n_kv_heads, d_ff=64, max_seq_len=context)


def _decoding_inputs(ns: dict):
    vocab_size = len(ns["vocab"])
    model = st.tuples(st.integers(0, 2**16), st.sampled_from([1, 2]), st.sampled_from([1, 2, 4]),
                      st.sampled_from([4, 8, 16, 96]), st.sampled_from([0.0, -1e5, -1e7]), st.booleans())
    return st.tuples(model, st.lists(st.integers(0, vocab_size - 1), min_size=1, max_size=8),
                     st.integers(0, len(SCHEMAS) - 1), st.integers(0, 24))


def _decoding_corners(ns: dict) -> list:
    return [((5, 2, 2, 96, 0.0, False), [1, 2, 3, 4, 5], i, 32) for i in range(len(SCHEMAS))] + [
        ((6, 2, 2, 96, 0.0, True), [7, 8], 0, 32),
        ((5, 1, 1, 96, -1e7, False), [9], 1, 12),            # every logit far below -1e4
        ((5, 1, 4, 96, -1e5, False), [9, 10], 0, 12),
        ((5, 2, 2, 4, 0.0, False), [1, 2, 3], 0, 8),          # the prompt and the tokens overflow the context
        ((5, 2, 2, 8, 0.0, False), [1, 2, 3], 1, 0),          # no token asked for
        ((5, 2, 2, 96, 0.0, False), [1], 2, 1),               # one token
        ((5, 2, 2, 16, 0.0, False), [1, 2, 3, 4, 5, 6], 1, 10),
    ]


def _decode(with_passes: bool):
    def run(fn, value):
        from autograder.mutation.equivalence import call_with

        spec, prompt, schema, limit = value
        model = _model(fn.__globals__, spec)          # fn's globals: the notebook's namespace (its vocab)
        sizes: list[int] = []

        def hook(module, args, kwargs, output):
            tokens = args[0] if args else kwargs.get("tokens")
            sizes.append(int(tokens.shape[-1]))

        handle = model.register_forward_hook(hook, with_kwargs=True)
        try:
            got = call_with(fn, (model, list(prompt), SCHEMAS[schema], limit))
        finally:
            handle.remove()
        return (got, sizes) if with_passes else got
    return run


CONTRACTS = {
    "ex3_code": Contract("object_rules", _object_inputs, corners=_object_corners, examples=200),
    "ex4_code": Contract("generate_json", _decoding_inputs, run=_decode(False), corners=_decoding_corners,
                         examples=25),
    "ex5_code": Contract("jump_forward_json", _decoding_inputs, run=_decode(True), corners=_decoding_corners,
                         examples=25),
}

__all__ = ["CONTRACTS", "Raised"]
