"""Test plugins: tiny exported models, and the real services of the integration tier.

Artifacts and services are made once per run and shared by the xdist workers (``tests.shared``);
the CLI runs in the test process unless the process is what a test is about
(``tests.cli_inprocess``)."""
import os

# The first-load sandbox (registry/sandbox.py) starts a torch subprocess per new program digest
# (~2 s each): off for the suite (and the CLI subprocesses it starts), on in the tests about it
# (tests/integration/test_trust_sandbox.py). A developer's own trust policy must not leak in.
os.environ["PT2REG_SANDBOX"] = "off"
os.environ.pop("PT2REG_TRUST", None)

pytest_plugins = [
    "tests.cli_inprocess",  # first: the plugins below import it (its asserts are rewritten)
    "tests.fixtures_pt2",
    "tests.services_pg",
    "tests.services_s3",
    "tests.services_oci",
    "tests.fixtures_registry",
    "tests.integration.conftest_models",
    "tests.big_bundle",
]


def pytest_collection_modifyitems(config, items):
    """Start the longest tests first: the crash campaigns, the benchmark smoke run, then the
    other tests marked ``slow``. The suite runs on two pytest-xdist workers
    (``scripts/test.sh``); a long test left for the end would keep one core busy while the
    other sits idle."""
    rank = {"test_crash_safety.py": 0, "test_benchmarks_smoke.py": 1}
    items.sort(key=lambda item: (rank.get(item.path.name, 2), item.get_closest_marker("slow") is None))
