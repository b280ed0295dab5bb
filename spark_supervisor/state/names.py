"""Every file a state directory holds, named here once. The daemon's directory (``supervisor.state_dir``)
and each deployment's (``deployments/<name>`` in it: config.deployment_dir) hold the same kinds of file;
which one a file is in is said where it is used. The daemon refuses to start while any of the regular
files (REGULAR) is a link, a FIFO or a device: it would write through it."""

from __future__ import annotations

LOCK = "lock"  # held by the running daemon (flock): `status` tells a stopped daemon by it
STATUS = "status.json"  # what the daemon tells: the status document
PAUSE = "pause.json"  # maintenance mode: outlives a restart
REPAIRS = "repairs.json"  # the repair log the budget counts
KV_CACHE = "kv.json"  # the best KV cache each serve spec reached
NODES = "images.json"  # what the checks of each node found: its image's and its model's
RECORDS = "records.jsonl"  # the history of what ran (state.records)
RECORD_BAD = "record-bad.json"  # the facts when it last went bad, beside the last good record
PERF = "perf.json"  # the best throughput measured for each key
LOADS = "loads.json"  # the load times learned for each model and spec
CHANGES = "changes.json"  # the pinned images and the way back of a change on probation; 0600 (may hold secrets)
SOCKET = "control.sock"  # the control socket the operator commands talk to
REPORTS = "reports"  # the directory support bundles are written to

REGULAR = (LOCK, STATUS, PAUSE, REPAIRS, KV_CACHE, NODES, RECORDS, RECORD_BAD, PERF, LOADS, CHANGES)
