"""Communication the analyzer was never told about (issue 24, point 6): kernels that move data
between ranks without NCCL's names count as communication by a documented list
(:data:`fsobs.trace.classify.COMM_KERNEL_PATTERNS`), which the user extends
(``LoadConfig.comm_kernels``, ``--comm-kernel``). Expected values derived by hand."""

from __future__ import annotations

import json

import pytest

import fsobs
from fsobs.cli import main
from fsobs.trace import LoadConfig
from fsobs.trace.classify import classify, comm_kernel_re
from tests.support.bubble_rows import checked_table, expect_row
from tests.support.kineto import kernel, launch, step, trace, write

DISPATCH = "void deep_ep::intranode::dispatch<8, 768, 8192>(int4*, float*, int*, long*)"
COMBINE = "void deep_ep::internode::combine<__nv_bfloat16, 4, 8>(int4*, float*, int const*)"
LAYOUT = "void deep_ep::layout::get_dispatch_layout<256, 32, 8>(long const*, int*, int*)"
OWN = "void my_team::ep_exchange_tokens_kernel<128>(float*, int)"


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        (DISPATCH, "comm"),
        (COMBINE, "comm"),
        ("void deep_ep::intranode::notify_dispatch<8>(int const*, int*, int)", "comm"),
        ("void deep_ep::internode_ll::dispatch<false, 3, 7168>(void*, float*)", "comm"),
        ("void deep_ep::intranode::cached_notify_combine<8>(void**, int*)", "comm"),
        (LAYOUT, "compute"),  # counts tokens per rank locally: no data leaves the GPU
        ("void nvshmemi_barrier_all_kernel()", "comm"),
        ("void mori::moe::EpDispatchIntraNodeKernel<__hip_bfloat16>(...)", "comm"),
        ("void c10d::symmetric_memory::one_shot_all_reduce_kernel<float, 8>(...)", "comm"),
        ("void vllm::cross_device_reduce_1stage<half, 8>(...)", "comm"),
        ("custom_all_to_all_v_kernel", "comm"),
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "comm"),
        ("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_tn", "compute"),
        (OWN, "compute"),  # not on the list: compute, until the user says otherwise
    ],
)
def test_the_documented_list(name, kind):
    assert classify("kernel", name) == kind


# Every kernel of DeepSeek's released training trace (deepseek-ai/profile-data, train.json at
# 449602428a1b023acb8a505d4f34fef536535db6: DualPipe, EP64) whose name holds "dpsk::", verbatim;
# the four expert-parallel kernels took 113.0 ms of its one step, counted as compute before.
DPSK_COMM = (
    "void dpsk::ep::internode::cached_notify<false>(int, int, int, int, int*, int, int, int "
    "const*, int const*, int*, void*, void**, int**, int, int, int, int*, bool, int)",
    "void dpsk::ep::internode::combine<false, 8, __nv_bfloat16, 8, 2, 16, 24>(int4*, float*, "
    "bool const*, int4 const*, float const*, int4 const*, int4 const*, int const*, int const*, "
    "dpsk::ep::internode::SourceMeta const*, int const*, int const*, int const*, int, int, int, "
    "int, void*, int, int, void**, int, int, int, int, int*)",
    "void dpsk::ep::internode::dispatch<false, 8, false, 8>(int4*, float*, long*, float*, "
    "dpsk::ep::internode::SourceMeta*, int4 const*, float const*, long const*, float const*, "
    "int*, int*, int*, int*, int const*, int const*, int const*, int const*, int, int, int, int, "
    "int, bool const*, void*, int, int, void**, int, int, int, int, int*)",
    "void dpsk::ep::internode::dispatch<false, 8, true, 8>(int4*, float*, long*, float*, "
    "dpsk::ep::internode::SourceMeta*, int4 const*, float const*, long const*, float const*, "
    "int*, int*, int*, int*, int const*, int const*, int const*, int const*, int, int, int, int, "
    "int, bool const*, void*, int, int, void**, int, int, int, int, int*)",
    "void dpsk::ep::internode::notify_dispatch<false, 8>(int const*, long*, int, int const*, "
    "int*, int const*, int*, int, bool const*, int, int, int, int, int, int, int, int*, int*, "
    "int*, int*, void*, void**, int**, int, int, int*, int)",
)
DPSK_COMPUTE = (
    "void dpsk::ep::cuda::get_dispatch_layout<256, 32, 8>(long const*, int*, int*, int*, bool*, "
    "int, int, int, int)",  # counts tokens per expert on the GPU itself
    "dpsk::grouped_gemm::cuda::utils::fill_tensormaps_kernel(CUtensorMap_st, CUtensorMap_st*, "
    "void*, int, long)",
    "void cutlass::device_kernel<dpsk::grouped_gemm::cuda::fp8_ptp128c::GemmKernel>"
    "(dpsk::grouped_gemm::cuda::fp8_ptp128c::GemmKernel::Params)",
    "void dpsk::grouped_gemm::cuda::utils::transpose<512, 128, 4, 4>(unsigned char const*, "
    "unsigned char*, int, int, int, int)",
)


@pytest.mark.parametrize(
    ("name", "kind"), [(n, "comm") for n in DPSK_COMM] + [(n, "compute") for n in DPSK_COMPUTE]
)
def test_deepep_as_deepseeks_released_trace_names_it(name, kind):
    assert classify("kernel", name) == kind


def test_the_list_is_extended_by_the_user():
    assert classify("kernel", OWN, comm_kernel_re(("ep_exchange",))) == "comm"
    with pytest.raises(ValueError, match="comm_kernels"):
        LoadConfig(comm_kernels=("ep_exchange(",))


def _ep_rank(tmp_path, own: str = OWN):
    """One GPU, one step: the layout kernel, a DeepEP dispatch, an expert GEMM, a DeepEP
    combine, then the user's own exchange kernel::

        t (µs)     100 110       160        260      300    320
        GPU        |l |dispatch--|gemm======|combine-|own---|
                   <--------------------- window ----------->

    window [100, 320) = 220 µs; busy: layout 10 + gemm 100 = 110. The dispatch (50) and the
    combine (40) are communication that synchronises nothing known (no NCCL metadata): exposed,
    90 µs. The user's kernel (20) is compute by default (busy 130), exposed with the user's
    pattern (exposed 110).
    """
    names = [LAYOUT, DISPATCH, "gemm", COMBINE, own]
    spans = [(100, 10), (110, 50), (160, 100), (260, 40), (300, 20)]
    events = [step(1, 0, 1000)]
    for corr, (name, (ts, dur)) in enumerate(zip(names, spans, strict=True), start=1):
        events += [launch(corr, corr, dur=0.5), kernel(name, ts, dur, corr=corr)]
    write(tmp_path / "rank0.json", trace(events, rank=0, world_size=1))
    return tmp_path


def test_deep_ep_dispatch_and_combine_are_communication(tmp_path):
    run = fsobs.load_run(_ep_rank(tmp_path))
    expect_row(checked_table(run), 0, 1, window=220, busy=130, exposed_comm=90)


def test_the_users_own_kernels_are_communication(tmp_path):
    run = fsobs.load_run(_ep_rank(tmp_path), LoadConfig(comm_kernels=("ep_exchange",)))
    expect_row(checked_table(run), 0, 1, window=220, busy=110, exposed_comm=110)


def test_the_command_line_takes_the_users_patterns(tmp_path, capsys):
    run = _ep_rank(tmp_path)
    assert main(["analyze", str(run), "--json", "--comm-kernel", "EP_EXCHANGE"]) == 0
    step_row = json.loads(capsys.readouterr().out)["steps"][0]
    assert step_row["busy_ms"] == pytest.approx(0.110)
    assert step_row["exposed_comm_ms"] == pytest.approx(0.110)
    with pytest.raises(SystemExit) as exit_:
        main(["analyze", str(run), "--comm-kernel", "ep_exchange("])
    assert exit_.value.code == 2
    assert "not a regular expression" in capsys.readouterr().err
