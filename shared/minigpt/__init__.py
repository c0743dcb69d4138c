"""minigpt: the small Llama-style model, tokenizer and tools that every lab of the course builds on.

    from minigpt import load_model, load_tokenizer, generate_naive, SamplingParams
    model, enc = load_model("target"), load_tokenizer()
    out = generate_naive(model, enc.encode("def "), 40, SamplingParams(temperature=0.8, top_k=50, seed=0))
    print(enc.decode(out.tokens))

A Hugging Face Llama-family folder works the same way: load_model("/path/to/folder"), tokenizer_for("/path/to/folder").
"""

from minigpt.checkpoint import CheckpointError, load_card, load_model
from minigpt.config import DRAFT_CONFIG, TARGET_CONFIG, ModelConfig
from minigpt.generate import Generation, generate_naive
from minigpt.model import GPT
from minigpt.sampling import SamplingParams
from minigpt.tokenizer import EOT_ID, load_tokenizer, tokenizer_for

__all__ = ["GPT", "ModelConfig", "TARGET_CONFIG", "DRAFT_CONFIG", "load_model", "load_card", "CheckpointError",
           "load_tokenizer", "tokenizer_for", "EOT_ID", "generate_naive", "Generation", "SamplingParams"]
