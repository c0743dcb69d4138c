"""`python -m minigpt.export target OUT_DIR`: the course's model as a Hugging Face Llama folder.

The export itself lives in `minigpt.hf.export` (it builds on the hf folder and on serving's chat template, which
the model core must not import); this module is its command-line entry point.
"""

from __future__ import annotations

import sys

from minigpt.hf.export import main

if __name__ == "__main__":
    sys.exit(main())
