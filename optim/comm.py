"""Where FreeScale sees torchrec's embedding collectives: a stand-in for ``torch.distributed``.

torchrec issues every embedding collective (input dist, output dist, their backward) through the
module-level name ``dist`` of ``torchrec.distributed.comm_ops`` and ``dist_data`` (and PEC's
gradient all-to-alls through ``pec_comm_ops``'s), with explicit
uneven splits, and offers no hook for the sequence and backward paths. :class:`CommRouter`
replaces that name (and only there; ``torch.distributed`` itself is untouched) with an object
that forwards everything to ``torch.distributed`` and, for the collectives, also:

1. records ``## fsobs:comm:embedding:<pg_name> ##`` around the issue, so the analyzer knows the
   role and, on gloo, the group of each collective (:mod:`optim.markers`);
2. tells the dense gate (:mod:`optim.ddp`) when the backward embedding all-to-all of a step has
   been issued (a collective issued while autograd runs a backward graph);
3. hands ``all_to_all_single`` on the embedding group to another implementation when one is
   set (the ``sm_free`` toggle's padded copy-engine all-to-all, :mod:`optim.sm_free`).

:func:`install` puts the router in place and returns a function that puts the originals back.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any, cast

import torch
import torch.distributed as dist
from torch.autograd.profiler import record_function

from optim.markers import comm_marker

TORCHREC_COMM_MODULES = (
    "torchrec.distributed.comm_ops",
    "torchrec.distributed.dist_data",
    "torchrec.distributed.pec_comm_ops",  # PEC's gradient all-to-alls
)
_COLLECTIVES = (
    "all_to_all_single",
    "all_to_all",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_reduce",
)
AllToAllSingle = Callable[..., Any]


class CommRouter:
    """Stands in for ``torch.distributed`` inside torchrec's comm modules (module docstring)."""

    def __init__(
        self,
        *,
        on_backward_issue: Callable[[], None] | None = None,
        embedding_group: dist.ProcessGroup | None = None,
        all_to_all_single: AllToAllSingle | None = None,
    ) -> None:
        self._on_backward_issue = on_backward_issue
        self._embedding_group = embedding_group
        self._all_to_all_single = all_to_all_single

    def __getattr__(self, name: str) -> Any:
        target = getattr(dist, name)
        if name not in _COLLECTIVES:
            return target
        return lambda *args, **kwargs: self._issue(name, target, *args, **kwargs)

    def _issue(self, name: str, target: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        # dist.group.WORLD is None only before init_process_group
        group = cast(dist.ProcessGroup, kwargs.get("group") or dist.group.WORLD)
        if name == "all_to_all_single" and self._all_to_all_single is not None:
            if group is self._embedding_group:
                target = self._all_to_all_single
        with record_function(comm_marker("embedding", group.group_name)):
            work = target(*args, **kwargs)
        if self._on_backward_issue is not None and torch._C._current_graph_task_id() != -1:
            self._on_backward_issue()
        return work


def install(
    router: CommRouter, modules: tuple[str, ...] = TORCHREC_COMM_MODULES
) -> Callable[[], None]:
    """Replace ``dist`` in ``modules`` with ``router``; return the function that undoes it."""
    replaced: list[tuple[ModuleType, Any]] = []
    for name in modules:
        module = importlib.import_module(name)
        replaced.append((module, module.dist))
        module.dist = router  # type: ignore[attr-defined]  # torchrec's global, swapped

    def uninstall() -> None:
        for module, original in replaced:
            module.dist = original  # type: ignore[attr-defined]  # and put back

    return uninstall
