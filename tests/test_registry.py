"""The one registry behind collectors, policies and reports: names, lookup errors, lazy loading."""

from __future__ import annotations

import pytest

from spotopt.clouds.registry import COLLECTORS
from spotopt.errors import InputError
from spotopt.policies.base import POLICIES
from spotopt.registry import Registry
from spotopt.reports.registry import REPORTS


def test_names_must_be_kebab_case() -> None:
    registry: Registry[int] = Registry("thing", "things")
    for bad in ("Min-Cost", "min_cost", "min cost", "-min", "min-", ""):
        with pytest.raises(ValueError, match="not kebab-case"):
            registry.add(bad, 1)
    assert registry.add("min-cost-2", 1) == 1


def test_a_name_holds_one_item() -> None:
    registry: Registry[object] = Registry("thing", "things")
    item = object()
    registry.add("a", item)
    registry.add("a", item)  # the same module imported twice
    with pytest.raises(ValueError, match="two things named 'a'"):
        registry.add("a", object())
    assert list(registry) == ["a"]


def test_unknown_name_is_an_input_error_with_did_you_mean_and_the_valid_names() -> None:
    registry: Registry[int] = Registry("thing", "things")

    @registry.register("alpha-one")
    def _one() -> int:  # the decorator returns what it registers
        return 1

    registry.add("beta", 2)
    with pytest.raises(
        InputError, match=r"^no thing 'alpah-one' \(did you mean 'alpha-one'\?\); things: alpha-one, beta$"
    ):
        registry.lookup("alpah-one")
    with pytest.raises(InputError, match=r"^no thing 'zzz'; things: alpha-one, beta$"):
        registry.lookup("zzz")
    assert registry.lookup("beta") == 2 and InputError.exit_code == 2


def test_load_runs_once_on_first_read_and_a_failure_is_not_hidden() -> None:
    calls = []
    registry: Registry[int] = Registry("thing", "things", load=lambda: calls.append(registry.add("x", 1)))
    assert calls == []  # creating the registry imports nothing
    assert registry.names() == ["x"] and registry.lookup("x") == 1 and len(registry) == 1
    assert calls == [1]

    def broken() -> None:
        raise ImportError("no module named spotopt.collectors.nope")

    failing: Registry[int] = Registry("thing", "things", load=broken)
    for _ in range(2):  # raised again on the next read, not an empty registry
        with pytest.raises(ImportError):
            failing.lookup("x")


@pytest.mark.parametrize(
    ("registry", "typo", "kind", "suggested"),
    [
        (COLLECTORS, "aws-spot-price", "collector", "aws-spot-prices"),
        (POLICIES, "min-cots", "policy", "min-cost"),
        (REPORTS, "chepest", "report", "cheapest"),
    ],
)
def test_collectors_policies_and_reports_share_it(
    registry: Registry[object], typo: str, kind: str, suggested: str
) -> None:
    assert isinstance(registry, Registry) and suggested in registry
    with pytest.raises(InputError, match=rf"^no {kind} '{typo}' \(did you mean '{suggested}'\?\); "):
        registry.lookup(typo)
