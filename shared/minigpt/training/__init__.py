"""How the course's tokenizer and models were made: BPE training (`bpe`), the corpus as tokens
(`data`), the seeded training script (`train`, `make models`) and evaluation (`evaluate`:
validation perplexity, draft/target agreement).
"""
