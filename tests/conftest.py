"""Test plugins: tiny exported models, and the real services of the integration tier."""
pytest_plugins = [
    "tests.fixtures_pt2",
    "tests.services_pg",
    "tests.services_s3",
    "tests.fixtures_registry",
    "tests.integration.conftest_models",
    "tests.big_bundle",
]
