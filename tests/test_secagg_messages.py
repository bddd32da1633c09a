"""What a hospital in a secagg round is told without -v: whom it waits for, and why a round it joins was opened."""

from __future__ import annotations

import logging

import pytest

from support.sessions import run_secagg_plan

pytestmark = pytest.mark.e2e


def test_a_hospital_hears_whom_it_waits_for_and_why_the_round_it_joins_was_opened(consortium, caplog):
    # Prepare: 4 hospitals, t = 2 (quorum 3); h3 and h4 crash before the masked input, so round 1 aborts;
    # h3 runs again at once, h4 never comes back
    names = ("h1", "h2", "h3", "h4")
    c = consortium(backend="secagg", hospitals=names, min_clients=2,
                   secagg={"threshold": 2, "stage_timeout_s": 3.0}).start()
    data = {h: c.data(h, n=30) for h in names}
    plan = {"h1": [None], "h2": [None], "h3": ["masked_input", None], "h4": ["masked_input"]}
    # Execute: the hospitals' run loops, logging at the level `client submit` shows without -v
    with caplog.at_level(logging.WARNING, logger="secure_afl.client"):
        results, errors = run_secagg_plan(c, data, plan)
    # Assert: every hospital that waited named whom for; each one that joined round 2 was told why round 1
    # ended (its stage, its count, who dropped)
    assert not errors, errors
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    waits = [m for m in lines if " waits for " in m]
    assert waits and all(", round " in m for m in waits), lines
    named = [m for m in waits if "the stage closes within" in m]
    assert any(m.startswith("h1 waits for h") for m in named), waits
    joins = [m for m in lines if "joins secagg round 2" in m]
    assert {m.split()[0] for m in joins} == {"h1", "h2", "h3"}, lines
    assert all("round 1 aborted at masked_input: 2 of 4 answered, dropped h3, h4" in m for m in joins), joins
