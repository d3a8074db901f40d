"""What the late rank was doing while the others waited for it, read from the trace alone.

At a matched collective instance the last rank ``s`` arrives at ``A``; every other rank ``j``
waits from its own arrival ``a_j`` (until ``A``, or its own end if sooner). Over each such
window, ``s``'s timeline before its arrival says why it was late (GPU ranks)::

    rank j    a_j|..........wait..........|A
    rank s GPU   |=====kernels=====|      |nccl      gap: s's GPU idle before its collective
    rank s CPU        |ops|  |ops====|  |           (its launching threads' ranges)
                 <--gpu_active----><host><i>
                                   <---gap--->

- ``gpu_active``: the part of the window before ``s``'s last GPU idle gap: its GPU was working
  (more work, or slower work, than the others');
- ``host_bound``: inside that gap, while a CPU thread of ``s`` that launches GPU work was in a
  recorded range (an op, a launch, an annotation; not the ProfilerStep itself): the GPU starved
  for work the host had not launched yet (launch-bound, Python overhead, data loading);
- ``idle``: the rest of the gap, where nothing on ``s``'s CPU threads was recorded either.

The rank-side part (:func:`gpu_gaps`) runs where each rank is reduced: per collective, the GPU
gap before its arrival and the host-busy pieces inside it, relative to the arrival. The
cross-rank part (:func:`lateness_table`) needs the arrivals of every rank. CPU (gloo) ranks
have no GPU to starve: their rows carry ``gap -1`` and give no split.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from fsobs.analysis import intervals as iv
from fsobs.trace.categorical import codes, is_in
from fsobs.trace.schema import RankTrace

LATENESS_PARTS = ("gpu_active", "host_bound", "idle")
LATENESS_COLUMNS = ["instance", "step", "last_rank", "wait_ns"]
LATENESS_COLUMNS += [f"{part}_ns" for part in LATENESS_PARTS]
LATENESS_INPUTS = ("gpu_gap_ns", "host_busy")
"""The columns :func:`gpu_gaps` gives a rank's collectives (what the matching carries to
:func:`lateness_table`)."""
_GPU_WORK = ("compute", "comm", "memcpy", "memset")
_HOST_WORK = ("compute", "runtime", "annotation")


def gpu_gaps(
    trace: RankTrace, rows: np.ndarray, arrival: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per collective (event ``rows``, arriving at ``arrival``): the length of the GPU's idle
    gap that ends at its arrival (0 when the GPU was busy then; to the trace's start for a
    first kernel), and the host-busy pieces inside the gap as an ``(n, 2)`` array of times
    relative to the arrival (None when there are none; an object array). CPU ranks: ``-1`` and
    None."""
    pieces = np.full(len(rows), None, object)
    if trace.device != "gpu" or not len(rows):
        return np.full(len(rows), -1, np.int64), pieces
    ev = trace.events
    ts = ev["ts_ns"].to_numpy()
    end = ts + ev["dur_ns"].to_numpy()
    on_gpu = (ev["stream"].to_numpy() >= 0) & is_in(ev["kind"], _GPU_WORK)
    gpu = iv.union(ts[on_gpu], end[on_gpu])
    host = _host_busy(ev, ts, end)
    pos = np.searchsorted(gpu[1], arrival, "left") - 1  # the last GPU work ending before it
    busy_at = iv.covered(gpu, arrival - 1)
    ended = gpu[1][np.maximum(pos, 0)] if len(gpu[1]) else np.zeros(len(rows), np.int64)
    since = np.where(pos >= 0, ended, int(ts.min()))  # no GPU work yet: the trace's start
    gap = np.where(busy_at, 0, arrival - since).astype(np.int64)
    first = np.searchsorted(host[1], arrival - gap, "right")  # host: sorted, disjoint
    count = np.where(gap > 0, np.maximum(np.searchsorted(host[0], arrival, "left") - first, 0), 0)
    owner, at = iv.concat_ranges(first, count)  # every collective's host pieces, cut out at once
    a = arrival[owner]
    starts, ends = np.maximum(host[0][at], a - gap[owner]), np.minimum(host[1][at], a)
    cut = np.stack((starts, ends), axis=1) - a[:, None]
    bounds = [0, *np.cumsum(count).tolist()]
    for k in np.flatnonzero(count).tolist():
        pieces[k] = cut[bounds[k] : bounds[k + 1]]
    return gap, pieces


def _host_busy(ev: pd.DataFrame, ts: np.ndarray, end: np.ndarray) -> iv.Intervals:
    """When any CPU thread that launches GPU work is in a recorded range (not the step)."""
    on_cpu = is_in(ev["device"], ("cpu",))
    kind = ev["kind"]
    tid = codes(ev["tid"])
    launches = on_cpu & is_in(kind, ("runtime",)) & (ev["correlation"].to_numpy() >= 0)
    launching = np.zeros(len(ev["tid"].cat.categories) + 1, bool)  # by tid code; -1: NaN
    launching[tid[launches]] = True
    busy = on_cpu & is_in(kind, _HOST_WORK) & launching[tid]
    return iv.union(ts[busy], end[busy])


def lateness_table(instances: pd.DataFrame) -> pd.DataFrame:
    """Per matched instance whose last rank kept someone waiting: ``instance, step, last_rank,
    wait_ns`` (the waits of the others, each ``min(A, own end) - a_j``) and that wait split
    into ``gpu_active_ns, host_bound_ns, idle_ns`` (module docstring; NaN when the last rank
    is a CPU rank). ``instances``: clock-aligned, with the :data:`LATENESS_INPUTS` columns."""
    if instances.empty:
        return pd.DataFrame(columns=LATENESS_COLUMNS)
    is_last = (instances["rank"] == instances["last_rank"]).to_numpy()
    last = instances[is_last].drop_duplicates("instance").set_index("instance")
    waiting = instances[~is_last]
    arrival = waiting["instance"].map(last["start_ns"]).to_numpy(np.int64)
    end = np.minimum(arrival, waiting["end_ns"].to_numpy(np.int64))
    window = np.maximum(end - waiting["start_ns"].to_numpy(np.int64), 0)
    gap = waiting["instance"].map(last["gpu_gap_ns"]).to_numpy(np.int64)
    inst = waiting["instance"].to_numpy()
    frame = pd.DataFrame({"instance": inst, "w": window, "in_gap": np.minimum(window, gap)})
    sums = frame.groupby("instance", sort=True)[["w", "in_gap"]].sum()
    sums = sums[sums["w"] > 0]
    table = pd.DataFrame(
        {
            "instance": sums.index.to_numpy(),
            "step": last.loc[sums.index, "step"].to_numpy(np.int64),
            "last_rank": last.loc[sums.index, "rank"].to_numpy(np.int64),
            "wait_ns": sums["w"].to_numpy(np.int64),
        }
    )
    host = _host_bound(frame, last["host_busy"])
    cpu = last.loc[sums.index, "gpu_gap_ns"].to_numpy() < 0
    parts = {
        "gpu_active": (sums["w"] - sums["in_gap"]).to_numpy(np.float64),
        "host_bound": host.reindex(sums.index, fill_value=0).to_numpy(np.float64),
    }
    parts["idle"] = sums["in_gap"].to_numpy(np.float64) - parts["host_bound"]
    for name, values in parts.items():
        table[f"{name}_ns"] = np.where(cpu, np.nan, values)
    return table[LATENESS_COLUMNS]


def _host_bound(frame: pd.DataFrame, pieces: pd.Series) -> pd.Series:
    """Per instance, the host-busy time (ns) of its last rank inside the waiting windows
    (``frame``: instance, w per waiting rank; ``pieces``: per instance, relative to the last
    rank's arrival, all inside ``[-gap, 0)``): ``[-w, 0)`` intersected with the pieces."""
    out = {}
    for inst, mine in frame[frame["instance"].map(pieces).notna()].groupby("instance"):
        piece = pieces[inst]
        lo = np.maximum(piece[:, 0][None, :], -mine["w"].to_numpy(np.int64)[:, None])
        out[inst] = int(np.maximum(piece[:, 1][None, :] - lo, 0).sum())
    return pd.Series(out, dtype=np.int64)
