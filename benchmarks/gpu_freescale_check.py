"""GPU check of the optimizer API with NCCL at world size 1, torch only (no torchrec needed).

    python benchmarks/gpu_freescale_check.py        (bash benchmarks/gpu_check.sh runs it)

On a machine with one CUDA device it checks, and prints one line per check:

1. ``FreeScale.setup()`` with priority_overlap and sm_free on: the embedding and dense groups
   are NCCL groups of their own; the embedding group asked for a high-priority stream (and the
   zero-CTA policy when sm_free applies); ``status()`` says what applied and why not.
2. The dense comm hook: DDP on the dense group with ``optim.ddp.dense_hook`` gives the same
   gradients as DDP without a hook; with the gate, a backward without the embedding all-to-all
   does not hang.
3. The comm router: a collective issued through it on the embedding group runs and is marked
   in a profiler trace (``## fsobs:comm:embedding:<pg> ##``).
4. When sm_free applies (NCCL >= 2.28, symmetric memory): the padded equal-split all-to-all
   through symmetric buffers returns the input (world size 1: every chunk to itself).

What needs torchrec (DMP, the reference job) is left to gpu_check.sh, which says when it skips.
"""

from __future__ import annotations

import json
import os
import sys
import types
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from optim import FreeScale, FreeScaleConfig, PriorityConfig, SMFreeConfig  # noqa: E402
from optim.comm import CommRouter, install  # noqa: E402
from optim.ddp import DenseGate, DenseHookState, dense_hook  # noqa: E402


def check(name: str, ok: bool, detail: object = "") -> bool:
    print(f"{'OK  ' if ok else 'FAIL'} {name} {detail}")
    return ok


def ddp_grads(group: dist.ProcessGroup, hook_state: DenseHookState | None) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    ddp = torch.nn.parallel.DistributedDataParallel(model.cuda(), process_group=group)
    if hook_state is not None:
        ddp.register_comm_hook(hook_state, dense_hook)
    ddp(torch.ones(8, 64, device="cuda")).sum().backward()
    return [p.grad.clone() for p in ddp.parameters()]


def main() -> int:
    if not torch.cuda.is_available():
        print(f"gpu_freescale_check: torch {torch.__version__} sees no CUDA device: skipped")
        return 0
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29561")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    ok = True
    config = FreeScaleConfig(
        priority_overlap=PriorityConfig(enabled=True, dense_order="after_embedding"),
        sm_free=SMFreeConfig(enabled=True),
    )
    fs = FreeScale(config)
    fs.setup()
    status = fs.status()
    print("status", json.dumps(status))
    print("layout", json.dumps(fs.layout()))
    groups = fs.groups
    ok &= check("embedding group is its own", groups.embedding is not dist.group.WORLD)
    ok &= check("dense group is its own", groups.dense is not dist.group.WORLD)
    ok &= check("priority_overlap applied", status["priority_overlap"]["applied"])
    backend = groups.embedding._get_backend(torch.device("cuda"))
    options = getattr(backend, "options", None)
    high = getattr(options, "is_high_priority_stream", None)
    ok &= check("embedding group high-priority stream", high is True, f"(options: {high})")
    if status["sm_free"]["applied"]:
        policy = getattr(getattr(options, "config", None), "cta_policy", None)
        zero = getattr(dist.ProcessGroupNCCL, "NCCL_CTA_POLICY_ZERO", "missing")
        ok &= check("embedding group zero-CTA policy", policy == zero, f"({policy} vs {zero})")
    else:
        print(f"SKIP sm_free not applied: {status['sm_free']['reason']}")

    plain = ddp_grads(groups.dense, None)
    hooked = ddp_grads(groups.dense, DenseHookState(groups.dense))
    same = all(torch.equal(a, b) for a, b in zip(plain, hooked, strict=True))
    ok &= check("dense hook: gradients equal DDP's own", same)
    gated = ddp_grads(groups.dense, DenseHookState(groups.dense, gate=DenseGate()))
    same = all(torch.equal(a, b) for a, b in zip(plain, gated, strict=True))
    ok &= check("gated dense hook without an all-to-all: no hang, same gradients", same)

    fake = types.ModuleType("fake_torchrec_comm")
    fake.dist = dist
    sys.modules[fake.__name__] = fake
    router = CommRouter(
        embedding_group=groups.embedding,
        all_to_all_single=fs._sm_free.all_to_all_single if fs._sm_free else None,
    )
    uninstall = install(router, (fake.__name__,))
    data = torch.arange(4096, dtype=torch.float32, device="cuda").reshape(64, 64)
    out = torch.empty_like(data)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        work = fake.dist.all_to_all_single(
            out, data, [64], [64], group=groups.embedding, async_op=True
        )
        work.wait()
        torch.cuda.synchronize()
    uninstall()
    names = {e.name for e in prof.events()}
    marker = f"## fsobs:comm:embedding:{groups.embedding.group_name} ##"
    ok &= check("router: all_to_all_single through it returns the input", torch.equal(out, data))
    ok &= check("router: the collective is marked in the trace", marker in names)
    if fs._sm_free is not None:
        stats = fs._sm_free.stats
        ok &= check("sm_free padded all-to-all ran", stats.calls == 1, f"({stats})")
    dist.destroy_process_group()
    print("gpu_freescale_check:", "OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
