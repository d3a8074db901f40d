"""Text from a run or a URL, put into Streamlit's Markdown so that it shows as exactly that text.

Streamlit renders the text of ``st.markdown``, ``st.caption``, ``st.info`` / ``warning`` /
``error`` / ``success``, metric and widget labels and ``st.page_link`` labels as GitHub Markdown
with extras: links and bare URLs, images, ``:color[...]`` and ``:material/icon:`` directives,
``$LaTeX$`` and emoji shortcodes (HTML is not rendered without ``unsafe_allow_html``, which no
page uses for such text). A run's ``run.json`` reason, a folder name, an archive member's name,
an error that quotes them, or a run id from ``?run=``, ``control=``, ``test=``, ``runs=``, could
then show every viewer a forged link or fetch an outside image. Every such string goes through
:func:`esc` (running text) or :func:`code` (inside a code span, where Markdown, bare links
included, reads nothing); the rest of a line is the page's own Markdown. Plotly's titles and
labels read HTML instead: :func:`plot_text`.
"""

from __future__ import annotations

import html
import re

MARKDOWN_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-.!|<>~$:&=^\"'])")
"""Every ASCII character that Markdown or Streamlit's extensions may read as markup (CommonMark
lets any ASCII punctuation be backslash-escaped, and shows it as itself)."""


AUTOLINK = re.compile(r"(?<=[A-Za-z0-9])(?=://|@)|(?<=www)(?=\.)", re.IGNORECASE)
"""Where GitHub Markdown's bare links start (``http://``, ``www.``, ``user@host``): found in the
text after escapes are resolved, so a backslash does not stop them; a zero-width space does."""
ZERO_WIDTH_SPACE = "\u200b"


def esc(text: object) -> str:
    """``text`` as one line of Markdown that renders as that text: every character Markdown (or
    Streamlit's ``:color[...]``, ``$math$``, HTML) could read as markup is backslash-escaped,
    an invisible zero-width space goes where a bare link would start (before ``://`` and
    ``@``, after ``www``), so that none is made, and whitespace runs (newlines too) become one
    space."""
    line = AUTOLINK.sub(ZERO_WIDTH_SPACE, " ".join(str(text).split()))
    return MARKDOWN_SPECIAL.sub(r"\\\1", line)


def code(text: object) -> str:
    """``text`` as an inline code span (Markdown reads nothing inside one), on one line: the
    fence is one backtick longer than the longest run of backticks in the text, and set off by
    a space (which the span drops) where the text starts or ends with a backtick."""
    line = " ".join(str(text).split())
    fence = "`" * (max((len(run) for run in re.findall(r"`+", line)), default=0) + 1)
    pad = " " if line.startswith("`") or line.endswith("`") else ""
    return f"{fence}{pad}{line}{pad}{fence}"


def plot_text(text: object) -> str:
    """``text`` for a Plotly title or label, which reads a subset of HTML (``<a href>``,
    ``<b>``, ``<br>``, entities): ``<``, ``>`` and ``&`` as entities, shown as themselves."""
    return html.escape(str(text), quote=False)
