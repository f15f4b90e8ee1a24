"""A real, deterministic training job under the spotopt agent: a small NumPy MLP on generated data.

Run it alone (checkpoints go to ./spotopt-checkpoints) or under spotopt::

    python data/examples/train_numpy.py --steps 2000 --out result
    spotopt agent run-local data/examples/train_numpy.py -- --steps 2000 --out result

Every step is a pure function of (weights, step): the minibatch comes from a generator seeded
with (seed, step), so a run resumed from any checkpoint ends with bit-identical weights and the
same loss trajectory as an uninterrupted one. ``--out DIR`` receives ``weights.npy`` and
``losses.npy`` (loss of steps 1..N); ``--log FILE`` gets one line per step,
``<step> <loss hex> <epoch>`` (the placement's ``SPOTOPT_EPOCH``, 0 standalone), so a shared log
shows whether two placements ever trained at once (an older epoch writing after a newer one).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

from spotopt import agent

FEATURES, HIDDEN, SAMPLES, BATCH = 16, 32, 2048, 64
PARAMS = ("w1", "b1", "w2", "b2")


def make_data(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((SAMPLES, FEATURES))
    true_w = rng.standard_normal(FEATURES)
    y = (np.tanh(x @ true_w) + 0.1 * rng.standard_normal(SAMPLES) > 0).astype(np.float64)
    return x, y


def init_params(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed + 1)
    return {
        "w1": rng.standard_normal((FEATURES, HIDDEN)) / np.sqrt(FEATURES),
        "b1": np.zeros(HIDDEN),
        "w2": rng.standard_normal(HIDDEN) / np.sqrt(HIDDEN),
        "b2": np.zeros(1),
    }


def train_step(
    params: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray, seed: int, step: int, lr: float
) -> float:
    """One SGD step on the minibatch of ``step`` (seeded by it); returns the minibatch loss."""
    idx = np.random.default_rng([seed, step]).integers(0, SAMPLES, BATCH)
    xb, yb = x[idx], y[idx]
    h = np.tanh(xb @ params["w1"] + params["b1"])
    p = 1.0 / (1.0 + np.exp(-(h @ params["w2"] + params["b2"][0])))
    loss = float(-np.mean(yb * np.log(p + 1e-12) + (1 - yb) * np.log(1 - p + 1e-12)))
    dz = (p - yb) / BATCH
    dh = np.outer(dz, params["w2"]) * (1 - h**2)
    params["w2"] -= lr * (h.T @ dz)
    params["b2"] -= lr * dz.sum()
    params["w1"] -= lr * (xb.T @ dh)
    params["b1"] -= lr * dh.sum(axis=0)
    return loss


def save_state(directory: Path, params: dict[str, np.ndarray], losses: list[float]) -> None:
    for name in PARAMS:
        np.save(directory / f"{name}.npy", params[name])
    np.save(directory / "losses.npy", np.array(losses))


def load_state(directory: Path) -> tuple[dict[str, np.ndarray], list[float]]:
    params = {name: np.load(directory / f"{name}.npy") for name in PARAMS}
    return params, [float(v) for v in np.load(directory / "losses.npy")]


def held(until_file: Path | None, step: int) -> bool:
    """True while ``until_file`` says not to go past ``step`` yet."""
    if until_file is None:
        return False
    try:
        return step >= int(until_file.read_text(encoding="utf-8").strip() or 0)
    except (FileNotFoundError, ValueError):
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--out", type=Path, help="write weights.npy and losses.npy here when done")
    parser.add_argument("--log", type=Path, help="append '<step> <loss hex> <epoch>' per step")
    parser.add_argument("--step-delay", type=float, default=0.0, help="sleep per step (tests: slow it down)")
    parser.add_argument(
        "--until-file",
        type=Path,
        help="tests: train no further than the step number this file holds (absent: no limit); "
        "the agent is still served while waiting, so the daemon can checkpoint, move or stop the job",
    )
    args = parser.parse_args()

    x, y = make_data(args.seed)
    ckpt = agent.resume()
    params, losses = load_state(ckpt) if ckpt else (init_params(args.seed), [])
    log = args.log.open("a", encoding="utf-8") if args.log else None
    epoch = os.environ.get("SPOTOPT_EPOCH", "0")
    step = agent.start_step()
    while step < args.steps:
        if held(args.until_file, step):
            if agent.should_checkpoint():
                with agent.checkpoint(step) as d:
                    save_state(d, params, losses)
            if agent.should_stop():
                break
            time.sleep(0.01)
            continue
        loss = train_step(params, x, y, args.seed, step, args.lr)
        step += 1
        losses.append(loss)
        if log:
            log.write(f"{step} {loss.hex()} {epoch}\n")
            log.flush()
        if args.step_delay:
            time.sleep(args.step_delay)
        agent.progress(step)
        if agent.should_checkpoint() or step == args.steps:
            with agent.checkpoint(step) as d:
                save_state(d, params, losses)
        if agent.should_stop():
            break
    agent.finish()
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        np.save(args.out / "weights.npy", np.concatenate([params[n].ravel() for n in PARAMS]))
        np.save(args.out / "losses.npy", np.array(losses))


if __name__ == "__main__":
    main()
