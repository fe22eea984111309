"""Registers the shared fixtures of tests/fixtures.py; plain helpers are in tests/helpers.py.

Nothing imports this file by name: pytest loads it (as `conftest`), and a test module that
needs a helper imports it from `tests.helpers`.
"""

pytest_plugins = ["tests.fixtures", "tests.gcs_emulator", "tests.gcs_counting"]  # gcs_emulator: `gcs`, `gcs_bucket`
