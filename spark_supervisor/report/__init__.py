"""Layer 6: what the daemon tells the world. ``metrics`` (Prometheus), ``alerts`` (webhooks and
commands), ``notify`` (systemd), ``journal`` (the structured log in journald), ``statusdoc`` (the status
document), ``record`` (the record of what ran and why). Imports any layer below."""
