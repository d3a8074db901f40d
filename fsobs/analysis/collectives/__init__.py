"""Collectives across ranks: each rank's collectives matched into instances (:mod:`.matching`),
the ranks' clocks aligned on them (:mod:`.clocks`), all-to-all volumes and splits
(:mod:`.alltoall`), and what the last rank to arrive was doing meanwhile (:mod:`.lateness`).

The layer under the bubble classes, the stragglers and the critical path: it imports none of
them."""
