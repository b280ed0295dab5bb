"""Layer 3: what the supervisor runs, as data. ``commands`` builds every argument list and container
spec (the serve, Ray, the probes, the checks), ``script`` reads the fixed scripts of ``scripts/`` that they
run. Pure: imports ``config``, ``model``, ``base`` and the adapters' types, runs nothing."""
