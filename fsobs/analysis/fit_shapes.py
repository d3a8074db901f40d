"""The shapes of cost model that :mod:`fsobs.analysis.costfit` fits, without its imports: the
choices of ``fsobs fit-cost --shape``, read while the command line is parsed."""

FIT_SHAPES = ("additive", "padded", "auto")
"""What ``shape`` of :func:`fsobs.analysis.costfit.fit_points` takes: a sum over the samples, a
batch padded to its longest sample, or the better fit of the two."""
