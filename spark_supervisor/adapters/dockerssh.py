"""A Docker engine reached over ssh:// with the node's own known_hosts and key ([[nodes]] known_hosts,
identity_file), and the host-key errors of that path named.

Why paramiko and not docker-py's ``use_ssh_client=True`` (which runs the ssh binary, so ssh_argv's options
would apply): docker-py runs ``ssh -- host docker system dial-stdio`` with no way to pass options, so no
BatchMode (a host asking for a password would hang the connection, not fail it), no ConnectTimeout, no
known_hosts or key of the node's own; it needs the docker CLI on the node, and every connection of the pool
is an ssh process of its own. Paramiko is what the engine's event streams and listings were measured on
(adapters.docker). So the paramiko client stays, given the same files ssh(1) is given: both paths trust the
same host keys and log in with the same key, and the access check (world.access) tries both.
"""

from __future__ import annotations

import docker
import docker.constants
import paramiko
from docker.transport import SSHHTTPAdapter

from ..model import Kind
from . import AdapterError, Unreachable
from .shell import SshKeys


class _Adapter(SSHHTTPAdapter):  # type: ignore[misc]  # docker-py is untyped
    """docker-py's SSH adapter (its ssh config's HostName, Port, User, IdentityFile and ProxyCommand read as
    ever), with the node's known_hosts alone and its key."""

    def __init__(self, base_url: str, keys: SshKeys, *, timeout: int, max_pool_size: int):
        self._keys = keys
        super().__init__(base_url, timeout, pool_connections=docker.constants.DEFAULT_NUM_POOLS_SSH,
                         max_pool_size=max_pool_size)

    def _create_paramiko_client(self, base_url: str) -> None:
        super()._create_paramiko_client(base_url)
        if self._keys.known_hosts:
            client = paramiko.SSHClient()  # a fresh one: only this file's keys, not also $HOME's
            try:
                client.load_system_host_keys(self._keys.known_hosts)
            except FileNotFoundError:
                pass  # no file: no host known, as ssh(1) takes it (the connect is then refused by the policy)
            client.set_missing_host_key_policy(paramiko.RejectPolicy())
            self.ssh_client = client
        if self._keys.identity_file:
            self.ssh_params["key_filename"] = self._keys.identity_file
            self.ssh_params["look_for_keys"] = False  # the key given, as ssh's IdentitiesOnly


def client(url: str, timeout: float, keys: SshKeys) -> docker.DockerClient:
    """A client of the ssh:// engine at ``url`` through the node's files. docker-py builds its SSH adapter
    in the client's constructor (and connects it there), so the client is made with the adapter that does
    not connect (use_ssh_client) and a fixed API version (no request yet), then given ours; the engine's own
    API version is then asked through ours, as docker-py's "auto" does."""
    c = docker.DockerClient(base_url=url, timeout=int(timeout), max_pool_size=4, use_ssh_client=True,
                            version=docker.constants.MINIMUM_DOCKER_API_VERSION)
    adapter = _Adapter(url, keys, timeout=int(timeout), max_pool_size=4)
    api = c.api  # docker-py is untyped: its private attributes, as its constructor sets them
    api._custom_adapter = adapter
    api.mount("http+docker://ssh", adapter)
    api._version = api._retrieve_server_version()
    return c


def host_key_error(e: BaseException) -> AdapterError | None:
    """paramiko's refusal of the engine's host, named: unknown to the known_hosts read (its RejectPolicy)
    or not matching what is recorded there; None for any other error."""
    if isinstance(e, paramiko.BadHostKeyException):
        return Unreachable(Kind.HOST_KEY_CHANGED, f"{e} (the host's key is not the one recorded in known_hosts)")
    if isinstance(e, paramiko.SSHException) and "not found in known_hosts" in str(e):
        return Unreachable(Kind.HOST_KEY_UNKNOWN, str(e))
    return None
