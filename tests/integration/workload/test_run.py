"""The reference job end to end: torchrun, 2 gloo ranks, real torchrec DMP, real profiler."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

import fsobs
from fsobs.cli import main
from fsobs.collect.profiler import ProfilerConfig
from fsobs.workload.config import JobConfig, ModelConfig, ModelSpec, data_config_for, job_profiler
from fsobs.workload.data import SyntheticHistories, global_batches, random_split
from fsobs.workload.launch import LaunchConfig, failure_report, launch
from fsobs.workload.model import EBC_TABLES, EC_TABLES
from fsobs.workload.overlap import global_batch_overlaps
from fsobs.workload.train import FAIL_ENV

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]
STEPS, BATCH = 6, 8


def _tiny_job(steps: int, **fields: object) -> JobConfig:
    model = ModelSpec(size="tiny")
    fields.setdefault("profiler", job_profiler(steps))
    data = data_config_for(model.config())
    return JobConfig(steps=steps, batch_size=BATCH, model=model, data=data, **fields)


THIRD_PARTY = ("Warning", "warn", "torchrec", "torch/", "STAGE", "profiler", "USDT", "[rank")
"""What the ranks' libraries print (planner FutureWarnings, DDP notices, fx-tracing and
profiler lines): never on the console of a run, always in its logs."""


def test_two_rank_run_writes_an_analyzable_run(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["run", "--world-size", "2", "--steps", str(STEPS), "--out", str(out)]
    assert main([*argv, "--model-size", "tiny", "--batch-size", str(BATCH)]) == 0
    console = capsys.readouterr()
    assert console.out.strip() == f"wrote {out}; analyze it with: fsobs analyze {out}"
    lines = console.err.strip().splitlines()  # ours: where the logs are, then the final bar
    assert lines[0] == f"fsobs run: 2 rank(s) on this node; their output: {out / 'logs'}/"
    assert len(lines) == 2 and lines[1].startswith("fsobs run: done")
    assert f"{STEPS}/{STEPS} steps · last " in lines[1]
    for noise in THIRD_PARTY:
        assert noise not in console.out + console.err, noise
    logs = {p.name: p.read_text() for p in (out / "logs").iterdir()}
    assert sorted(logs) == ["rank0.log", "rank1.log", "torchrun.log"]
    for rank in (0, 1):
        assert any(noise in logs[f"rank{rank}.log"] for noise in THIRD_PARTY), logs

    meta = json.loads((out / "run.json").read_text())
    assert (meta["status"], meta["world_size"], meta["ranks_present"]) == ("complete", 2, [0, 1])
    job = JobConfig.from_json(json.loads((out / "job.json").read_text()))  # what the ranks read
    assert job == _tiny_job(STEPS) and meta["workload"] == job.to_json()
    assert (meta["backend"], meta["device"], meta["simulated"]) == ("gloo", "cpu", False)
    assert meta["workload"]["model"]["size"] == "tiny" and meta["versions"]["torchrec"]
    assert meta["toggles"]["sm_free"] == {"requested": False, "applied": False, "reason": None}

    run = fsobs.load_run(out)
    assert run.rank_ids == [0, 1] and run.warnings == []
    assert run.steps == list(range(2, STEPS))  # one wait and one warm-up step are not traced
    assert run[0].backend == "gloo" and run.device == "cpu"

    # the sidecar holds exactly the samples each rank consumed, every step
    data = SyntheticHistories(data_config_for(ModelConfig.preset("tiny"), num_samples=100_000))
    side = run.sidecar.set_index(["rank", "step"])
    batches = global_batches(len(data), 2 * BATCH, STEPS, 0)
    for step, batch in enumerate(batches):
        for rank in (0, 1):
            lengths = data.lengths[random_split(batch, 2, rank)]
            row = side.loc[(rank, step)]
            assert row["num_samples"] == BATCH
            assert (row["len_sum"], row["len_sq_sum"]) == (lengths.sum(), (lengths**2).sum())
            assert row["est_cost"] > 0
    # and, the same on both ranks, every embedding table's ID overlap with the previous global
    # batch (none on the first step), toggles off as here
    overlaps = global_batch_overlaps(data, batches, {**EBC_TABLES, **EC_TABLES})
    for rank in (0, 1):
        assert side.loc[(rank, 0), "id_overlap"] is None
        for step in range(1, STEPS):
            shares = side.loc[(rank, step), "id_overlap"]
            assert sorted(shares) == ["t_cat", "t_ctx", "t_item", "t_user"]
            assert shares == pytest.approx(overlaps[step])
            assert all(0 <= v <= 1 for v in shares.values())

    analysis = fsobs.analyze_path(out)
    assert len(analysis.steps) == 2 * len(run.steps)
    assert analysis.collectives.problems.empty
    assert analysis.collectives.instances["coll"].isin(["all_to_all", "all_reduce"]).any()
    assert analysis.attribution is not None
    assert np.isfinite(analysis.summary["bubble_ratio"])
    # the job marks its input preparation as a data-loader range: host_idle is measured in
    # the steps that prepared a batch (the pipeline stops pulling two steps before the end)
    for rank in run.rank_ids:
        events = run[rank].events
        loading = set(events.loc[events["name"] == "## fsobs:data ##", "step"]) & set(run.steps)
        assert loading == set(run.steps[:-2])
        mine = analysis.steps[analysis.steps["rank"] == rank].set_index("step")
        assert (mine.loc[sorted(loading), "host_idle_ms"] > 0).all()


def test_a_crashed_rank_leaves_an_incomplete_analyzable_run(tmp_path):
    out = tmp_path / "run"
    config = LaunchConfig(
        world_size=2,
        out=out,
        job=_tiny_job(8, profiler=ProfilerConfig(active=2, repeat=2, record_shapes=False)),
        env={FAIL_ENV: "1:6"},  # rank 1 dies at step 6, after the first trace export (step 3)
    )
    assert launch(config, progress=False) != 0
    meta = json.loads((out / "run.json").read_text())
    assert meta["status"] == "incomplete" and "torchrun exited" in meta["reason"]
    report = failure_report(out)  # what `fsobs run` prints: rank 1, its log's path and tail
    assert report.startswith("rank 1 failed first (exit code 3), then torchrun stopped rank(s) 0")
    assert f"last lines of {out / 'logs' / 'rank1.log'}:" in report
    run = fsobs.load_run(out)
    assert run.rank_ids == [0, 1] and run.steps == [2, 3]
    assert sorted(run.sidecar.loc[run.sidecar["rank"] == 1, "step"]) == list(range(6))
    assert not list(out.glob("*.partial")) and not list(out.glob(".*.tmp"))
    analysis = fsobs.analyze_path(out)
    assert set(analysis.steps["step"]) == {2, 3}
    assert main(["analyze", str(out), "--json"]) == 0


def _losses(run_dir):
    lines = (run_dir / "steps.rank0.jsonl").read_text().splitlines()
    return [json.loads(line)["loss"] for line in lines]


def test_profiling_does_not_change_what_is_trained(tmp_path):
    """Same seed and batches, profiler on and off: the same losses, bit for bit."""
    job = _tiny_job(5)
    on, off = tmp_path / "on", tmp_path / "off"
    assert launch(LaunchConfig(world_size=2, out=on, job=job), progress=False) == 0
    no_profile = dataclasses.replace(job, profiler=job_profiler(5, enabled=False))
    assert launch(LaunchConfig(world_size=2, out=off, job=no_profile), progress=False) == 0
    assert list(off.glob("*.trace.json.gz")) == []
    assert _losses(on) == _losses(off)
    assert len(set(_losses(on))) > 1  # it trains: the loss moves


def test_priority_overlap_runs_the_job_on_pec(tmp_path):
    """With priority_overlap the job's EmbeddingCollection (t_item, t_cat) trains on torchrec's
    PEC pipeline; its EmbeddingBagCollection stays plain, and run.json says both. PEC's
    collectives carry their roles into the analysis."""
    from optim import FreeScaleConfig, PriorityConfig

    out = tmp_path / "pec"
    job = _tiny_job(STEPS, freescale=FreeScaleConfig(priority_overlap=PriorityConfig(enabled=True)))
    assert launch(LaunchConfig(world_size=2, out=out, job=job), progress=False) == 0
    toggle = json.loads((out / "run.json").read_text())["toggles"]["priority_overlap"]
    assert (toggle["requested"], toggle["applied"]) == (True, True)
    assert toggle["reason"].startswith(
        "partly applied: torchrec's PEC (TrainPipelinePEC, gradients exact) on tables t_item, "
        "t_cat; not on ebc: an EmbeddingBagCollection (PEC takes EmbeddingCollections only); "
        "dense order: auto: after_embedding (the backward's embedding all-to-all came after "
    )
    # the EmbeddingBagCollection's backward all-to-all (plain torchrec) is issued in the
    # backward: the dense buckets wait for it
    analysis = fsobs.analyze_path(out)
    roles = set(analysis.roles["role"])
    # every PEC collective of a steady step: the first traced step follows the warm-up ones
    assert {"pec_overlapped", "pec_ahead", "pec_mask", "pec_overlapped_grad"} <= roles
    assert "pec_deferred_grad" in roles
    assert len(_losses(out)) == STEPS
