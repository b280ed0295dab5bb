"""Side effects live here: Docker, SSH, systemctl, nvidia-smi, Ray's dashboard, vLLM's HTTP API."""


class AdapterError(Exception):
    """An I/O operation failed; ``reason`` is a CamelCase tag for status, ``str()`` the detail."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.reason}: {self.args[0]}"
