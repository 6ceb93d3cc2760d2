"""The examples in the package's docstrings run and show what they say (``doctest``): a reader
can trust them. An example that needs a database, a store, a server or a model is written as a
literal block (``::``) instead, and is not run."""
from __future__ import annotations

import doctest
import importlib
import io
import pkgutil

import pytest

import registry

#: ``python -m registry.cli`` runs the CLI when imported
NOT_IMPORTED = {"registry.cli.__main__"}
MODULES = sorted(m.name for m in pkgutil.walk_packages(registry.__path__, "registry.") if m.name not in NOT_IMPORTED)


@pytest.mark.parametrize("name", MODULES)
def test_the_examples_in_each_module_run(name):
    module = importlib.import_module(name)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    report = io.StringIO()
    for test in doctest.DocTestFinder().find(module, name):
        runner.run(test, out=report.write)
    assert runner.failures == 0, f"{runner.failures} of {runner.tries} examples in {name} fail:\n{report.getvalue()}"


def test_the_package_has_examples_that_run():
    """The check above finds the examples (a finder that found none would pass every module):
    counted, not run again."""
    found = [example for name in MODULES
             for test in doctest.DocTestFinder().find(importlib.import_module(name), name)
             for example in test.examples if not example.options.get(doctest.SKIP)]
    assert len(found) >= 50
