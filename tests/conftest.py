"""Test plugins: tiny exported models, and the real services of the integration tier."""
pytest_plugins = [
    "tests.fixtures_pt2",
    "tests.services_pg",
    "tests.services_s3",
    "tests.fixtures_registry",
    "tests.integration.conftest_models",
    "tests.big_bundle",
]


def pytest_collection_modifyitems(config, items):
    """Start the tests marked ``slow`` first (the crash campaigns, the benchmark smoke run), the
    longest first. The suite runs on two pytest-xdist workers (``scripts/test.sh``); a long test
    left for the end would keep one core busy while the other sits idle."""
    rank = {"test_crash_safety.py": 0, "test_benchmarks_smoke.py": 1}
    items.sort(key=lambda item: (item.get_closest_marker("slow") is None,
                                 rank.get(item.path.name, 2)))
