"""report.html: the report's Markdown rendered to one self-contained HTML file.

The Markdown is rendered with raw HTML off, so every name in it (models, eval sets, paths:
they come from command lines and folder names) is shown as text, never interpreted; the
PNGs the Markdown links are embedded as ``data:`` URIs, so the file can be mailed or opened
anywhere on its own.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path

__all__ = ["render_html"]

_STYLE = (
    "body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;max-width:1250px;"
    "margin:2em auto;padding:0 1em;color:#222;line-height:1.45;}"
    "h1{border-bottom:2px solid #ddd;padding-bottom:.2em;}"
    "h2{border-bottom:1px solid #eee;padding-bottom:.15em;margin-top:1.8em;}"
    "table{border-collapse:collapse;margin:1em 0;font-size:.84em;display:block;"
    "overflow-x:auto;max-width:100%;}"
    "th,td{border:1px solid #ccc;padding:3px 8px;white-space:nowrap;}"
    "th{white-space:normal;vertical-align:bottom;}"
    "th{background:#f3f3f3;}tr:nth-child(even) td{background:#fafafa;}"
    "td:first-child{font-weight:600;}"
    "img{max-width:49.5%;display:inline-block;vertical-align:top;margin:.5em 0;}"
    "img:only-child{max-width:100%;}"
    "code{background:#f3f3f3;padding:0 .2em;border-radius:3px;font-size:.92em;}"
    "p{max-width:60em;}"
)


def _data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def render_html(markdown: str, title: str, root: Path) -> str:
    """HTML of ``markdown``; each image whose source is a PNG file under ``root`` is
    embedded; ``title`` is escaped."""
    from markdown_it import MarkdownIt

    md = MarkdownIt("commonmark", {"html": False}).enable("table")
    tokens = md.parse(markdown)
    root = root.resolve()
    for token in tokens:
        for child in token.children or ():
            if child.type != "image":
                continue
            src = str(child.attrGet("src") or "")
            path = (root / src).resolve()
            if path.suffix == ".png" and path.is_relative_to(root) and path.is_file():
                child.attrSet("src", _data_uri(path))
    body = md.renderer.render(tokens, md.options, {})
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head>"
        f"<body>\n{body}</body></html>\n"
    )
