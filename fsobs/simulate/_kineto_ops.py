"""Operator catalog of :mod:`fsobs.simulate.synthetic_kineto`: the host op chains, kernels and
copies a step is drawn from, each with its typical GPU duration.

The parts of an event that never change (kernel occupancy args, names) are rendered here once,
in the layout Kineto itself writes; :mod:`fsobs.simulate.kineto_writer` renders the events.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TypedDict

NUM_SMS = 132  # H100 SXM
COMPUTE_STREAM = 7
COMM_STREAM = 20


@dataclass(frozen=True)
class GpuOp:
    """A host operation that launches exactly one GPU activity."""

    chain: tuple[tuple[str, str], ...]
    """Nested host ranges, outermost first, as (cat, name); the innermost one calls ``launch``."""
    launch: str
    """The CUDA runtime call (``cudaLaunchKernel``, ``cudaMemcpyAsync``, ...)."""
    cbid: int
    gpu_cat: str
    """``kernel``, ``gpu_memcpy`` or ``gpu_memset``."""
    gpu_name: str
    mean_us: float
    """Typical GPU duration at load 1.0."""
    static_args: str = ""
    """Rendered args that follow ``correlation`` (occupancy, bytes, ...)."""


def kernel_args(
    regs: int, smem: int, grid: tuple[int, int, int], block: tuple[int, int, int]
) -> str:
    """The occupancy part of a Kineto kernel's args, as Kineto formats it."""
    blocks = grid[0] * grid[1] * grid[2]
    warps = math.ceil(block[0] * block[1] * block[2] / 32)
    blocks_per_sm = blocks / NUM_SMS
    warps_per_sm = blocks * warps / NUM_SMS
    occupancy = min(100, int(100 * warps_per_sm / 64))
    return (
        f',      "registers per thread": {regs},      "shared memory": {smem},'
        f'      "blocks per SM": {blocks_per_sm:.6f},      "warps per SM": {warps_per_sm:.6f},'
        f'      "grid": [{grid[0]}, {grid[1]}, {grid[2]}],'
        f'      "block": [{block[0]}, {block[1]}, {block[2]}],'
        f'      "est. achieved occupancy %": {occupancy}'
    )


def _k(
    chain: tuple[str, ...],
    kernel: str,
    mean_us: float,
    regs: int = 32,
    smem: int = 0,
    grid: tuple[int, int, int] = (1024, 1, 1),
    block: tuple[int, int, int] = (256, 1, 1),
) -> GpuOp:
    """A compute kernel launched by the cpu_op chain ``chain``."""
    cats = tuple(("cpu_op", name) for name in chain)
    args = kernel_args(regs, smem, grid, block)
    return GpuOp(cats, "cudaLaunchKernel", 211, "kernel", kernel, mean_us, args)


# Kernel names as the CUDA toolchain demangles them (taken from the shape of real traces).
_EW = "void at::native::vectorized_elementwise_kernel<4, "
_ARR2 = ", at::detail::Array<char*, 2> >(int, {0}, at::detail::Array<char*, 2>)"
_ARR3 = ", at::detail::Array<char*, 3> >(int, {0}, at::detail::Array<char*, 3>)"
_MUL = "at::native::BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float> >"  # noqa: E501
_ADD = "at::native::CUDAFunctor_add<float>"
_RELU = "at::native::(anonymous namespace)::launch_clamp_scalar(at::TensorIteratorBase&, c10::Scalar, c10::Scalar, at::native::detail::ClampLimits)::{lambda()#1}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}"  # noqa: E501
_SIGMOID = "at::native::sigmoid_kernel_cuda(at::TensorIteratorBase&)::{lambda()#2}::operator()() const::{lambda()#3}::operator()() const::{lambda(float)#1}"  # noqa: E501
_GEMM = "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas"  # noqa: E501
_GEMM_NN = "sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize256x128x32_warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cublas"  # noqa: E501
_BMM = "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>(cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4::Params)"  # noqa: E501
_SUM = "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float, at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, float, 4> >(at::native::ReduceOp<float, at::native::func_wrapper_t<float, at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, float, 4>)"  # noqa: E501
_TBE = "void fbgemm_gpu::split_embedding_codegen_forward_unweighted_kernel<float, float, float, long, 32, 4, 1>(at::GenericPackedTensorAccessor<unsigned char, 1ul, at::RestrictPtrTraits, long>, at::GenericPackedTensorAccessor<float, 1ul, at::RestrictPtrTraits, long>, at::GenericPackedTensorAccessor<int, 1ul, at::RestrictPtrTraits, long>, int, at::GenericPackedTensorAccessor<long, 1ul, at::RestrictPtrTraits, long>, at::GenericPackedTensorAccessor<long, 1ul, at::RestrictPtrTraits, long>, at::GenericPackedTensorAccessor<long, 1ul, at::RestrictPtrTraits, long>, long, long, at::GenericPackedTensorAccessor<float, 2ul, at::RestrictPtrTraits, long>)"  # noqa: E501
_BAG = "void at::native::(anonymous namespace)::embedding_bag_kernel_sum_mean<float, long>(long const*, long const*, float const*, float*, long, long, long, long, long, long, long, float const*, long, long*, long)"  # noqa: E501
_INDEX = "void at::native::(anonymous namespace)::indexSelectLargeIndex<float, long, unsigned int, 2, 2, -2, true>(at::cuda::detail::TensorInfo<float, unsigned int>, at::cuda::detail::TensorInfo<float const, unsigned int>, at::cuda::detail::TensorInfo<long const, unsigned int>, int, int, unsigned int, unsigned int, long)"  # noqa: E501
_CAT = "void at::native::(anonymous namespace)::CatArrayBatchedCopy<at::native::(anonymous namespace)::OpaqueType<4u>, unsigned int, 2, 128, 1>(at::native::(anonymous namespace)::OpaqueType<4u>*, at::native::(anonymous namespace)::CatArrInputTensorMetadata<at::native::(anonymous namespace)::OpaqueType<4u>, unsigned int, 128, 1>, at::native::(anonymous namespace)::TensorSizeStride<unsigned int, 4u>, int, unsigned int)"  # noqa: E501
_SOFTMAX = "void (anonymous namespace)::softmax_warp_forward<float, float, float, 9, false, false>(float*, float const*, int, int, int, bool const*, int, bool)"  # noqa: E501
_SOFTMAX_BWD = "void (anonymous namespace)::softmax_warp_backward<float, float, float, 9, false, false>(float*, float const*, float const*, int, int, int, bool const*)"  # noqa: E501
_LAYER_NORM = "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>(int, float, float const*, float const*, float const*, float*, float*, float*)"  # noqa: E501
_LAYER_NORM_BWD = "void at::native::(anonymous namespace)::layer_norm_grad_input_kernel_vectorized<float, float>(float const*, float const*, float const*, float const*, float const*, float*, int)"  # noqa: E501
_BAG_BWD = "void at::native::(anonymous namespace)::compute_grad_weight_bags<float, long>(long const*, float const*, long const*, long const*, long const*, long, long, long, long, long, long, float const*, long, long const*, long const*, float*, long)"  # noqa: E501
_FOREACH = "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::TensorListMetadata<2>, at::native::(anonymous namespace)::BinaryOpListAlphaFunctor<float, 2, 2, 0>, std::plus<float>, float>(at::native::(anonymous namespace)::TensorListMetadata<2>, at::native::(anonymous namespace)::BinaryOpListAlphaFunctor<float, 2, 2, 0>, std::plus<float>, float)"  # noqa: E501
_TBE_OPS = (
    "fbgemm::split_embedding_codegen_lookup_sgd_function",
    "fbgemm::split_embedding_codegen_forward_unweighted_cuda",
)


class _Shape(TypedDict, total=False):
    """Launch-shape keywords of :func:`_k`."""

    regs: int
    smem: int
    grid: tuple[int, int, int]
    block: tuple[int, int, int]


_GEMM_SHAPE = _Shape(regs=168, smem=98304, grid=(16, 24, 1), block=(384, 1, 1))
_BMM_SHAPE = _Shape(regs=230, smem=73728, grid=(8, 32, 16), block=(128, 1, 1))
_ROW_SHAPE = _Shape(regs=40, grid=(8192, 1, 1), block=(128, 1, 1))


def _bwd(name: str, inner: str) -> tuple[str, ...]:
    return (f"autograd::engine::evaluate_function: {name}", name, inner)


# Embedding lookups and sequence gathering (before the embedding all-to-all).
SPARSE_OPS: tuple[GpuOp, ...] = (
    _k(_TBE_OPS, _TBE, 140.0, regs=56, grid=(4096, 1, 1), block=(32, 4, 1)),
    _k(("aten::embedding_bag", "aten::_embedding_bag"), _BAG, 60.0, grid=(2048, 1, 1)),
    _k(("aten::index_select",), _INDEX, 25.0, regs=26, grid=(1056, 1, 1), block=(128, 1, 1)),
    _k(("aten::cat",), _CAT, 12.0, regs=30, grid=(264, 2, 1), block=(512, 1, 1)),
)

# Dense forward of the sequence model (after the all-to-all), main thread.
DENSE_OPS: tuple[GpuOp, ...] = (
    _k(("aten::linear", "aten::addmm"), _GEMM, 85.0, **_GEMM_SHAPE),
    _k(("aten::matmul", "aten::bmm"), _BMM, 110.0, **_BMM_SHAPE),
    _k(("aten::softmax", "aten::_softmax"), _SOFTMAX, 28.0, **_ROW_SHAPE),
    _k(("aten::layer_norm", "aten::native_layer_norm"), _LAYER_NORM, 16.0, **_ROW_SHAPE),
    _k(("aten::relu", "aten::clamp_min"), _EW + _RELU + _ARR2.format(_RELU), 8.0),
    _k(("aten::mul",), _EW + _MUL + _ARR3.format(_MUL), 7.0),
    _k(("aten::add",), _EW + _ADD + _ARR3.format(_ADD), 7.0),
    _k(("aten::sigmoid",), _EW + _SIGMOID + _ARR2.format(_SIGMOID), 6.0),
    _k(("aten::sum",), _SUM, 12.0, smem=16, grid=(264, 1, 1), block=(32, 16, 1)),
)

# Backward, on the autograd thread.
BACKWARD_OPS: tuple[GpuOp, ...] = (
    _k(_bwd("AddmmBackward0", "aten::mm"), _GEMM_NN, 95.0, **_GEMM_SHAPE),
    _k(_bwd("BmmBackward0", "aten::bmm"), _BMM, 120.0, **_BMM_SHAPE),
    _k(_bwd("SoftmaxBackward0", "aten::_softmax_backward_data"), _SOFTMAX_BWD, 30.0, **_ROW_SHAPE),
    _k(_bwd("NativeLayerNormBackward0", "aten::native_layer_norm_backward"), _LAYER_NORM_BWD, 22.0),
    _k(
        _bwd("ThresholdBackward0", "aten::threshold_backward"), _EW + _MUL + _ARR3.format(_MUL), 9.0
    ),
    _k(_bwd("EmbeddingBagBackward0", "aten::_embedding_bag_backward"), _BAG_BWD, 70.0),
)

# Optimizer step (after the gradient all-reduce), main thread.
_FOREACH_SHAPE = _Shape(regs=30, grid=(320, 1, 1), block=(512, 1, 1))
OPTIMIZER_OPS: tuple[GpuOp, ...] = (
    _k(("aten::_foreach_add_",), _FOREACH, 45.0, **_FOREACH_SHAPE),
    _k(("aten::_foreach_mul_",), _FOREACH.replace("plus", "multiplies"), 35.0, **_FOREACH_SHAPE),
)


def _copy(
    chain: tuple[str, ...],
    launch: str,
    cbid: int,
    cat: str,
    name: str,
    nbytes: int,
    gbps: float,
    mean_us: float,
) -> GpuOp:
    args = f', "bytes": {nbytes}, "memory bandwidth (GB/s)": {gbps}'
    return GpuOp(tuple(("cpu_op", n) for n in chain), launch, cbid, cat, name, mean_us, args)


INPUT_COPY = _copy(
    ("aten::to", "aten::_to_copy", "aten::copy_"),
    "cudaMemcpyAsync",
    41,
    "gpu_memcpy",
    "Memcpy HtoD (Pinned -> Device)",
    8388608,
    21.3,
    390.0,
)
GRAD_ZERO = _copy(
    ("aten::zero_", "aten::fill_"),
    "cudaMemsetAsync",
    51,
    "gpu_memset",
    "Memset (Device)",
    33554432,
    1290.6,
    26.0,
)
LOSS_READ = _copy(
    ("aten::item", "aten::_local_scalar_dense"),
    "cudaMemcpyAsync",
    41,
    "gpu_memcpy",
    "Memcpy DtoH (Device -> Pageable)",
    4,
    0.002,
    2.0,
)

_NCCL_ARGS = kernel_args(96, 87568, (32, 1, 1), (640, 1, 1))
ALL_TO_ALL = GpuOp(
    (
        ("cpu_op", "c10d::alltoall_base_"),
        ("cpu_op", "record_param_comms"),
        ("user_annotation", "nccl:all_to_all"),
    ),
    "cudaLaunchKernel",
    211,
    "kernel",
    "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)",
    0.0,
    _NCCL_ARGS,
)
ALL_REDUCE = GpuOp(
    (
        ("cpu_op", "c10d::allreduce_"),
        ("cpu_op", "record_param_comms"),
        ("user_annotation", "nccl:all_reduce"),
    ),
    "cudaLaunchKernel",
    211,
    "kernel",
    "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
    0.0,
    _NCCL_ARGS,
)
