"""Analytic per-sample compute cost of ``SeqRecModel``: ``c(L) = c0 + a·L + b·L²`` (no torch).

Counted for one training step (forward + backward) of one sample with a history of ``L``
events, from the model shape (D = ``emb_dim``, H = ``num_heads``, d = ``head_dim``, I = H·d,
n = ``num_blocks``, M = the MLP head's layer widths 5D -> ... -> 1):

- **matmul FLOPs** (2 per multiply-add; the backward of every matmul is twice its forward,
  because every operand needs a gradient, so each term is 3x its forward):

  - per event, per block: the U/V/Q/K projection (D -> 4I) and the output projection (I -> D):
    ``a_mm = 3 · n · 2·(4·D·I + I·D) = 30·n·D·I``;
  - per pair of events, per block: ``Q·Kᵀ`` and ``scores·V`` over all heads (the causal mask
    is applied after a full product, so all L² pairs count): ``b_mm = 3 · n · 2·2·I = 12·n·I``;
  - per sample: the MLP head: ``c0_mm = 3 · 2·Σ(m_i·m_{i+1})``.

  ``torch.utils.flop_counter.FlopCounterMode`` counts exactly these for a single-sample step
  (``tests/unit/workload/test_model.py``).
- **elementwise ops** (one per element per pass, forward; backward counted as twice that):
  layer norms, SiLU, bias, gate, residual: ``7·D + 27·I`` per event and block; the embedding
  gathers, sum and mean pool: ``9·D`` per event; SiLU and mask: ``5·H`` per pair of events and
  block. They are multiplied by ``elementwise_weight`` (0 gives the matmul FLOPs alone).

Measured on a 2-core CPU, one thread, "small" preset (``benchmarks/bench_cost_model.py``): the
per-sample time is ``c0 + k·estimate_cost(L)`` with k ≈ 27-31 ps per FLOP-equivalent and
R² ≥ 0.98, but ``c0`` ≈ 0.3-0.8 ms is missing from the FLOP count: it is the per-sample Python
loop over the attention (tens of small ops per block), as large as the compute of a 64-event
sample. A refit from measured runs should keep a constant term.

The embedding lookup and its all-to-all (linear in L) are inside ``a`` only as the gathers above.
"""

from __future__ import annotations

import numpy as np

from fsobs.workload.config import ModelConfig
from optim.balance import CostModel


def cost_coefficients(cfg: ModelConfig, *, elementwise_weight: float = 1.0) -> CostModel:
    """The analytic cost model of ``cfg`` in FLOP-equivalents per sample and training step (see
    the module docstring for each term): the balancer's default."""
    if elementwise_weight < 0:
        raise ValueError(f"elementwise_weight: must be >= 0, got {elementwise_weight}")
    d, n, inner = cfg.emb_dim, cfg.num_blocks, cfg.num_heads * cfg.head_dim
    widths = (5 * d, *cfg.mlp_dims, 1)
    a_mm = 3 * n * 2 * (4 * d * inner + inner * d)
    b_mm = 3 * n * 2 * 2 * inner
    c0_mm = 3 * 2 * sum(i * o for i, o in zip(widths[:-1], widths[1:], strict=True))
    a_ew = 3 * (n * (7 * d + 27 * inner) + 9 * d)
    b_ew = 3 * n * 5 * cfg.num_heads
    return CostModel(
        c0=float(c0_mm),
        a=float(a_mm + elementwise_weight * a_ew),
        b=float(b_mm + elementwise_weight * b_ew),
    )


def estimate_cost(
    lengths: np.ndarray, cfg: ModelConfig, *, elementwise_weight: float = 1.0
) -> np.ndarray:
    """Per-sample cost ``c0 + a·L + b·L²`` of a training step, for each of ``lengths``."""
    return cost_coefficients(cfg, elementwise_weight=elementwise_weight)(lengths)
