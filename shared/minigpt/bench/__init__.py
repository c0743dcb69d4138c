"""The course's benchmark: `make bench` (`python -m minigpt.bench`), one run, one ledger.

    python -m minigpt.bench                        # about 20 minutes on the 2-core machine; --quick: about 5
    python -m minigpt.bench --only batching,serving    # some parts again, the rest kept from the ledger in --out
    python -m minigpt.bench --readme               # README's performance table, from the committed ledger

What it measures, every figure beside its baseline, interleaved, warmed up, medians over repeats
(`minigpt.timing.compare`), at one thread:

* bandwidth.py: the memory bandwidth on a working set as large as the model (a sum, a copy, a STREAM-style triad
  and a one-row matrix product over the buffer; the fastest counts), and the matmul peak (FLOP/s, square fp32);
* decode.py (part "decode"): batch-1 decode of the course's target, per token (the slope between two answer
  lengths, so the prompt's prefill cancels out): lab 01's cached generation, the fused model, the serving engine
  (fused and as written), and `transformers`' `generate` on the same weights (eager, and with its static cache
  compiled); bytes per token by lab 00's rule and the memory-bandwidth utilisation (MBU) they give; the matmuls
  alone; torch.profiler's split of a step; the model step at batch 8 and 32 in FLOP/s against the matmul peak;
* batching.py ("batching"): continuous against static batching at equal KV memory, long-tailed and uniform outputs;
* serving.py ("serving"): the serving engine against the naive server, at saturation and at low load;
* speculative.py ("speculative"): speculative decoding with the draft model against its own greedy decode and
  against `transformers`' assisted generation, and with lab 06's draft head (chains and token trees), with the
  acceptance, head-call and tree-verify costs that explain each ratio;
* structured.py ("structured"): lab 10's token masks (ContextCache, MaskIndex, the trie walk and the naive scan)
  against XGrammar and llguidance on the same schemas, tokenizer and decoding traces (mask_engines.py puts each
  engine behind one interface): mask time per token, compile time per schema, and the decode step with masks;
* overheads.py ("overheads"): the engine's modes of lab 12 against its default step: overlap scheduling, the
  static-shape compiled decode step, and what batch-invariant (deterministic) mode costs;
* kv_hierarchy.py ("kv_hierarchy"): lab 13's caches on a seeded trace, no model and nothing timed: block hit rates of
  lab 02's hash cache, the radix cache and the radix cache with a host tier at three pool sizes against the ideal,
  and longest-prefix-first admission against first come, first served (hit rate, TTFT, throughput, longest wait);
* kv_engine.py ("kv_engine"): the serving engine with lab 02's hash cache and with lab 13's radix tree on the trace's
  first 30 requests (the target model): prompt tokens found cached (exact) and throughput (timed).

ledger.py writes `data/bench/ledger.json` (machine, load, versions, settings, raw samples, figures, each part's
notes) and renders the Markdown table that README carries between its `bench` markers.
"""
