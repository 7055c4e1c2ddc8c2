"""The page itself: ``template.html`` (plain HTML, CSS and JavaScript; no framework, no network) with the report's
data inlined as one JSON block."""
from __future__ import annotations

import html
import json
from importlib import resources

TEMPLATE = "template.html"
_DATA, _TITLE = "__DATA__", "__TITLE__"


def render(data: dict) -> str:
    """The HTML of one report (``page.page_data``); a non-finite number in ``data`` is a ValueError naming it."""
    template = resources.files("reach_lens.report").joinpath(TEMPLATE).read_text(encoding="utf-8")
    text = json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    # inside <script>: "</" would end the element; "<\/" is the same JSON string
    return template.replace(_TITLE, html.escape(data["title"])).replace(_DATA, text.replace("</", "<\\/"))
