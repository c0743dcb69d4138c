r"""Structured generation (lab 10): constrain decoding to a language, one token mask a step.

    automaton = RegexAutomaton.compile(r"[0-9]{1,3}(\.[0-9]+)?")      # regex_automaton.py: a DFA over characters
    grammar = compile_json_schema(schema)                               # json_schema.py -> grammar.py: a pushdown recognizer
                                                                        # (json_text.py: how a character is spelled in JSON;
                                                                        # schema_merge.py: keywords beside anyOf and $ref)
    trie = TokenTrie(Vocabulary.from_tokenizer(load_tokenizer()))       # token_masks.py: the tokens' texts in a trie
    mask = mask_by_trie(automaton, state, trie)                         # (V,) bool: what may come next from `state`
    cache = ContextCache(grammar, trie)                                 # token_cache.py: masks from cached rule positions
    out = generate_constrained(model, prompt, grammar, trie, max_new_tokens=64, masks=cache.mask)   # constrained.py

`Grammar.forced_text(state)` is what the grammar admits alone; `generate_constrained(..., forced=enc.encode,
jump_forward=True)` takes its tokens without a forward pass each (SGLang's jump-forward decoding).

Three ways to compute the same mask (token_masks.py): scan the vocabulary, walk a token trie, or look it up in a
`MaskIndex` precomputed for every state of a DFA at compile time (`CountingAutomaton` counts the characters each
reads). Checked against XGrammar and llguidance; `evaluation.py` measures valid rates on held-out schemas
(data/structured/schemas.json) with and without the mask, and `make bench` times the masks against both libraries.
"""
