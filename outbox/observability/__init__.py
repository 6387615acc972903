"""What the daemons show of themselves: metrics, health checks, structured logs, masked secrets.

- `runtime`: `ObservabilityConfig` and `Observability`, which a daemon owns and calls once per
  batch; `@observed` serves metrics and health while the daemon's `run()` runs.
- `metrics`: the per-batch metrics interface, a no-op and a Prometheus implementation.
- `health`: the heartbeat, `/livez` and `/readyz` on the standard library's http.server.
- `logs`: text and JSON-lines formatters.
- `redact`: masking of passwords and secret settings in everything printed.

Importing this package does not import prometheus-client; only `--metrics-port` needs it.
"""
