"""A cloud's folder holds its pieces, and what is outside the folder finds them (issue 22).

A cloud's settings section is the one piece named outside its folder and the registry: it is a
base class of ``Settings`` (a type checker has to see it), so forgetting it is caught here.
"""

from __future__ import annotations

import importlib
import importlib.util

import pytest
from pydantic import BaseModel

from spotopt.clouds.registry import CLOUDS
from spotopt.settings import Settings


@pytest.mark.parametrize("cloud", list(CLOUDS))
def test_a_clouds_settings_section_is_part_of_the_settings(cloud: str) -> None:
    module = f"spotopt.clouds.{cloud}.settings"
    if importlib.util.find_spec(module) is None:
        return  # a cloud without settings (local)
    sections = [v for v in vars(importlib.import_module(module)).values() if _is_section(v, module)]
    assert sections, f"{module} declares no settings section"
    for section in sections:
        assert section in Settings.__mro__, f"{section.__name__}: a base of Settings?"
        assert all(name.startswith(f"{cloud}_") for name in section.model_fields), section.model_fields


def _is_section(value: object, module: str) -> bool:
    return isinstance(value, type) and issubclass(value, BaseModel) and value.__module__ == module
