"""``--preemptions replay``: recorded preemptions (``instance_lifetimes``) placed at their ticks."""

from __future__ import annotations

import numpy as np
import pytest

from spotopt.db.engine import Database
from spotopt.db.queries import preemption_ends
from spotopt.whatif.preemptions import replayed_preemptions
from spotopt.whatif.timeline import load_timeline
from tests.report_history import T0, build, h


def test_replay_places_each_recorded_preemption_in_its_tick(db: Database) -> None:
    build(db)  # market A: preempted at h5, h6, h9 and h50; terminated at h10; two still running
    with db.session() as session:
        ends = preemption_ends(session, T0, h(48))
        tl = load_timeline(session, T0, 48.0, 1.0)
        table, markets = replayed_preemptions(session, tl)
    assert [when for _, when in ends] == [h(5), h(6), h(9)]
    assert len({market for market, _ in ends}) == 1
    a = next(
        i
        for i, m in enumerate(tl.markets)
        if m.quote.zone == "us-east-1a" and m.quote.instance_type == "tst.v100.1" and m.quote.market == "spot"
    )
    assert markets == 1
    # Each end at the very start of its hour: the notice two minutes before (AWS), at the end of
    # the hour before.
    assert np.flatnonzero(np.isfinite(table[a])).tolist() == [4, 5, 8]
    assert table[a, [4, 5, 8]] == pytest.approx(1.0 - 2.0 / 60.0)
    assert np.isfinite(table).sum() == 3
