"""Range names the optimizer records in the profiler trace, for the analyzer (no torch here).

``fsobs`` reads these names; ``optim`` writes them (``torch.autograd.profiler.record_function``):

- ``## fsobs:comm:<role>:<pg_name> ##`` around the issue of every collective FreeScale sees:
  torchrec's embedding collectives (role ``embedding``), DDP's dense all-reduce (``dense``) and
  the balance toggle's exchange (``other``). gloo traces say neither the group nor the purpose
  of a collective; this range, around its enqueue on the training thread, tells the analyzer
  both (:mod:`fsobs.trace._collectives`).
- ``## fsobs:data ##`` around the preparation of a step's input (batch build, balance plan,
  shuffle exchange): a data-loader range for the CPU bubble classes.
- ``## fsobs:balance ##`` around the balance toggle's planning: inside ``## fsobs:data ##`` on
  the training thread (``FreeScale.split``), or on FreeScale's planner thread, one step ahead
  (``FreeScale.shares``, :mod:`optim.ahead`); the analyzer counts only the training thread's
  ranges in a step's time;
- ``## fsobs:balance_wait ##`` on the training thread, around its wait for a plan made ahead
  (empty when the plan was ready);
- ``## fsobs:balance_check ##`` on the training thread, around the cross-rank check of the plan
  digest (a collective, so never on the planner thread).

The descriptions of FreeScale's process groups (``optim.groups``) are here too: NCCL traces
record them, and they give each collective its role.

torchrec's Prioritized Embedding Communication (``TrainPipelinePEC``, torchrec 1.9.2) records
ranges of its own around the launch of each of its collectives; :data:`PEC_RANGES` names them
and the role each gives (:data:`PEC_ROLES`, finer than ``embedding``):

- ``pec_overlapped``: the lookup all-to-all of the IDs batch N shares with batch N-1 (looked up
  in step N with fresh weights), under ``## pec_ol_compute ##``;
- ``pec_ahead``: the lookup all-to-all of batch N+1's other IDs, issued one step ahead to
  overlap step N's compute, under ``## pec_nol_compute ##``;
- ``pec_mask``: the two int32 mask all-to-alls that tell each rank which of its rows overlap
  (``## all2all_data:ids ##`` inside ``## pec_overlap_dist ##``): plain torchrec has no such
  exchange, so it is PEC's own cost;
- ``pec_overlapped_grad``: the gradient all-to-all of step N's overlapped IDs, waited in the
  same step, under ``## pec_ol_grad_a2a ##``;
- ``pec_deferred_grad``: the gradient all-to-all of step N-1's other IDs, deferred a step to
  overlap the forward, under ``## pec_nol_grad_a2a ##``.

The gradients are two roles because they behave differently: the overlapped one is waited at
the end of its own step, the deferred one is meant to be hidden behind the next forward.
"""

from __future__ import annotations

COMM_MARKER_PREFIX = "## fsobs:comm:"
MARKER_SUFFIX = " ##"
DATA_MARKER = "## fsobs:data ##"
BALANCE_MARKER = "## fsobs:balance ##"
BALANCE_WAIT_MARKER = "## fsobs:balance_wait ##"
BALANCE_CHECK_MARKER = "## fsobs:balance_check ##"
ROLES = ("embedding", "dense", "other")
"""The roles of FreeScale's markers; every analysis reports these three."""
PEC_ROLES = (
    "pec_overlapped",
    "pec_ahead",
    "pec_mask",
    "pec_overlapped_grad",
    "pec_deferred_grad",
)
"""The roles of PEC's collectives (module docstring); reported only where they occur."""
ALL_ROLES = (*ROLES, *PEC_ROLES)
EMBEDDING_ROLES = ("embedding", *PEC_ROLES)
"""The roles of embedding communication: PEC's collectives, the mask exchange included."""
PEC_RANGES = {
    "## pec_ol_compute ##": "pec_overlapped",
    "## pec_nol_compute ##": "pec_ahead",
    "## pec_overlap_dist ##": "pec_mask",
    "## pec_ol_grad_a2a ##": "pec_overlapped_grad",
    "## pec_nol_grad_a2a ##": "pec_deferred_grad",
}
"""torchrec's PEC range around a collective's launch -> its role."""
PEC_MASK_RANGE = "## all2all_data:ids ##"
"""Inside ``## pec_overlap_dist ##``, only the collectives launched under this range are the
mask exchange (torchrec's ``TensorAllToAllValuesAwaitable``)."""
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
