"""Layer 2: what the daemon keeps on disk and the operator commands read. ``statefile`` (the status
and state files), ``control`` (the control socket), ``maintenance`` (the pause), ``records`` (the history of
what ran). Imports ``base``, ``model`` and ``config`` only: no judgement, no I/O beyond the state directory."""
