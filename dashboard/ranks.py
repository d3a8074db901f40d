"""Which ranks the Bubbles page draws, and per-rank data folded for big runs (no Streamlit).

A 64- or 256-rank run cannot show every rank in every chart: a heatmap row or a timeline lane
per rank stops being readable, and a legend entry per rank fills the screen. So:

- The **timeline** and the **straggler-wait heatmap** show the ranks the user chose
  (:func:`choose_ranks`): all of them, the top *k* stragglers (most straggler wait caused), a
  range, or a list such as ``0-3, 8, 12``. Runs above :data:`AGGREGATE_ABOVE` ranks open on
  the top :data:`DEFAULT_TOP_K` stragglers; the timeline draws at most
  :data:`MAX_TIMELINE_RANKS` of the chosen ranks.
- **Per-rank bar charts** (bubble classes per rank, HTA's temporal breakdown) above
  :data:`AGGREGATE_ABOVE` ranks show the :data:`DEFAULT_TOP_K` ranks with the highest score
  (e.g. bubble per step) one by one and the others as one bar of their mean
  (:func:`top_and_rest`): the bars still stack to a rank's (or the mean rank's) total.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import pandas as pd

AGGREGATE_ABOVE = 32
"""Runs with more ranks than this get aggregated per-rank charts and a default rank filter."""
DEFAULT_TOP_K = 16
MAX_TIMELINE_RANKS = 32
"""Most ranks drawn in the step timeline (each rank is up to six lanes)."""
OTHERS = "others"
"""Label of the bar that stands for the mean of the ranks not shown one by one."""
MODES = {
    "all": "All",
    "top": "Top stragglers",
    "range": "Range",
    "list": "List",
}
"""Rank filter modes: URL value -> label."""


@dataclass(frozen=True)
class RankChoice:
    """The chosen ranks (ascending), what they are in words, and what could not be used."""

    ranks: list[int]
    label: str
    problems: list[str] = field(default_factory=list)


def default_mode(num_ranks: int) -> str:
    """``all`` up to :data:`AGGREGATE_ABOVE` ranks, else ``top``."""
    return "all" if num_ranks <= AGGREGATE_ABOVE else "top"


def top_stragglers(per_rank: pd.DataFrame, k: int) -> list[int]:
    """The ``k`` ranks that caused the most straggler wait (``Stragglers.per_rank``: rank,
    times_last, wait_caused_ms), ties broken by times last, then by rank; ascending."""
    order = per_rank.assign(_neg=-per_rank["rank"]).sort_values(
        ["wait_caused_ms", "times_last", "_neg"], ascending=False, kind="stable"
    )
    return sorted(int(r) for r in order["rank"].head(max(0, k)))


_PART = re.compile(r"^(\d+)(?:-(\d+))?$")


def parse_rank_list(text: str, ranks: Sequence[int]) -> tuple[list[int], list[str]]:
    """``"0-3, 8 12"`` -> ([0, 1, 2, 3, 8, 12], problems): ranks and ranges (``a-b``, ``a..b``)
    separated by commas or spaces; parts that are not numbers, and ranks the run does not
    have, are left out and named in ``problems``."""
    known, chosen, problems = set(ranks), set(), []
    for part in re.split(r"[,;\s]+", re.sub(r"\s*(?:-|–|\.\.)\s*", "-", text.strip())):
        if not part:
            continue
        match = _PART.match(part)
        if match is None:
            problems.append(f"not a rank or range: {part!r}")
            continue
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) is not None else first
        wanted = set(range(min(first, last), max(first, last) + 1))
        missing = wanted - known
        if missing == wanted:
            problems.append(f"no rank {part} in this run")
        elif missing:
            problems.append(f"{part}: {len(missing)} rank(s) not in this run")
        chosen |= wanted & known
    return sorted(chosen), problems


def format_ranks(ranks: Sequence[int]) -> str:
    """``[0, 1, 2, 3, 8]`` -> ``"0–3, 8"``."""
    runs: list[list[int]] = []
    for rank in sorted(ranks):
        if runs and rank == runs[-1][1] + 1:
            runs[-1][1] = rank
        else:
            runs.append([rank, rank])
    return ", ".join(str(a) if a == b else f"{a}–{b}" for a, b in runs)


def choose_ranks(
    mode: str,
    ranks: Sequence[int],
    per_rank: pd.DataFrame,
    *,
    k: int = DEFAULT_TOP_K,
    span: tuple[int, int] | None = None,
    text: str = "",
) -> RankChoice:
    """The ranks of one mode (:data:`MODES`); an empty or unusable choice falls back to the
    default of the run's size, with the reason in ``problems``."""
    ranks = sorted(ranks)
    if mode == "top":
        chosen = top_stragglers(per_rank, k)
        label = f"the {len(chosen)} rank(s) that caused the most straggler wait"
        return RankChoice(chosen, label) if chosen else _fallback(ranks, per_rank, [])
    if mode == "range" and span is not None:
        first, last = min(span), max(span)
        chosen = [r for r in ranks if first <= r <= last]
        return RankChoice(chosen, f"ranks {first}–{last}")
    if mode == "list":
        chosen, problems = parse_rank_list(text, ranks)
        if chosen:
            return RankChoice(chosen, f"ranks {format_ranks(chosen)}", problems)
        return _fallback(ranks, per_rank, problems or ["the list names no rank"])
    return RankChoice(list(ranks), f"all {len(ranks)} ranks")


def _fallback(ranks: list[int], per_rank: pd.DataFrame, problems: list[str]) -> RankChoice:
    if default_mode(len(ranks)) == "all":
        return RankChoice(list(ranks), f"all {len(ranks)} ranks", problems)
    chosen = top_stragglers(per_rank, DEFAULT_TOP_K) or ranks[:DEFAULT_TOP_K]
    return RankChoice(chosen, f"the top {len(chosen)} stragglers", problems)


def top_and_rest(
    frame: pd.DataFrame, score: pd.Series, *, k: int = DEFAULT_TOP_K
) -> tuple[pd.DataFrame, int]:
    """Rows of ``frame`` (indexed by rank) for a per-rank bar chart, labelled by rank number.
    Above :data:`AGGREGATE_ABOVE` ranks: the ``k`` ranks with the highest ``score``
    (descending), then one row :data:`OTHERS` holding the mean of each column over the rest.
    Returns the labelled frame and the number of ranks folded into the last row (0 if none)."""
    if len(frame) <= AGGREGATE_ABOVE:
        return frame.set_axis([str(r) for r in frame.index]), 0
    order = score.reindex(frame.index).fillna(float("-inf"))
    top = order.sort_values(ascending=False, kind="stable").index[:k]
    rest = frame.drop(index=top)
    shown = frame.loc[top].set_axis([str(r) for r in top])
    mean = rest.mean().to_frame(OTHERS).T
    return pd.concat([shown, mean]), len(rest)
