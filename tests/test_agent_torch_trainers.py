"""The Hugging Face Trainer and Lightning callbacks (``spotopt.agent.torch.hf`` / ``.lightning``):
their examples, a tiny model built in code, interrupted at seeded random points
(``tests/interruptions.py``: SIGKILL, SIGTERM, a cloud notice from the fake metadata server, the
daemon's stop request) on ``file://`` and moto S3, end with parameters, optimizer state and every
step's parameter fingerprint bit-identical to an uninterrupted run. Every job start is a fork of
the module's zygote (``tests/zygote.py``); the uninterrupted runs are new interpreters.

Skips without torch, transformers or lightning; CI installs the ``hf`` and ``lightning`` extras'
pins next to ``torch==2.13.0`` (the CPU wheel) so these run there.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from spotopt.agent.torch import ResumableSampler  # noqa: E402
from spotopt.checkpoints import grant_lease, read_finished  # noqa: E402
from spotopt.clouds.common.base import LaunchSpec  # noqa: E402
from spotopt.clouds.local.provider import LocalProvider  # noqa: E402
from tests.interruptions import (  # noqa: E402
    CLOUDS,
    MARKET,
    RANK_1_SIGTERM,
    Interrupt,
    interrupted,
    log_lines,
    provider,
    uninterrupted,
    wait,
)
from tests.stores import StoreUnderTest, moto_s3  # noqa: E402
from tests.test_agent_torch import assert_same_weights  # noqa: E402
from tests.zygote import Zygote  # noqa: E402

__all__ = ["interrupted", "moto_s3", "provider"]

EXAMPLES = Path(__file__).resolve().parents[1] / "data" / "examples"
TRAINERS = {"hf": ("transformers", "train_hf.py"), "lightning": ("lightning", "train_lightning.py")}
STEPS = 40
"""3⅓ epochs of 12 batches: interruptions land mid-epoch and, sometimes, at an epoch's end."""
STEP_DELAY_S = 0.03
KINDS = ("sigkill", "sigterm", "notice", "control")


@pytest.fixture(scope="module")
def zygote_preload() -> tuple[Path | str, ...]:
    """The jobs here start as forks of one process that has imported what the examples import."""
    scripts = [EXAMPLES / script for library, script in TRAINERS.values() if find_spec(library)]
    return (*scripts, EXAMPLES / "launch_ddp.py", "torch._inductor")


def _skip_without(library: str) -> None:
    """Skip unless ``library`` is installed: found, not imported (the jobs import it in their own
    processes; Lightning's import alone takes this process 6 s)."""
    if find_spec(library) is None:
        pytest.skip(f"{library} is not installed")


def _cases(seed: int) -> list[tuple[str, str, tuple[str, ...], tuple[int, ...]]]:
    """Per trainer, the four kinds of interruption in a random order (the notice from a random
    cloud), two in one job on each store, each at a random step: one job a process start per
    interruption, as few starts as cover every kind on both stores."""
    rng = random.Random(seed)
    cases = []
    for trainer in TRAINERS:
        kinds = [rng.choice(CLOUDS) if kind == "notice" else kind for kind in KINDS]
        rng.shuffle(kinds)
        for store, modes in (("file", kinds[:2]), ("s3", kinds[2:])):
            first = rng.randrange(4, STEPS // 2)
            steps = (first, rng.randrange(first + 4, STEPS - 10))
            cases.append((trainer, store, tuple(modes), steps))
    return cases


DDP = "lightning-ddp"
"""The Lightning example as 2 DistributedDataParallel processes on gloo (``launch_ddp.py``)."""


def _ddp_case(seed: int) -> tuple[str, str, tuple[str, ...], tuple[int, ...]]:
    """The Lightning callback under DDP: one job on ``file://`` interrupted in each of the four
    kinds and by a SIGTERM to rank 1 alone (Lightning's own handler hangs both ranks then), in a
    random order (the notice from a random cloud), each at a random step."""
    rng = random.Random(seed)
    kinds = [rng.choice(CLOUDS) if kind == "notice" else kind for kind in (*KINDS, RANK_1_SIGTERM)]
    rng.shuffle(kinds)
    return DDP, "file", tuple(kinds), tuple(sorted(rng.sample(range(4, STEPS - 8, 3), len(kinds))))


CASES = [*_cases(2323), _ddp_case(2324)]


def _command(trainer: str, out: Path, log: Path, *extra: str) -> list[str]:
    if trainer == DDP:
        script = [str(EXAMPLES / "launch_ddp.py"), "--nproc", "2", str(EXAMPLES / "train_lightning.py"), "--"]
    else:
        script = [str(EXAMPLES / TRAINERS[trainer][1])]
    return [sys.executable, *script, "--steps", str(STEPS), "--out", str(out), "--log", str(log), *extra]


Result = tuple[dict[str, Any], dict[str, Any], dict[int, str], dict[str, Any]]


def _result(out: Path, log: Path) -> Result:
    model, optimizer, counters = (
        torch.load(out / f"{name}.pt") for name in ("model", "optimizer", "counters")
    )
    return model, optimizer, dict(log_lines(log)), counters


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory, zygote: Zygote) -> Iterator[Any]:
    """The uninterrupted runs (``interruptions.uninterrupted``), made on first use. The DDP one
    is a fork of the zygote: its ranks are forks (``launch_ddp.py``) from a new interpreter too,
    and the single-process Lightning reference already pins a new interpreter's result to a
    fork's for this script; a new interpreter would add Lightning's import, 6 s."""
    made: dict[str, Result] = {}

    def reference(trainer: str) -> Result:
        if trainer not in made:

            def command(work: Path) -> list[str]:
                return _command(trainer, work / "out", work / "log")

            work = uninterrupted(tmp_path_factory, trainer, command, zygote if trainer == DDP else None)
            made[trainer] = _result(work / "out", work / "log")
        return made[trainer]

    yield reference


def _assert_identical(got: Result, want: Result) -> None:
    model, optimizer, trajectory, counters = got
    assert counters == want[3]  # the trainer's own global step, epoch and learning rate
    assert_same_weights((model, optimizer), want[:2])
    assert sorted(trajectory) == list(range(1, STEPS + 1))
    mismatched = [(s, h) for s, h in trajectory.items() if want[2][s] != h]
    assert not mismatched, f"steps whose parameters differ from the uninterrupted run: {mismatched[:5]}"


@pytest.mark.parametrize(("trainer", "store_kind", "modes", "kill_steps"), CASES)
def test_an_interrupted_trainer_job_resumes_bit_identical(
    interrupted: Interrupt,
    references: Any,
    trainer: str,
    store_kind: str,
    modes: tuple[str, ...],
    kill_steps: tuple[int, ...],
) -> None:
    _skip_without(TRAINERS[trainer.removesuffix("-ddp")][0])
    delay = ("--step-delay", str(STEP_DELAY_S))
    out, log = interrupted(store_kind, modes, kill_steps, lambda o, g: _command(trainer, o, g, *delay))
    runs: dict[str, list[int]] = {}
    for step, _, epoch in (line.split() for line in log.read_text().splitlines()):
        runs.setdefault(epoch, []).append(int(step))
    assert len(runs) == len(kill_steps) + 1, f"not one run per interruption and a last one: {runs}"
    assert all(steps[0] > 1 for steps in list(runs.values())[1:]), f"a run started over: {runs}"
    _assert_identical(_result(out, log), references(trainer))


@pytest.mark.parametrize("trainer", TRAINERS)
def test_a_job_lost_after_its_last_step_ends_as_an_uninterrupted_run(
    provider: LocalProvider, references: Any, tmp_path: Path, trainer: str
) -> None:
    """Killed after the checkpoint of its last step, before the agent's ``finish``: the next run
    trains no step (the Trainer would run one more), ends bit-identical, and marks the job
    finished (Lightning skips its fit loop, and ``on_train_end`` with it)."""
    _skip_without(TRAINERS[trainer][0])
    store = StoreUnderTest(f"file://{tmp_path / 'store'}")
    loc = store.location()
    out, log = tmp_path / "out", tmp_path / "steps.log"
    epochs = []
    # A checkpoint at every step, so the one of the last step is there when the process dies.
    for extra, every in ((("--die-before-finish",), 0.0), ((), None)):
        lease = grant_lease(loc, "train", datetime.now(UTC))
        epochs.append(lease.epoch)
        command = tuple(_command(trainer, out, log, *extra))
        spec = LaunchSpec("train", lease.epoch, command, store.url, checkpoint_every_s=every)
        iid = provider.launch(spec, MARKET, f"train-{lease.epoch}").instance_id
        wait(provider, iid, "the run to end")
        status = provider.status(iid)
        if extra:
            assert status.exit_code != 0 and read_finished(loc, "train") is None
        else:
            assert status.exit_code == 0, provider.log_path(iid).read_text()
    epochs_logged = {line.split()[2] for line in log.read_text().splitlines()}
    assert epochs_logged == {str(epochs[0])}, "the run after the last step trained a step"
    finished = read_finished(loc, "train")
    assert finished is not None and (finished["epoch"], finished["step"]) == (epochs[1], STEPS)
    _assert_identical(_result(out, log), references(trainer))


def test_the_cases_cover_every_kind_on_both_stores_for_both_trainers() -> None:
    for trainer in TRAINERS:
        mine = [(store, modes) for t, store, modes, _ in CASES if t == trainer]
        assert sorted(store for store, _ in mine) == ["file", "s3"]
        kinds = [m for _, modes in mine for m in modes]
        assert len(kinds) == 4 and {"sigkill", "sigterm", "control"} < set(kinds) and set(kinds) & set(CLOUDS)


def test_the_sampler_follows_a_trainer_s_epochs_and_gradient_accumulation() -> None:
    """What the callbacks rely on: ``at(step, batches_per_step)`` as the trainers count steps, and
    every later iteration the next epoch, whatever epoch a trainer thinks it is in (it has no
    ``set_epoch`` for them to call: their counts restart or lag after a resume)."""
    from torch.utils.data import DistributedSampler

    data = list(range(10))
    reference = DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=3)
    orders = []
    for epoch in range(4):
        reference.set_epoch(epoch)
        orders.append(list(reference))
    inner = DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=3)
    sampler = ResumableSampler(inner, batch_size=2)  # 5 batches an epoch: steps of 2 batches, 3 an epoch
    assert [list(sampler) for _ in range(3)] == orders[:3]  # a fresh sampler: epochs 0, 1, 2 in turn
    assert not hasattr(sampler, "set_epoch")
    assert sampler.at(4, batches_per_step=2) == 1 and sampler.mid_epoch  # epoch 1, after its first step
    assert list(sampler) == orders[1][4:]
    assert not sampler.mid_epoch and list(sampler) == orders[2]
    assert sampler.at(6, batches_per_step=2) == 2 and not sampler.mid_epoch
    assert list(sampler) == orders[2]
    sampler.at(6, batches_per_step=2)
    sampler.exhaust()  # resumed at the last step: the trainer's next epoch has no batch
    assert list(sampler) == [] and list(sampler) == orders[3]


def test_the_trainer_callback_refuses_an_accumulation_that_splits_an_epoch() -> None:
    """A resume mid-epoch could not be bit-identical there (the Trainer's last step of an epoch
    takes what is left): refused at the start, naming the setting, before anything is restored."""
    pytest.importorskip("transformers")
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from spotopt.agent.torch.hf import SpotoptCallback

    args = TrainingArguments(output_dir="unused", gradient_accumulation_steps=5, use_cpu=True, report_to=[])
    with pytest.raises(ValueError, match=r"^gradient_accumulation_steps: 5 does not divide the 12 batches"):
        SpotoptCallback().on_train_begin(args, TrainerState(), TrainerControl(), train_dataloader=range(12))
