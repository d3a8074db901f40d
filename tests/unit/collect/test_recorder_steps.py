"""RunRecorder.begin_step / end_step: the context manager's semantics without re-indenting the
loop; the unweighted loss; the errors of a loop that does not pair its calls."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from fsobs.collect import ProfilerConfig, RunRecorder  # noqa: E402
from fsobs.runformat import read_run_meta, read_sidecars  # noqa: E402
from tests.integration.collect.test_recorder import (  # noqa: E402
    WINDOW,
    _assert_whole_steps,
    _lengths,
    _work,
)

OFF = ProfilerConfig(enabled=False)


def _begin_end_loop(rec: RunRecorder, steps: int) -> None:
    for step in range(steps):
        rec.begin_step(step, lengths=_lengths(step))
        _work(step, _lengths(step))
        rec.end_step(ids={"t": [step, step + 1]}, loss_sum=torch.tensor(3.0 * step), loss_count=4)


def test_begin_end_writes_what_the_block_writes(tmp_path):
    """The same steps, lengths and id overlap as ``with rec.step``; the trace has whole steps;
    the loss is loss_sum / loss_count = 3 s / 4."""
    rec = RunRecorder(tmp_path / "be", profiler=WINDOW)
    _begin_end_loop(rec, 6)
    rec.close()
    block = RunRecorder(tmp_path / "block", profiler=WINDOW)
    for step in range(6):
        with block.step(step, lengths=_lengths(step), ids={"t": [step, step + 1]}) as s:
            _work(step, _lengths(step))
            s.loss = 3.0 * step / 4
    block.close()
    ours, theirs = read_sidecars(tmp_path / "be"), read_sidecars(tmp_path / "block")
    assert ours is not None and theirs is not None
    assert ours["step"].tolist() == theirs["step"].tolist() == list(range(6))
    assert [r.tolist() for r in ours["seq_lengths"]] == [_lengths(s) for s in range(6)]
    assert ours["loss"].tolist() == theirs["loss"].tolist() == [3 * s / 4 for s in range(6)]
    # {s, s+1} after {s-1, s}: 1 of 2 occurrences seen
    assert ours["id_overlap"].tolist()[1:] == [{"t": 0.5}] * 5
    assert ours["id_overlap"].tolist() == theirs["id_overlap"].tolist()
    _assert_whole_steps(tmp_path / "be" / "rank0.trace.json.gz", list(range(2, 6)))
    assert read_run_meta(tmp_path / "be" / "run.json").status == "complete"


def test_end_step_fields_replace_those_given_at_begin(tmp_path):
    rec = RunRecorder(tmp_path / "run", profiler=OFF)
    state = rec.begin_step(0, lengths=[1, 2])
    state.loss = 9.0
    rec.end_step(lengths=[5], loss=0.25)  # end's win
    state = rec.begin_step(1, lengths=[1, 2])
    state.lengths = [7, 7, 7]  # set on the state: kept
    rec.end_step(loss_sum=0.0, loss_count=0)  # an empty share: no terms, no loss
    rec.close()
    side = read_sidecars(tmp_path / "run")
    assert side is not None
    assert [r.tolist() for r in side["seq_lengths"]] == [[5], [7, 7, 7]]
    assert side["loss"].iloc[0] == 0.25 and np.isnan(side["loss"].iloc[1])


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"loss": 1.0, "loss_sum": 2.0, "loss_count": 2}, "loss: give either"),
        ({"loss_sum": 2.0}, "loss_count: loss_sum and loss_count go together"),
        ({"loss_sum": 2.0, "loss_count": -1}, "loss_count: must be an integer >= 0"),
        ({"loss_sum": 2.0, "loss_count": 1.5}, "loss_count: must be an integer >= 0"),
    ],
)
def test_a_bad_loss_names_the_field_and_fails_the_run(tmp_path, fields, message):
    rec = RunRecorder(tmp_path / "run", profiler=OFF)
    rec.begin_step(0, lengths=[1])
    with pytest.raises(ValueError, match=message):
        rec.end_step(**fields)
    meta = read_run_meta(tmp_path / "run" / "run.json")
    assert meta.status == "incomplete"
    assert meta.reason is not None and meta.reason.startswith("rank 0: ValueError in step 0: ")


def test_end_without_begin_is_one_line_and_changes_nothing(tmp_path):
    rec = RunRecorder(tmp_path / "run", profiler=OFF)
    with pytest.raises(RuntimeError, match=r"^RunRecorder.end_step\(\) without begin_step\(\)$"):
        rec.end_step(lengths=[1])
    rec.begin_step(0, lengths=[1])  # still step 0: nothing was recorded
    rec.end_step()
    rec.close()
    side = read_sidecars(tmp_path / "run")
    assert side is not None and side["step"].tolist() == [0]


def test_begin_twice_fails_the_run(tmp_path):
    """A loop that caught a step's error and went on: the step never ended."""
    rec = RunRecorder(tmp_path / "run", profiler=WINDOW)
    rec.begin_step(0, lengths=[1])
    rec.end_step()
    rec.begin_step(1, lengths=[1])
    with pytest.raises(RuntimeError, match=r"begin_step\(2\): step 1 has not ended"):
        rec.begin_step(2, lengths=[1])
    meta = read_run_meta(tmp_path / "run" / "run.json")
    assert (meta.status, meta.reason) == (
        "incomplete",
        "rank 0: begin_step(2) inside step 1, never ended",
    )
    side = read_sidecars(tmp_path / "run")
    assert side is not None and side["step"].tolist() == [0]
    with pytest.raises(RuntimeError, match="RunRecorder is failed"):
        rec.begin_step(1, lengths=[1])
    rec.close()  # nothing after a failure


def test_close_inside_a_step_without_an_error_raises_and_fails_the_run(tmp_path):
    rec = RunRecorder(tmp_path / "run", profiler=WINDOW)
    rec.begin_step(0, lengths=[1])
    with pytest.raises(RuntimeError, match=r"close\(\) inside step 0: end_step\(\) was never"):
        rec.close()
    meta = read_run_meta(tmp_path / "run" / "run.json")
    assert (meta.status, meta.reason) == (
        "incomplete",
        "rank 0: close() inside step 0, never ended",
    )


def _loop_closed_in_finally(rec: RunRecorder) -> None:
    try:
        for step in range(5):
            rec.begin_step(step, lengths=_lengths(step))
            _work(step, _lengths(step))
            if step == 3:
                raise RuntimeError("loss exploded")
            rec.end_step(loss=1.0)
    finally:
        rec.close()


def _loop_that_calls_fail(rec: RunRecorder) -> None:
    for step in range(5):
        rec.begin_step(step, lengths=_lengths(step))
        try:
            _work(step, _lengths(step))
            if step == 3:
                raise RuntimeError("loss exploded")
        except RuntimeError as error:
            rec.fail(error)
            raise
        rec.end_step(loss=1.0)


@pytest.mark.parametrize("loop", [_loop_closed_in_finally, _loop_that_calls_fail])
def test_a_step_that_raised_is_the_reason_and_its_error_goes_on(tmp_path, loop):
    """Either way the loop's own error propagates (not the recorder's), and the run is what
    ``with rec.step`` leaves: steps 0-2 in the sidecar, the trace cut in step 3."""
    import fsobs

    rec = RunRecorder(tmp_path / "run", profiler=ProfilerConfig.every_step(8))
    with pytest.raises(RuntimeError, match="^loss exploded$"):
        loop(rec)
    meta = read_run_meta(tmp_path / "run" / "run.json")
    assert (meta.status, meta.reason) == (
        "incomplete",
        "rank 0: RuntimeError in step 3: loss exploded",
    )
    side = read_sidecars(tmp_path / "run")
    assert side is not None and side["step"].tolist() == [0, 1, 2]
    assert fsobs.load_rank(tmp_path / "run" / "rank0.trace.json.gz").steps == [2, 3]


def test_the_loops_own_sidecar_fields_reach_the_line(tmp_path):
    """Sample ids, the balance fields and an ID overlap the loop worked out itself (as the
    reference job does) are written as given; ids and id_overlap together are refused."""
    rec = RunRecorder(tmp_path / "run", profiler=OFF)
    state = rec.begin_step(0, lengths=[4, 2])
    state.sample_ids = np.array([17, 3])
    state.imbalance_before, state.imbalance_after = 1.5, 1.01
    state.batch_digest = "ab12"
    state.id_overlap = {"t_item": 0.25}
    rec.end_step()
    rec.close()
    line = (tmp_path / "run" / "steps.rank0.jsonl").read_text().splitlines()[0]
    assert '"sample_ids":[17,3]' in line
    assert line.endswith(
        '"imbalance_before":1.5,"imbalance_after":1.01,"batch_digest":"ab12",'
        + '"id_overlap":{"t_item":0.25}}'
    )
    both = RunRecorder(tmp_path / "both", profiler=OFF)
    state = both.begin_step(0, lengths=[1], ids={"t": [1]})
    state.id_overlap = {"t": 1.0}
    with pytest.raises(ValueError, match="id_overlap: give either ids or id_overlap"):
        both.end_step()
