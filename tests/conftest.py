"""Shared pytest configuration.

The outbox fixtures (`outbox_servers`, `outbox_database_url`, `outbox_topic`, ...) come from the
`outbox.testing.plugin` pytest plugin, loaded through the package's `pytest11` entry point once
it is installed (`./run test` does that). Do not also list it in `pytest_plugins`: pytest
would register it twice and fail.
"""
