"""The text of the report's web pages: Markdown as HTML, escaping, and the ids of sections and charts."""

from __future__ import annotations

import html
import re
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
