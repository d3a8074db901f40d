"""What-if: predict each optimizer toggle, alone and combined, from one baseline run.

:mod:`.graph` cuts the run into a segment graph (per rank and step, local pieces between the
matched collectives), :mod:`.replay` replays it, :mod:`.calibration` fits each rank's busy time
to its data (the cost model, the ranks' speeds, the residual noise) and re-splits the batches
with optim's planner, :mod:`.priority` rewrites each step as torchrec's PEC (from the sidecars'
``id_overlap``) and reorders communication for ``priority_overlap``, and :mod:`.predict`
applies the toggles, replays every combination and gives the intervals, as the typed
:class:`~.results.WhatIf` of :mod:`.results`. :mod:`.bounds` is the floor under any split:
the imbalance no re-split can beat (a whale sample), the bound beside each prediction.
"""
