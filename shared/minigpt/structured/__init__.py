"""Structured generation (lab 10): constrain decoding to a language, one token mask a step.

    automaton = RegexAutomaton.compile(r"[0-9]{1,3}(\.[0-9]+)?")      # regex_automaton.py: a DFA over characters
    vocab = Vocabulary.from_tokenizer(load_tokenizer())                 # token_masks.py: each token's text
    mask = mask_by_trie(automaton, state, TokenTrie(vocab))             # (V,) bool: the tokens the DFA can read from `state`

Three ways to compute the same mask (token_masks.py): scan the vocabulary, walk a token trie, or look it up in a
`MaskIndex` precomputed for every state at compile time.
"""
