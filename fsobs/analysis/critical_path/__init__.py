"""The critical path of each step across ranks: which rank, op, kernel or collective, in order,
set the step's time, and the rank its bubble is charged to.

HTA's critical path is single-rank; this one follows the matched collectives from rank to rank
(the back-trace of HTA's and ASTRA-sim / Chakra's critical paths, extended across ranks): a
collective ends when its last member arrives, so the path goes on from the waiting rank to the
last arriver. :mod:`.chain` reduces each rank to what occupies its resource (where the rank is
reduced), :mod:`.walk` back-traces one step, :mod:`.path` runs it on every step and picks each
step's root rank, :mod:`.charge` charges the step's bubble to that rank, a phase and a cause.
"""
