"""Names and labels derived from keys: valid for every cloud, deterministic, and distinct."""

from __future__ import annotations

import re
import uuid

from hypothesis import given
from hypothesis import strategies as st

from spotopt.clouds.common.naming import label_key, label_value, request_uuid, resource_name

RFC1035 = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
LABEL = re.compile(r"[a-z0-9_-]{0,63}")


@given(st.text())
def test_a_resource_name_is_rfc1035_and_a_function_of_the_key(key: str) -> None:
    name = resource_name(key)
    assert RFC1035.fullmatch(name) and name == resource_name(key)


@given(st.text(), st.text())
def test_keys_that_slug_alike_get_different_names_and_labels(a: str, b: str) -> None:
    if a != b:
        assert resource_name(a) != resource_name(b)
        assert label_value(a) != label_value(b)


@given(st.text())
def test_label_values_and_keys_follow_gcp_label_rules(text: str) -> None:
    assert LABEL.fullmatch(label_value(text))
    key = label_key(text)
    assert LABEL.fullmatch(key) and key[:1].isalpha()


def test_examples() -> None:
    assert resource_name("train-1/3/move-7").startswith("spotopt-train-1-3-move-7-")
    assert len(resource_name("x" * 500)) == 63
    assert label_value("already_fine-1") == "already_fine-1"  # unchanged when valid
    assert re.fullmatch(r"job_a-[0-9a-f]{10}", label_value("Job A"))
    assert request_uuid("k", "z") == request_uuid("k", "z") != request_uuid("k", "z2")
    assert uuid.UUID(request_uuid("k", "z")).version == 5
