"""Layer 0, beside ``model``: what every layer uses and that knows nothing of deployments. ``files``
(bounded reads that refuse special files, atomic writes), ``redaction`` (secrets scrubbed from text).
Imports nothing of the package."""
