"""The course's benchmark: `make bench` (`python -m minigpt.bench`), one run, one ledger.

    python -m minigpt.bench            # about 10 minutes on the 2-core machine; --quick: about 2
    python -m minigpt.bench --readme   # README's performance table, from the committed ledger

What it measures, every figure beside its baseline, interleaved, warmed up, medians over repeats
(`minigpt.timing.compare`):

* bandwidth.py: the memory bandwidth this machine gives one thread on a working set as large as the model
  (a copy: bytes read + written / time), and its matmul peak (FLOP/s of a square fp32 matmul);
* decode.py: batch-1 decode of the course's target on one thread, per token (the slope between two answer
  lengths, so the prompt's prefill cancels out): lab 01's cached generation, the fused model, the serving engine
  (fused and as written), and `transformers`' `generate` on the same weights (eager, and with its static cache
  compiled); bytes per token by lab 00's rule and the memory-bandwidth utilisation (MBU) they give; the matmuls
  alone; torch.profiler's split of a step; the model step at batch 8 and 32 in FLOP/s against the matmul peak.

ledger.py writes `data/bench/ledger.json` (machine, load, versions, settings, raw samples, figures) and renders
the Markdown table that README carries between its `bench` markers.
"""
