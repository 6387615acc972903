-- The statements of the test harness's administration (outbox.testing): the databases tests
-- run in, created from a migrated template and dropped. `{database}` and `{template}` are
-- database names, quoted as identifiers by `compose` (CREATE DATABASE takes no parameters);
-- there is no `{schema}`. Every name starts with `admin_`.

-- name: admin_create_database
-- A new database cloned from `{template}` (template1 is PostgreSQL's default).
CREATE DATABASE {database} TEMPLATE {template}

-- name: admin_create_database_file_copy
-- The same on PostgreSQL >= 15, copying files (fast for small databases) instead of WAL-logging.
CREATE DATABASE {database} TEMPLATE {template} STRATEGY FILE_COPY

-- name: admin_drop_database
-- Drop a database; its open connections are terminated.
DROP DATABASE IF EXISTS {database} WITH (FORCE)

-- name: admin_forbid_connections
-- A template: CREATE DATABASE ... TEMPLATE needs it to have no connections.
ALTER DATABASE {database} WITH ALLOW_CONNECTIONS false

-- name: admin_end_sessions
-- End every other session of a database (connections a migration leaked would block clones).
SELECT pg_terminate_backend(pid) FROM pg_stat_activity
WHERE datname = %(database)s AND pid <> pg_backend_pid()
