"""The CUDA half of ``spotopt.agent.torch``'s training state, on a real GPU.

CI has no GPU: without CUDA these tests skip (saying so). They are the device check of
``docs/guides/agent.md``: a run of mixed-precision training on the GPU (dropout drawing from the
CUDA generator, a grad scaler, a scheduler) is checkpointed through the very bytes the agent
writes (``capture`` → ``to_bytes`` → ``from_bytes``) and resumed into a fresh model whose
generators were moved on; the resumed steps must equal the uninterrupted ones bit for bit.
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (CI has none)")

# cuBLAS is deterministic only with a fixed workspace, set before its first use in the process.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

from spotopt.agent.torch.ranks import Ranks  # noqa: E402
from spotopt.agent.torch.state import Parts, apply, capture, from_bytes, rng_state, to_bytes  # noqa: E402

STEPS = 6


def _parts(seed: int) -> Parts:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(64, 1)
    ).cuda()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    return Parts(model, optimizer, scheduler, torch.amp.GradScaler("cuda"))


def _train(parts: Parts, steps: int) -> list[float]:
    """Steps whose data and dropout masks come from the CUDA generator."""
    losses = []
    for _ in range(steps):
        x = torch.randn(16, 32, device="cuda")
        y = x.sum(dim=1, keepdim=True)
        parts.optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.float16):
            loss = torch.nn.functional.mse_loss(parts.model(x).float(), y)
        parts.scaler.scale(loss).backward()
        parts.scaler.step(parts.optimizer)
        parts.scaler.update()
        parts.scheduler.step()
        losses.append(loss.item())
    return losses


def test_a_cuda_run_resumes_bit_identically() -> None:
    torch.use_deterministic_algorithms(True)
    try:
        first = _parts(0)
        _train(first, STEPS)
        payload = from_bytes(to_bytes(capture(STEPS, first, [rng_state()])))
        assert len(payload["rng"][0]["cuda"]) == torch.cuda.device_count()  # the GPU's generator saved
        uninterrupted = _train(first, STEPS)

        resumed = _parts(1)  # other weights, and every generator moved on
        torch.randn(1000, device="cuda")
        warnings: list[str] = []
        apply(payload, resumed, 0, warnings.append)
        assert warnings == []
        assert _train(resumed, STEPS) == uninterrupted
        for a, b in zip(first.model.parameters(), resumed.model.parameters(), strict=True):
            assert a.device.type == b.device.type == "cuda" and torch.equal(a, b)
        assert first.scaler.get_scale() == resumed.scaler.get_scale()
        # The check can fail: without the GPU's generator the resumed steps draw other data.
        del payload["rng"][0]["cuda"]
        blind = _parts(1)
        torch.randn(1000, device="cuda")
        apply(payload, blind, 0, warnings.append)
        assert _train(blind, STEPS) != uninterrupted
    finally:
        torch.use_deterministic_algorithms(False)


def test_a_checkpoint_from_more_gpus_warns_and_trains_on() -> None:
    parts = _parts(0)
    _train(parts, 1)
    payload = from_bytes(to_bytes(capture(1, parts, [rng_state()])))
    payload["rng"][0]["cuda"] = payload["rng"][0]["cuda"] * (torch.cuda.device_count() + 1)
    warnings: list[str] = []
    apply(payload, _parts(1), 0, warnings.append)
    assert len(warnings) == 1 and "CUDA generators start fresh" in warnings[0]


def test_nccl_collectives_live_on_the_current_gpu() -> None:
    dist = torch.distributed
    if not dist.is_nccl_available():
        pytest.skip("this torch has no NCCL")
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        ranks = Ranks.current()
        assert (ranks.rank, ranks.world) == (0, 1)
        assert ranks.device == torch.device("cuda", torch.cuda.current_device())
    finally:
        dist.destroy_process_group()
