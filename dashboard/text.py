"""Text from a run or a URL, put into Streamlit's Markdown so that it shows as exactly that text.

Streamlit renders the text of ``st.markdown``, ``st.caption``, ``st.info`` / ``warning`` /
``error`` / ``success``, metric and widget labels and ``st.page_link`` labels as GitHub Markdown
with extras: links and bare URLs, images, ``:color[...]`` and ``:material/icon:`` directives,
``$LaTeX$`` and emoji shortcodes (HTML is not rendered without ``unsafe_allow_html``, which no
page uses for such text). A run's ``run.json`` reason, a folder name, an archive member's name,
an error that quotes them, or a run id from ``?run=``, ``control=``, ``test=``, ``runs=``, could
then show every viewer a forged link or fetch an outside image. Every such string goes through
:func:`esc` (running text) or :func:`code` (inside a code span); the rest of a line is the
page's own Markdown.
"""

from __future__ import annotations

import re

MARKDOWN_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-.!|<>~$:&=^\"'])")
"""Every ASCII character that Markdown or Streamlit's extensions may read as markup (CommonMark
lets any ASCII punctuation be backslash-escaped, and shows it as itself)."""


def esc(text: object) -> str:
    """``text`` as one line of Markdown that renders as exactly that text: every character
    Markdown (or Streamlit's ``:color[...]``, ``$math$``, autolinks, HTML) could read as markup
    is backslash-escaped, and whitespace runs (newlines too) become one space."""
    return MARKDOWN_SPECIAL.sub(r"\\\1", " ".join(str(text).split()))


def code(text: object) -> str:
    """``text`` as an inline code span (Markdown reads nothing inside one), on one line: the
    fence is one backtick longer than the longest run of backticks in the text, and set off by
    a space (which the span drops) where the text starts or ends with a backtick."""
    line = " ".join(str(text).split())
    fence = "`" * (max((len(run) for run in re.findall(r"`+", line)), default=0) + 1)
    pad = " " if line.startswith("`") or line.endswith("`") else ""
    return f"{fence}{pad}{line}{pad}{fence}"
