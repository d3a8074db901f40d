"""Bubble taxonomy per rank and step (docs/design.md §5).

For every rank r and step s the **window** is split exactly into

    window = busy + straggler_wait + exposed_comm + unattributed_comm + host_idle + other

and ``contention`` is reported beside it. Each class is computed once, here, as an interval set
(so that ``fsobs export`` can draw it) and then summed. A collective is *matched* when every
rank of its process group recorded it and the ranks agree on it
(:mod:`fsobs.analysis.collectives.matching`); its wait interval on rank r is
``[a_r, min(A, end_r))`` with ``A`` the last rank's arrival.

GPU traces (the resource is the GPU; the window runs from the first GPU event launched in step s
to the first one of the next step, or is the step's CPU range when no step launched GPU work;
see :mod:`.windows`, which also counts the GPU work the windows leave out)::

    compute   |=====|      |====|             |=====|
    comm            |..wait..|xx|   |uuu|                 a_r = own start, A = last start
    memcpy                               |m|
              <--------------------- window ---------------------->
    busy = compute;  straggler_wait = wait intervals minus compute;
    exposed_comm = rest of the matched collectives minus compute;
    unattributed_comm (u) = collectives that could not be matched, minus compute;
    host_idle = no GPU event at all;  other = GPU busy with neither compute nor comm.

CPU traces (the resource is the training thread; the window is its ProfilerStep). At each
instant the training thread's **innermost op** decides (:mod:`fsobs.analysis.bubbles.optree`)::

    main thread  |aten::bmm|  glue  |All2All_Seq_ReqBackward-----|dddd|aten::cat|dd|
                    |rc|                  |c10d|                   data-loader range
    gloo thread        |~~~~~~~~~~~~~~~~~~~~~~~~~~~|xxxxx|

    1. the innermost op is a compute op (``BubbleConfig.compute_op_prefixes``: aten::,
       fbgemm::, ...) -> busy, whatever is in flight (the bmm and its resolve_conj child);
    2. else, a collective of this rank is in flight -> blocked: straggler_wait before the last
       rank's arrival, exposed_comm after (unattributed_comm if unmatched); inside a
       data-loader range only a collective that started inside it blocks (the loader waits for
       its own exchange, not for an async collective issued before it, such as the pipeline's
       input dist of the next batch: that one overlaps the loading);
    3. else, inside a data-loader range -> host_idle;
    4. else (any other op, or Python between ops) -> busy.  other = 0.

Who caused each piece of straggler wait (for :mod:`fsobs.analysis.stragglers`) comes from the
same intervals: every piece of rank r's straggler_wait is charged to the last rank of the
matched instance that covers it; where several instances' waits overlap, to the one whose last
arrival is latest (the binding one; ties: the lower instance number). So the wait the
stragglers caused adds up to the straggler_wait class exactly.

The modules: :mod:`.windows` draws a rank's step windows, :mod:`.parts` cuts its trace into
per-step interval sets (compute, communication, data loading, contention), :mod:`.classify`
turns them into the classes once the cross-rank waits are known, :mod:`.tables` sums them into
the per-step tables, :mod:`.store` keeps the class intervals of a run on disk.
"""
