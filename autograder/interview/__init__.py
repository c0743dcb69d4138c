"""Interview practice with fresh numbers (`make interview`, `python -m autograder interview`).

* `questions.py`: seven numeric families (KV cache size, memory-bound decode tokens/s, the critical batch,
  speculative tokens per round, TP all-reduce bytes, paged-KV capacity, quantized weight bytes), each drawn from
  a seeded RNG with published model shapes and GPUs, graded by the labs' answer checker with its diagnoses.
* `reasoning.py`: README's interview questions as multiple choice, every wrong option diagnosed.
* `session.py`: the question loop, seeds, and the local score history.
"""

from autograder.interview.session import TOPICS, ask, draw_questions, run_session

__all__ = ["TOPICS", "ask", "draw_questions", "run_session"]
