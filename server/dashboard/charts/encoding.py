"""The JSON a chart answers: NaN and infinities as data, and text that can never become a link or
markup where a browser shows it (docs/security.md)."""

from __future__ import annotations

import json
import re
from typing import Any

from hpo.server.analysis.service import json_safe


def dumps(value: Any) -> bytes:
    """Compact JSON; non-finite floats become null (the slow walk only when there is one). Markup
    in any text is neutralised (`plain_json`)."""
    try:
        body = json.dumps(value, allow_nan=False, separators=(",", ":"), default=_plain).encode()
    except ValueError:
        body = json.dumps(json_safe(value), separators=(",", ":"), default=_plain).encode()
    return plain_json(body)


# Plotly draws `<a href=...>` in any text it is given (hover, legend, tick labels, titles) as a
# link, and `<span style=...>` as styled text. Chart text comes from specs and from trial code (a
# metric's name is any text a trial posts), so in every chart answer a `<` that opens a tag, but
# the hover's own `<br>`, becomes U+2039 `‹`, which Plotly shows as text (docs/security.md, "The
# dashboard"). In JSON a `<` occurs only inside strings, so one scan of the bytes finds them all.
_MARKUP = re.compile(rb"<(?=/?[A-Za-z])(?!br>)")

_MARKUP_TEXT = re.compile(r"<(?=/?[A-Za-z])(?!br>)")

LOOKALIKE = "\u2039"


def plain_json(body: bytes) -> bytes:
    """JSON bytes with every tag-opening `<` in its strings but `<br>` written as `‹` (an escape)."""
    return _MARKUP.sub(rb"\\u2039", body) if b"<" in body else body


def plain_text(value: Any) -> Any:
    """`value` (text, or lists and dicts holding text) as Plotly must draw it: never a link or styled
    markup (`plain_json` for an answer not yet in JSON)."""
    if isinstance(value, str):
        return _MARKUP_TEXT.sub(LOOKALIKE, value) if "<" in value else value
    if isinstance(value, dict):
        return {plain_text(k): plain_text(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain_text(v) for v in value]
    return value


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=str)
    raise TypeError(f"not JSON: {type(value).__name__}")
