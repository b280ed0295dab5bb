"""Layer 9: the process. ``daemon`` (signals, the control socket, the main loop), ``stack`` (one reconciler per
deployment, with its schedule, and a change switched in), ``reload`` (SIGHUP: read, prove, switch),
``reporting`` (systemd and the status file), ``waiting`` (the wait between ticks). Only ``cli`` is above."""
