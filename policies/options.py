"""Where a policy's options come from: explicit arrays, or generated a block of jobs at a time.

Column generation (``policies.columns``) never needs every option at once: it prices them a
block at a time and keeps only the few that can lower the objective. So options live behind
one small interface, ``OptionSource.blocks()``, with two implementations:

- ``ExplicitOptions``: the arrays of a ``PolicyInput`` (what ``build_problem`` produces).
- ``GeneratedOptions``: every (job, market) pair, computed by a function from job × market
  matrices for a range of jobs. 10k jobs × 5k markets are 50 M options: as Python objects or
  even as five float64 arrays that is gigabytes, as a function of (job block) it is nothing.

A ``Block`` holds arrays that *broadcast* to one shape: 1-D for explicit options, jobs × markets
for generated ones (the job index is a column vector, market-only data a row vector, so nothing
is repeated in memory). A NaN throughput means "no option": NaN fails every comparison, so
pricing and seeding skip it without a separate mask.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from spotopt.errors import PolicyError

Array = np.ndarray[Any, Any]

BLOCK_CELLS = 2_000_000
"""Options priced at once: bounds pricing memory to a few arrays of this many float64s."""


@dataclass(frozen=True)
class Columns:
    """Explicit options (a subset of a source's): flat arrays, ``key`` unique per option."""

    job: Array
    market: Array
    steps_per_hour: Array
    usd_per_hour: Array
    instances_per_hour: Array
    key: Array

    def __len__(self) -> int:
        return len(self.key)

    @staticmethod
    def concat(parts: list[Columns]) -> Columns:
        if not parts:
            empty_i, empty_f = np.zeros(0, dtype=np.int64), np.zeros(0)
            return Columns(empty_i, empty_i, empty_f, empty_f, empty_f, empty_i)
        return Columns(*(np.concatenate([getattr(p, name) for p in parts]) for name in _FIELDS))

    def take(self, index: Array) -> Columns:
        return Columns(*(getattr(self, name)[index] for name in _FIELDS))


_FIELDS = ("job", "market", "steps_per_hour", "usd_per_hour", "instances_per_hour", "key")


@dataclass(frozen=True)
class Block:
    """Options of a range of jobs as arrays broadcasting to ``shape`` (see the module docstring).

    ``key`` is the option's index for explicit sources; ``None`` for generated ones, whose key
    is ``job * n_markets + market``.
    """

    job: Array
    market: Array
    steps_per_hour: Array
    usd_per_hour: Array
    instances_per_hour: Array
    n_markets: int
    key: Array | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        return np.broadcast_shapes(
            self.job.shape,
            self.market.shape,
            self.steps_per_hour.shape,
            self.usd_per_hour.shape,
            self.instances_per_hour.shape,
        )

    def take(self, index: tuple[Array, ...]) -> Columns:
        """The options at ``index`` (a tuple of index arrays into ``shape``) as flat columns."""
        shape = self.shape

        def at(a: Array) -> Array:
            return np.asarray(np.broadcast_to(a, shape)[index])

        job, market = at(self.job).astype(np.int64), at(self.market).astype(np.int64)
        key = job * self.n_markets + market if self.key is None else at(self.key)
        return Columns(
            job,
            market,
            at(self.steps_per_hour).astype(float),
            at(self.usd_per_hour).astype(float),
            at(self.instances_per_hour).astype(float),
            key,
        )


class OptionSource(Protocol):
    def blocks(self) -> Iterator[Block]:
        """Every option exactly once, a block of whole jobs at a time, in a fixed order."""
        ...


@dataclass(frozen=True)
class ExplicitOptions:
    """The option arrays of a ``PolicyInput``, grouped by job into blocks of about ``BLOCK_CELLS``."""

    job: Array
    market: Array
    steps_per_hour: Array
    usd_per_hour: Array
    instances_per_hour: Array
    n_markets: int

    def blocks(self) -> Iterator[Block]:
        order = np.argsort(self.job, kind="stable")
        for lo in range(0, len(order), BLOCK_CELLS):
            e = order[lo : lo + BLOCK_CELLS]
            yield Block(
                self.job[e],
                self.market[e],
                self.steps_per_hour[e],
                self.usd_per_hour[e],
                self.instances_per_hour[e],
                self.n_markets,
                key=e,
            )


BlockFn = Callable[[int, int], tuple[Array, Array, Array]]


@dataclass(frozen=True)
class GeneratedOptions:
    """Every (job, market) pair of ``n_jobs × n_markets``, computed block by block.

    ``block(lo, hi)`` returns ``(steps_per_hour, usd_per_hour, instances_per_hour)`` for jobs
    ``lo..hi-1``, each broadcastable to ``(hi - lo, n_markets)`` (a ``(1, n_markets)`` row for
    market-only data); a throughput <= 0 or NaN means the job cannot run there. It must be
    deterministic: column generation calls it once per pricing round. ``cache=True`` keeps the
    blocks (memory: one ``n_jobs × n_markets`` throughput matrix in the function's dtype) so
    an expensive ``block`` runs once.
    """

    n_jobs: int
    n_markets: int
    block: BlockFn
    cache: bool = False
    _cached: dict[int, Block] = field(default_factory=dict, repr=False, compare=False)

    def blocks(self) -> Iterator[Block]:
        rows = max(1, BLOCK_CELLS // max(1, self.n_markets))
        markets = np.arange(self.n_markets)[None, :]
        for lo in range(0, self.n_jobs, rows):
            if lo in self._cached:
                yield self._cached[lo]
                continue
            hi = min(self.n_jobs, lo + rows)
            tput, usd, share = (np.asarray(a) for a in self.block(lo, hi))
            tput = np.where(tput > 0, tput, np.nan).astype(tput.dtype if tput.dtype.kind == "f" else float)
            shape = (hi - lo, self.n_markets)
            for name, a in (("steps_per_hour", tput), ("usd_per_hour", usd), ("instances_per_hour", share)):
                if np.broadcast_shapes(a.shape, shape) != shape:
                    raise PolicyError(
                        f"GeneratedOptions.block({lo}, {hi}): {name} has shape {a.shape}, not {shape}"
                    )
            if np.any(usd < 0) or not np.all(share > 0):
                raise PolicyError(
                    f"GeneratedOptions.block({lo}, {hi}) needs usd_per_hour >= 0 and instances_per_hour > 0"
                )
            blk = Block(np.arange(lo, hi)[:, None], markets, tput, usd, share, self.n_markets)
            if self.cache:
                self._cached[lo] = blk
            yield blk


def job_best(source: OptionSource, n_jobs: int) -> tuple[Array, Array]:
    """Per job: its fastest option's throughput (0 if none) and that option's market (-1 if none)."""
    best = np.zeros(n_jobs)
    where = np.full(n_jobs, -1, dtype=np.int64)
    for blk in source.blocks():
        if len(blk.shape) == 2:
            tput = np.broadcast_to(blk.steps_per_hour, blk.shape)
            filled = np.where(np.isnan(tput), -np.inf, tput)
            arg = np.argmax(filled, axis=1)
            top = filled[np.arange(len(arg)), arg]
            jobs = blk.job[:, 0]
            better = top > best[jobs]
            best[jobs[better]] = top[better]
            where[jobs[better]] = np.broadcast_to(blk.market, blk.shape)[np.flatnonzero(better), arg[better]]
        else:
            order = np.lexsort((blk.steps_per_hour, blk.job))
            last = np.r_[blk.job[order][1:] != blk.job[order][:-1], True]
            top = order[last]
            better = blk.steps_per_hour[top] > best[blk.job[top]]
            best[blk.job[top[better]]] = blk.steps_per_hour[top[better]]
            where[blk.job[top[better]]] = blk.market[top[better]]
    return best, where


SPEED_BANDS = np.array([0.5, 0.7, 0.85])
"""Seed band edges, as a fraction of the job's fastest option's throughput."""


def seed_columns(source: OptionSource, cheapest: int) -> Columns:
    """A first restricted master: per job its ``cheapest`` options per step, the cheapest per
    step in each speed band (edges ``SPEED_BANDS``), and its fastest option.

    Without capacity limits, a job's optimum mixes at most two options on the lower convex
    hull of (throughput, $/hour): the cheapest per step if it meets the deadline, else a cheap
    slow one and a faster one. The cheapest options cover the first case, the bands' cheapest
    stand in for the hull's faster vertices (measured at 10k jobs × 5k markets: the first
    master's cost fell from 3.6x to 1.01x the optimum, and pricing rounds from 4 to 3), the
    fastest keeps any deadline reachable. Whatever else the optimum
    needs (mostly options on other markets once the cheap ones are full), pricing adds.
    A job with no seed column has no option at all.
    """
    parts = []
    for blk in source.blocks():
        shape = blk.shape
        tput = np.broadcast_to(blk.steps_per_hour, shape)
        per_step = np.broadcast_to(blk.usd_per_hour, shape) / tput
        if len(shape) == 2:
            parts.append(blk.take(_seed_rows(tput, np.where(tput > 0, per_step, np.inf), cheapest)))
        else:
            best = np.zeros(int(blk.job.max()) + 1)
            np.maximum.at(best, blk.job, tput)
            band = np.searchsorted(SPEED_BANDS, tput / best[blk.job])
            picked = [_first_per_job(blk.job, per_step, cheapest), _first_per_job(blk.job, -tput, 1)]
            for b in range(len(SPEED_BANDS) + 1):
                inside = np.flatnonzero(band == b)
                picked.append(inside[_first_per_job(blk.job[inside], per_step[inside], 1)])
            parts.append(blk.take((np.unique(np.concatenate(picked)),)))
    return _unique(Columns.concat(parts))


def _seed_rows(tput: Array, per_step: Array, cheapest: int) -> tuple[Array, Array]:
    """``seed_columns`` on a jobs × markets block (``per_step`` is ``inf`` where no option).

    Only argmin/argmax and comparisons: a partial sort per row (``argpartition``) and
    ``searchsorted`` cost several times more over 50 M options.
    """
    rows = np.arange(tput.shape[0])[:, None]
    fast = np.argmax(np.nan_to_num(tput, nan=-1.0), axis=1)[:, None]
    picked = [fast]
    left = per_step.copy()
    for _ in range(min(cheapest, tput.shape[1])):
        picked.append(np.argmin(left, axis=1)[:, None])
        left[rows, picked[-1]] = np.inf
    ratio = tput / tput[rows, fast]
    band = np.zeros(tput.shape, dtype=np.int8)
    for edge in SPEED_BANDS:
        band += ratio >= edge
    for b in range(len(SPEED_BANDS) + 1):
        picked.append(np.argmin(np.where(band == b, per_step, np.inf), axis=1)[:, None])
    cols = np.concatenate(picked, axis=1)
    rows = np.broadcast_to(rows, cols.shape)
    keep = np.isfinite(per_step[rows, cols])
    return rows[keep], cols[keep]


def _first_per_job(job: Array, value: Array, k: int) -> Array:
    """Indices of the ``k`` smallest ``value`` per job (1-D arrays)."""
    order = np.lexsort((value, job))
    sorted_jobs = job[order]
    starts = np.r_[0, np.flatnonzero(sorted_jobs[1:] != sorted_jobs[:-1]) + 1]
    rank = np.arange(len(order)) - np.repeat(starts, np.diff(np.r_[starts, len(order)]))
    return np.asarray(order[rank < k])


def _unique(cols: Columns) -> Columns:
    _, first = np.unique(cols.key, return_index=True)
    return cols.take(np.sort(first))


@dataclass(frozen=True)
class Prices:
    """What an option is worth to the current restricted master (see ``policies.columns``).

    Reduced cost of option ``e`` of job ``j`` on market ``m``, with ``a = T / W[j]``::

        rc = cost_weight * c + (rate_weight[j]) * a - wall[j] - cap[m] * s

    ``rate_weight[j]`` folds the objective's weight on ``a`` and the work row's dual;
    ``wall`` and ``cap`` (0 for unlimited markets) are the wall-time and capacity rows' duals.
    """

    cost_weight: float
    rate_weight: Array
    wall: Array
    cap: Array
    work_steps: Array


def price(source: OptionSource, prices: Prices, per_job: int, tol: float) -> tuple[Columns, Array]:
    """Per job, its ``per_job`` options of most negative reduced cost below ``-tol``.

    Also returns each job's smallest reduced cost over all its options (``0`` if none is
    negative): the column-generation bound needs it. Per block, the full-size work is three
    in-place array passes and one comparison; terms of jobs or markets alone are computed
    at their own small shape first. Rows are only partially sorted when many options are
    negative (the first rounds); later the few negatives are picked out directly.
    """
    n_jobs = len(prices.work_steps)
    lowest = np.zeros(n_jobs)
    parts = []
    for blk in source.blocks():
        rate = prices.rate_weight[blk.job] / prices.work_steps[blk.job]
        rc = np.multiply(rate, blk.steps_per_hour, dtype=float)
        rc += prices.cost_weight * blk.usd_per_hour - prices.cap[blk.market] * blk.instances_per_hour
        rc -= prices.wall[blk.job]
        rc = np.broadcast_to(rc, blk.shape)
        index = np.nonzero(rc < 0) if rc.ndim == 1 or not _many(rc, per_job) else _row_smallest(rc, per_job)
        jobs = np.broadcast_to(blk.job, blk.shape)[index]
        values = rc[index]
        np.minimum.at(lowest, jobs, values)
        keep = values < -tol
        index, jobs, values = tuple(i[keep] for i in index), jobs[keep], values[keep]
        pick = _first_per_job(jobs, values, per_job)
        parts.append(blk.take(tuple(i[pick] for i in index)))
    return Columns.concat(parts), lowest


def _many(rc: Array, per_job: int) -> bool:
    """More negative options than ``per_job`` per job on average in this 2-D block?"""
    return int(np.count_nonzero(rc < 0)) > per_job * rc.shape[0]


def _row_smallest(rc: Array, k: int) -> tuple[Array, Array]:
    """Index of each row's ``k`` smallest entries (NaN, "no option", sorts last)."""
    k = min(k, rc.shape[1])
    cols = np.argpartition(rc, k - 1, axis=1)[:, :k]
    rows = np.broadcast_to(np.arange(rc.shape[0])[:, None], cols.shape)
    good = rc[rows, cols] < 0
    return rows[good], cols[good]
