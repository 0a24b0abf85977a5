"""User text in report.md and pr.md (a declared difference, an experiment or arm name, an item id, a category, a
path): it reaches GitHub's renderer, which renders raw HTML and markdown. `escape_text` makes one value read as
the text it is; `no_raw_html` makes a whole document hold no HTML tag or entity outside code (`<` and `&` written
as entities; code spans and fenced blocks show text as it is, so they are left alone)."""

from __future__ import annotations

import re

# CommonMark: a backslash before ASCII punctuation makes it literal; these are the ones that start markup (`<` and
# `&` are no_raw_html's: as entities, which a backslash before them would spoil)
MARKUP = re.compile(r"([\\`*_\[\]|~!#])")
CODE_SPAN = re.compile(r"(`+)(?:(?!\n\s*\n).)+?(?<!`)\1(?!`)", re.DOTALL)  # within a paragraph
FENCE = re.compile(r"^\s{0,3}(```+|~~~+)")


def escape_text(value: object) -> str:
    """`value` as markdown that renders as its text: no emphasis, link, code or table cell break (HTML: see
    no_raw_html, which every document goes through)."""
    return MARKUP.sub(r"\\\1", str(value).replace("\n", " "))


def _outside_code(text: str) -> str:
    """`text` (lines outside fenced blocks) with _entities applied outside its code spans (which may wrap lines)."""
    out, at = [], 0
    for span in CODE_SPAN.finditer(text):
        out += [_entities(text[at : span.start()]), span.group(0)]
        at = span.end()
    return "".join([*out, _entities(text[at:])])


def _entities(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;")


def no_raw_html(document: str) -> str:
    """The document with every `<` and `&` outside code written as an entity: no tag (`<img onerror=...>`,
    `</table><script>`) and no entity of the user's reaches the renderer, and `<port>` shows as text."""
    out: list[str] = []
    prose: list[str] = []
    fence = None
    for line in document.split("\n"):
        opened = FENCE.match(line)
        if fence is None and not opened:
            prose.append(line)
            continue
        if prose:
            out.append(_outside_code("\n".join(prose)))
            prose = []
        if fence is None:
            fence = opened.group(1)  # type: ignore[union-attr]
        elif opened and opened.group(1)[0] == fence[0] and len(opened.group(1)) >= len(fence):
            fence = None
        out.append(line)
    if prose:
        out.append(_outside_code("\n".join(prose)))
    return "\n".join(out)
