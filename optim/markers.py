"""Range names the optimizer records in the profiler trace, for the analyzer (no torch here).

``fsobs`` reads these names; ``optim`` writes them (``torch.autograd.profiler.record_function``):

- ``## fsobs:comm:<role>:<pg_name> ##`` around the issue of every collective FreeScale sees:
  torchrec's embedding collectives (role ``embedding``), DDP's dense all-reduce (``dense``) and
  the balance toggle's exchange (``other``). gloo traces say neither the group nor the purpose
  of a collective; this range, around its enqueue on the training thread, tells the analyzer
  both (:mod:`fsobs.trace._collectives`).
- ``## fsobs:data ##`` around the preparation of a step's input (batch build, balance plan,
  shuffle exchange): a data-loader range for the CPU bubble classes.
- ``## fsobs:balance ##`` around the balance toggle's work inside it.

The descriptions of FreeScale's process groups (``optim.groups``) are here too: NCCL traces
record them, and they give each collective its role.
"""

from __future__ import annotations

COMM_MARKER_PREFIX = "## fsobs:comm:"
MARKER_SUFFIX = " ##"
DATA_MARKER = "## fsobs:data ##"
BALANCE_MARKER = "## fsobs:balance ##"
ROLES = ("embedding", "dense", "other")
EMB_DESC = "freescale_emb"
DENSE_DESC = "freescale_dense"
BALANCE_DESC = "freescale_balance"


def comm_marker(role: str, pg_name: str) -> str:
    """The range name for a collective of ``role`` issued on the group named ``pg_name``."""
    if role not in ROLES:
        raise ValueError(f"role: unknown {role!r}, expected one of {list(ROLES)}")
    return f"{COMM_MARKER_PREFIX}{role}:{pg_name}{MARKER_SUFFIX}"


def parse_comm_marker(name: str) -> tuple[str, str] | None:
    """``(role, pg_name)`` of a :func:`comm_marker` range name, None for any other name."""
    if not (name.startswith(COMM_MARKER_PREFIX) and name.endswith(MARKER_SUFFIX)):
        return None
    role, sep, pg_name = name[len(COMM_MARKER_PREFIX) : -len(MARKER_SUFFIX)].partition(":")
    if not sep or role not in ROLES or not pg_name:
        return None
    return role, pg_name
