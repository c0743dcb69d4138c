"""Every output a graded notebook keeps is bounded in size, whatever its type: the `LimitOutputSize` preprocessor.

A submission decides what its cells display, so the autograded notebook and the feedback page made from it are as
large as the learner makes them (a 100 MB PNG made a 129 MiB feedback page) unless the grader bounds them:

    nb, _ = LimitOutputSize().preprocess(nb, {})      # in Autograde after execution, and in GenerateFeedback

The rule: text is cut (its head kept, "... Output truncated ..." after it); anything else too large is replaced by a
one-line note saying what it was and how large ("[output limit] image/png of 139,810,156 bytes removed: larger than
the 2 MB per-output limit"). What nbgrader grades on is never changed: an error output stays an error (cut), a
stream keeps its name (a note standing for removed stderr goes to stderr), so the grade is the same.
"""

from __future__ import annotations

import json
from typing import Any

from nbformat.notebooknode import NotebookNode
from nbformat.v4 import new_output
from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import Integer

MB = 1_000_000
TRUNCATED = "\n... Output truncated ..."
NOTE_PREFIX = "[output limit] "


def stored_size(value: Any) -> int:
    """Bytes of a value as the notebook file stores it: a string as UTF-8, anything else as JSON."""
    if isinstance(value, str):
        return len(value) if value.isascii() else len(value.encode("utf-8", "surrogatepass"))
    return len(json.dumps(value))


def is_limit_note(out: dict) -> bool:
    """Whether an output is (or holds) a note of this preprocessor."""
    text = out.get("text") if out.get("output_type") == "stream" else out.get("data", {}).get("text/plain")
    return isinstance(text, str) and text.startswith(NOTE_PREFIX)


class LimitOutputSize(NbGraderPreprocessor):
    """Bound every output, attachment and the notebook's metadata in size (see the module docstring).

    Limits (the defaults; -1 turns one off):

    * max_chars, 100,000 characters per text: a stream, a text/plain value, an error's name, message and traceback.
      Longer text is cut (nbgrader's LimitOutput only counts lines).
    * max_output_bytes, 2 MB per value of any other type (image/png, image/jpeg, image/svg+xml, text/html,
      application/json, application/javascript, widget views, ...), per output's metadata, and per value of a
      markdown cell's attachment. A larger value is replaced by a note.
    * max_cell_bytes, 4 MB of outputs (or attachments) per cell, and max_notebook_bytes, 10 MB per notebook:
      outputs past either are replaced by one note per cell; error outputs always stay.
    * max_metadata_bytes, 1 MB of notebook metadata (the widget state nbclient stores there): its largest entries
      are removed until it fits, and named in metadata["output_limits"].

    The course's own outputs are far below them: a lab's plots are PNGs of at most about 0.25 MB (0.55 MB drawn
    at twice the resolution), a lab shows a few of them, and no lab uses widgets.
    """

    max_chars = Integer(100_000, help="characters per text output (-1: no limit)").tag(config=True)
    max_output_bytes = Integer(2 * MB, help="bytes per value of any other type (-1: no limit)").tag(config=True)
    max_cell_bytes = Integer(4 * MB, help="bytes of outputs or attachments per cell (-1: no limit)").tag(config=True)
    max_notebook_bytes = Integer(10 * MB, help="bytes of outputs and attachments per notebook (-1: no limit)"
                                 ).tag(config=True)
    max_metadata_bytes = Integer(1 * MB, help="bytes of notebook metadata (-1: no limit)").tag(config=True)

    _notebook_left: float = float("inf")

    def preprocess(self, nb: NotebookNode, resources: dict) -> tuple[NotebookNode, dict]:
        self._notebook_left = _budget(self.max_notebook_bytes)
        self._limit_metadata(nb)
        return super().preprocess(nb, resources)

    def preprocess_cell(self, cell: NotebookNode, resources: dict, cell_index: int) -> tuple[NotebookNode, dict]:
        if cell.cell_type == "code":
            cell.outputs = self._bounded_outputs(cell.get("outputs", []))
        if cell.get("attachments"):
            self._bound_attachments(cell.attachments)
        return cell, resources

    # -- one value, one output

    def _cut(self, text: Any) -> str:
        text = text if isinstance(text, str) else str(text)
        return text[: self.max_chars] + TRUNCATED if 0 <= self.max_chars < len(text) else text

    def _cut_lines(self, lines: Any) -> list[str]:
        """A traceback cut to max_chars characters in all (its first lines kept)."""
        lines = [line if isinstance(line, str) else str(line) for line in lines or []]
        if self.max_chars < 0:
            return lines
        out, left = [], self.max_chars
        for line in lines:
            if len(line) > left:
                out.append(line[:left] + TRUNCATED)
                break
            out.append(line)
            left -= len(line)
        return out

    def _too_large(self, what: str, value: Any) -> str:
        """'' if value fits max_output_bytes, else what was removed ("image/png of 1,234 bytes")."""
        if self.max_output_bytes < 0:
            return ""
        size = stored_size(value)
        return f"{what} of {size:,} bytes" if size > self.max_output_bytes else ""

    def _removed_note(self, removed: list[str]) -> str:
        return (f"{NOTE_PREFIX}{', '.join(removed)} removed: larger than the {_mb(self.max_output_bytes)} "
                "per-output limit")

    def _bound_output(self, out: NotebookNode) -> None:
        """Apply the per-output limits to one output, in place."""
        if out.output_type == "stream":
            out.text = self._cut(out.get("text", ""))
        elif out.output_type == "error":
            out.ename = self._cut(out.get("ename", ""))
            out.evalue = self._cut(out.get("evalue", ""))
            out.traceback = self._cut_lines(out.get("traceback"))
        elif out.output_type in ("execute_result", "display_data"):
            data = out.get("data", {})
            if isinstance(data.get("text/plain"), str):
                data["text/plain"] = self._cut(data["text/plain"])
            removed = [r for mime, value in data.items() if (r := self._too_large(mime, value))]
            removed += [r for r in [self._too_large("output metadata", out.get("metadata", {}))] if r]
            if removed:
                out.data = NotebookNode({"text/plain": self._removed_note(removed)})
                out.metadata = NotebookNode()

    # -- a cell's outputs, a notebook's budget

    def _bounded_outputs(self, outputs: list[NotebookNode]) -> list[NotebookNode]:
        """The outputs of one cell, each bounded, those past the cell's or the notebook's budget replaced by a note."""
        kept: list[NotebookNode] = []
        cell_left = _budget(self.max_cell_bytes)
        dropped, dropped_bytes, to_stderr, limit = 0, 0, False, ""
        for out in outputs:
            self._bound_output(out)
            size = stored_size(out)
            if out.output_type != "error" and size > min(cell_left, self._notebook_left):
                limit = limit or self._budget_name(cell_left)
                dropped, dropped_bytes = dropped + 1, dropped_bytes + size
                to_stderr |= out.output_type == "stream" and out.get("name") == "stderr"
                continue
            kept.append(out)
            cell_left -= size
            self._notebook_left -= size
        if dropped:
            text = f"{NOTE_PREFIX}{dropped} output(s) of {dropped_bytes:,} bytes removed: past {limit}\n"
            kept.append(new_output("stream", name="stderr" if to_stderr else "stdout", text=text))
        return kept

    def _bound_attachments(self, attachments: NotebookNode) -> None:
        """A markdown cell's attachments: each value bounded, the cell's and the notebook's budget applied. A name
        keeps an entry (nbconvert refuses a notebook whose markdown names a missing attachment)."""
        cell_left = _budget(self.max_cell_bytes)
        for name, bundle in attachments.items():
            removed = [r for mime, value in bundle.items() if (r := self._too_large(f"attachment {mime}", value))]
            if removed:
                attachments[name] = bundle = NotebookNode({"text/plain": self._removed_note(removed)})
            size = stored_size(bundle)
            if size > min(cell_left, self._notebook_left):
                note = f"{NOTE_PREFIX}attachment of {size:,} bytes removed: past {self._budget_name(cell_left)}"
                attachments[name] = NotebookNode({"text/plain": note})
                continue
            cell_left -= size
            self._notebook_left -= size

    def _budget_name(self, cell_left: float) -> str:
        if self._notebook_left < cell_left:
            return f"the {_mb(self.max_notebook_bytes)} per-notebook limit"
        return f"the {_mb(self.max_cell_bytes)} per-cell limit"

    # -- the notebook's metadata

    def _limit_metadata(self, nb: NotebookNode) -> None:
        """Remove the largest entries of the notebook's metadata until it fits max_metadata_bytes."""
        if self.max_metadata_bytes < 0:
            return
        total = stored_size(nb.metadata)
        if total <= self.max_metadata_bytes:
            return
        sizes = {key: stored_size({key: value}) for key, value in nb.metadata.items()}   # '{"key": value}'
        removed = []
        for key in sorted(sizes, key=sizes.__getitem__, reverse=True):
            if total <= self.max_metadata_bytes:
                break
            del nb.metadata[key]
            total -= sizes[key]
            removed.append(f"{str(key)[:40]!r} ({sizes[key]:,} bytes)")
        more = f" and {len(removed) - 5} more" if len(removed) > 5 else ""
        note = (f"{NOTE_PREFIX}notebook metadata {', '.join(removed[:5])}{more} removed: past the "
                f"{_mb(self.max_metadata_bytes)} limit of notebook metadata")
        self.log.warning(note)
        nb.metadata["output_limits"] = note


def _budget(limit: int) -> float:
    return float("inf") if limit < 0 else float(limit)


def _mb(limit: int) -> str:
    return f"{limit / MB:g} MB"
