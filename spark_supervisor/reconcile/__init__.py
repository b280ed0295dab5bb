"""Layer 7: one deployment's state machine. ``reconciler`` (observe -> plan -> act, its phase and
budget), ``tracking`` (what it keeps between ticks), ``recording`` (its records), ``loadtimes`` (the load
times learned per model), ``pause``, ``restart``. Imports any layer below, never ``change`` or ``loop``."""
