"""Hugging Face model folders: run a local Llama-family checkpoint in the course, export the course's models.

* `config`    config.json <-> `ModelConfig`; what is refused and why (`UnsupportedModel` names the field).
* `weights`   HF tensor names <-> course names (copied as they are: same RoPE halves, same GQA grouping).
* `loading`   `load_hf_model(folder)`: what `minigpt.load_model("/path/to/folder")` calls.
* `tokenizer` `HFTokenizer`: a tokenizer.json behind the tiktoken-style calls the engines make.

Exporting the course's models is `python -m minigpt.export target OUT_DIR` (`minigpt.hf.export`).
"""

from minigpt.hf.config import UnsupportedModel, config_from_hf, config_to_hf
from minigpt.hf.loading import is_hf_folder, load_hf_config, load_hf_model
from minigpt.hf.tokenizer import HFTokenizer

__all__ = ["UnsupportedModel", "config_from_hf", "config_to_hf", "is_hf_folder", "load_hf_config", "load_hf_model",
           "HFTokenizer"]
