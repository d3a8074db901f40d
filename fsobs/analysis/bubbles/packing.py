"""A rank's step parts (:class:`~.parts.StepParts`) or class interval sets
(:class:`~.classify.StepBubbles`) as one pickle, their arrays in one buffer per dtype.

A rank holds a dozen interval arrays per step, most of them a few elements long, and pickling
an array costs about a microsecond whatever its size: more than the data. So the arrays of
all steps travel concatenated, one buffer per dtype, with their lengths, and come back as
views of that buffer; everything else of a step is pickled as it is.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from typing import Any

import numpy as np

from fsobs.analysis.bubbles.classify import StepBubbles
from fsobs.analysis.bubbles.parts import StepParts

_ARRAYS = ("comm_rows",)
_INTERVALS = ("compute", "comm", "transfer", "everything", "loading", "loader_comm")


def pack(parts: list[StepParts]) -> bytes:
    """``parts`` pickled (:func:`unpack` gives them back)."""
    return _dumps([_split_part(part) for part in parts])


def _split_part(part: StepParts) -> tuple[dict[str, Any], list[np.ndarray]]:
    shell = dict(vars(part))
    arrays = [shell.pop(name) for name in _ARRAYS]
    arrays += [a for name in _INTERVALS for a in shell.pop(name)]
    return shell, arrays


def unpack(data: bytes) -> list[StepParts]:
    """The parts :func:`pack` pickled."""
    shells, given = _loads(data)
    parts = []
    for shell in shells:
        arrays: dict[str, Any] = {name: next(given) for name in _ARRAYS}
        arrays |= {name: (next(given), next(given)) for name in _INTERVALS}
        parts.append(StepParts(**shell, **arrays))
    return parts


def pack_bubbles(steps: list[StepBubbles]) -> bytes:
    """``steps`` pickled (:func:`unpack_bubbles` gives them back); their classes in order."""
    return _dumps([_split_bubbles(step) for step in steps])


def _split_bubbles(step: StepBubbles) -> tuple[dict[str, Any], list[np.ndarray]]:
    shell = dict(vars(step))
    classes = shell.pop("classes")
    shell["class_names"] = list(classes)
    return shell, [a for intervals in classes.values() for a in intervals]


def unpack_bubbles(data: bytes) -> list[StepBubbles]:
    """The steps :func:`pack_bubbles` pickled."""
    shells, given = _loads(data)
    steps = []
    for shell in shells:
        names = shell.pop("class_names")
        classes = {name: (next(given), next(given)) for name in names}
        steps.append(StepBubbles(**shell, classes=classes))
    return steps


def _dumps(split: list[tuple[dict[str, Any], list[np.ndarray]]]) -> bytes:
    """Each item's shell (what is pickled as it is) and arrays (concatenated per dtype)."""
    shells = [shell for shell, _ in split]
    arrays = [a for _, mine in split for a in mine]
    kinds = [a.dtype for a in arrays]
    dtypes = list(dict.fromkeys(kinds))
    which = np.array([dtypes.index(k) for k in kinds], np.int64)
    lengths = np.array([len(a) for a in arrays], np.int64)
    buffers = [
        np.concatenate([arrays[i] for i in np.flatnonzero(which == d)]) for d in range(len(dtypes))
    ]
    return pickle.dumps((shells, which, lengths, buffers), pickle.HIGHEST_PROTOCOL)


def _loads(data: bytes) -> tuple[list[dict[str, Any]], Iterator[np.ndarray]]:
    """The shells, and the arrays in the order they were given to :func:`_dumps`."""
    shells, which, lengths, buffers = pickle.loads(data)
    pieces = [_pieces(buffer, lengths[which == d]) for d, buffer in enumerate(buffers)]
    return shells, iter([next(pieces[d]) for d in which.tolist()])


def _pieces(buffer: np.ndarray, lengths: np.ndarray) -> Iterator[np.ndarray]:
    """Consecutive views of ``buffer`` of the given lengths."""
    ends = np.cumsum(lengths).tolist()
    return (buffer[lo:hi] for lo, hi in zip([0, *ends[:-1]], ends, strict=True))
