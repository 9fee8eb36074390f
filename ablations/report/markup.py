"""The text of the report's web pages: Markdown as HTML, escaping, the ids of sections and charts, and the tables'
captions said once.

What several tables explain alike (the pairing, the tests, Holm, the MDE, the first-look label) is said once on the
page, above the tables, and each table keeps a one-line caption of its own with the rest of what it alone says folded
under it (:func:`shared_sentences`, :func:`split_caption`). The Markdown, LaTeX and CSV files keep every table's full
caption: a table copied out of the report carries what it needs; the page, read top to bottom, would otherwise repeat
the same fifteen lines under every table.
"""

from __future__ import annotations

import html
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

import markdown


def md(text: str, inline: bool = False) -> str:
    """Markdown (the tables' own text: ``**bold**``, lists, code) as HTML, with the text's ``<``, ``>`` and ``&``
    escaped first."""
    out = markdown.markdown(html.escape(str(text), quote=False), extensions=["tables"])
    if inline and out.startswith("<p>") and out.endswith("</p>") and out.count("<p>") == 1:
        out = out[3:-4]
    return out


def esc(text: Any) -> str:
    return html.escape(str(text))


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "x"


#: a sentence ends at a full stop, question or exclamation mark followed by a space and anything but a lower-case
#: letter or a digit (not "e.g. the", not "p. 3"; "0.05" has no space; "Δ = ..." and "`*` = ..." start sentences)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?![a-z0-9(])")


def sentences(caption: str) -> list[str]:
    """A caption's sentences, in order (whitespace normalised)."""
    return [s for s in (part.strip() for part in _SENTENCE_END.split(" ".join(caption.split()))) if s]


def shared_sentences(captions: Sequence[str]) -> list[str]:
    """The sentences two or more captions hold word for word, in the order they first appear."""
    counts = Counter(s for caption in captions for s in dict.fromkeys(sentences(caption)))
    seen = dict.fromkeys(s for caption in captions for s in sentences(caption) if counts[s] > 1)
    return list(seen)


def split_caption(caption: str, shared: Sequence[str]) -> tuple[str, list[str]]:
    """(the table's one-line caption: its first sentence that is not shared, else its first; the rest of its own
    sentences). The shared ones are said once on the page."""
    own = [s for s in sentences(caption) if s not in set(shared)]
    if not own:
        first = sentences(caption)[:1]
        return (first[0] if first else ""), []
    return own[0], own[1:]
