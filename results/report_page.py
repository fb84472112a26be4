"""The report's page as data (``Section``: text, bullets, tables, figures, code) and its two
renderings: HTML from the Jinja2 template results/templates/report.html, and Markdown with its
images beside it. What comes from the store is escaped in both."""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import jinja2
import pandas as pd
from markupsafe import Markup
from matplotlib.figure import Figure

from results.figures import figure_bytes
from results.render import render


# -- blocks: one description of the page, rendered to HTML and Markdown -------------------------
@dataclass
class Section:
    title: str
    blocks: list = field(default_factory=list)

    def text(self, markdown: str) -> Section:
        self.blocks.append(("text", markdown))
        return self

    def bullets(self, items: Sequence[str]) -> Section:
        self.blocks.append(("bullets", list(items)))
        return self

    def table(self, frame: pd.DataFrame) -> Section:
        self.blocks.append(("table", frame))
        return self

    def figure(self, figure: Figure | None, name: str, caption: str) -> Section:
        if figure is not None:
            self.blocks.append(("figure", (figure_bytes(figure, "png"), name, caption)))
        return self

    def code(self, text: str) -> Section:
        self.blocks.append(("code", text))
        return self


def _inline_html(text: str) -> Markup:
    """Markdown's `code` and **bold** in escaped text, the only inline marks the page uses."""
    parts = html.escape(text).split("`")
    out = "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))
    bold = out.split("**")
    return Markup("".join(f"<strong>{p}</strong>" if i % 2 else p for i, p in enumerate(bold)))


def _html_table(frame: pd.DataFrame) -> Markup:
    return Markup(frame.to_html(index=False, escape=True, na_rep="", border=0))


def _base64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# The page's HTML is results/templates/report.html, shipped as package data; autoescape escapes
# every value from the store, and the filters mark what is already HTML.
_PAGES = jinja2.Environment(
    loader=jinja2.PackageLoader("results", "templates"),
    autoescape=True,
    keep_trailing_newline=True,
    undefined=jinja2.StrictUndefined,
)
_PAGES.filters.update(inline=_inline_html, html_table=_html_table, base64=_base64)


def to_html(title: str, subtitle: str, sections: Sequence[Section]) -> str:
    """The page as one self-contained HTML file (figures embedded as base64 PNG).

    Args:
        title: the page's title (its <title> and first heading).
        subtitle: the line under the title; `code` and **bold** marks are kept.
        sections: the page's sections, in order.
    """
    return _PAGES.get_template("report.html").render(title=title, subtitle=subtitle, sections=sections)


def _markdown_inline(text: str) -> str:
    """`text` for Markdown, escaped as the HTML page escapes it: <, > and & as entities and [ ]
    backslashed outside `code` spans (whose content Markdown shows as is). Values from the store
    (experiment names, params, tags) may hold backticks that would move a span's end: a text
    whose backticks do not pair up one by one is escaped whole."""
    def escape(part: str) -> str:
        return html.escape(part, quote=False).replace("[", r"\[").replace("]", r"\]")

    if "``" in text or "\\`" in text or text.count("`") % 2:
        return escape(text)
    parts = text.split("`")
    return "`".join(p if i % 2 else escape(p) for i, p in enumerate(parts))


def _markdown_cells(frame: pd.DataFrame) -> pd.DataFrame:
    """Every cell as escaped text on one line (a newline would end the table's row)."""
    text = frame.astype(object).fillna("")
    return text.map(lambda v: _markdown_inline(" ".join(v.splitlines())) if isinstance(v, str) else v)


def _fence(text: str) -> str:
    """A code fence longer than any run of backticks in `text`, which cannot end it early."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def to_markdown(
    title: str, subtitle: str, sections: Sequence[Section], image_dir: str
) -> tuple[str, list[tuple[str, bytes]]]:
    """The page as Markdown and its images as (relative path, PNG bytes). What comes from the
    store is escaped as in the HTML page: raw HTML in a name or param shows as text."""
    md = _markdown_inline
    lines, images = [f"# {md(title)}", "", md(subtitle), ""], []
    for section in sections:
        lines += [f"## {md(section.title)}", ""]
        for kind, content in section.blocks:
            if kind == "text":
                lines += [md(content), ""]
            elif kind == "bullets":
                lines += [*(f"- {md(item)}" for item in content), ""]
            elif kind == "table":
                lines += [render(_markdown_cells(content), "md")]
            elif kind == "code":
                fence = _fence(content)
                lines += [fence, content.rstrip(), fence, ""]
            else:
                png, name, caption = content
                path = f"{image_dir}/{name}.png"
                images.append((path, png))
                lines += [f"![{md(caption)}]({path})", "", f"*{md(caption)}*", ""]
    return "\n".join(lines), images


