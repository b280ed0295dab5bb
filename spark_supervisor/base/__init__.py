"""Layer 0, beside ``model``: what every layer uses and that knows nothing of deployments. ``files``
(bounded reads that refuse special files), ``redaction`` (secrets scrubbed from text), ``log`` (the logger
type every layer is handed).
Imports nothing of the package."""
