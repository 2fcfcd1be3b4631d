"""``--memory-budget`` has one check (:func:`inspector.store.specs.check_memory_budget`) that the CLI before torch
loads, exact effects, integrated gradients and sources all call: the same value gets the same one line from each."""

from __future__ import annotations

import argparse

import pytest

from inspector.attribute.attribution import check_ig_options
from inspector.attribute.sources import SourcesOptions
from inspector.cli.investigate import check_budget_args
from inspector.errors import InspectorError
from inspector.intervene.effects import check_budget
from inspector.store.specs import MEMORY_LIMIT_GIB, check_memory_budget

PATHS = {
    "cli": lambda m: check_budget_args(argparse.Namespace(budget=None, memory_budget=m)),
    "effects": lambda m: check_budget(memory_gib=m),
    "integrated gradients": lambda m: check_ig_options(20, memory_gib=m),
    "sources": lambda m: SourcesOptions(memory_gib=m),
}


@pytest.mark.parametrize("value", [0, -1, 0.0, float("nan"), float("inf"), -float("inf"), MEMORY_LIMIT_GIB * 2,
                                   True, "3"])
def test_every_path_refuses_a_bad_memory_budget_with_the_same_line(value):
    with pytest.raises(InspectorError) as want:
        check_memory_budget(value)
    line = str(want.value)
    assert line.startswith("--memory-budget must be more than 0 and at most 65536 GiB, got ")
    for name, path in PATHS.items():
        with pytest.raises(InspectorError) as got:
            path(value)
        assert str(got.value) == line, name


@pytest.mark.parametrize("value", [0.001, 1, 2.5, MEMORY_LIMIT_GIB])
def test_every_path_takes_a_memory_budget_within_the_bounds(value):
    for path in PATHS.values():
        path(value)


def test_none_is_the_default_except_where_the_default_is_a_number():
    """None passes where it means "the default bound" (CLI, effects, sources); integrated gradients' default is a
    number, so None there is refused with the same line as every other bad value."""
    for name in ("cli", "effects", "sources"):
        PATHS[name](None)
    with pytest.raises(InspectorError, match=r"^--memory-budget must be more than 0 and at most 65536 GiB, got None$"):
        check_ig_options(20, memory_gib=None)
