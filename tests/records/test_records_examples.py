"""The runnable examples in the records docstrings stay true."""

from __future__ import annotations

import doctest

import pytest

from elfes.records import plain, schema


@pytest.mark.parametrize("module", [schema, plain], ids=lambda module: module.__name__)
def test_docstring_examples_run(module):
    results = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert results.attempted > 0 and results.failed == 0
