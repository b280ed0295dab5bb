"""Reading a config file and turning it into a Config: size-bounded reading that never blocks, ${NAME}
expansion, control characters, pydantic's errors as "<file>: <key>: <message>" lines, the API key,
warnings, and parse()/load(), from which nothing but a ConfigError ever leaves."""

from __future__ import annotations

import difflib
import os
import re
import stat
import tomllib
import typing
import unicodedata
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, SecretStr, ValidationError

from ..base import files
from ..base.redaction import secret_env
from .fields import _SEARCH_PATH_ENV, Problems, _inside, _q
from .labels import MAX_CONFIG_BYTES, MAX_KEY_BYTES
from .root import Config
from .schema import Readiness


class ConfigError(Exception):
    """A config file that cannot be used; ``problems`` holds one line per problem."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


_VAR = re.compile(r"\$(?:\$|\{([A-Za-z_][A-Za-z0-9_]*)\})")


def _part(k: str) -> str:
    """One key of a path, quoted the TOML way when it is not a bare key."""
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else _q(k)


def _join(path: str, k: str) -> str:
    return f"{path}.{_part(k)}" if path else _part(k)


def _expand(value: object, path: str, problems: list[str], env: dict[str, str]) -> object:
    if isinstance(value, str):
        def sub(m: re.Match[str]) -> str:
            if m.group(0) == "$$":
                return "$"
            name = m.group(1)
            if name not in env:
                problems.append(f"{path}: environment variable {name} is not set")
                return ""
            return env[name]
        return _VAR.sub(sub, value)
    if isinstance(value, dict):
        return {k: _expand(v, _join(path, str(k)), problems, env) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand(v, f"{path}[{i}]", problems, env) for i, v in enumerate(value)]
    return value


def _control(s: str) -> str:
    """The first control character of ``s`` other than tab, or invisible format character (bidi overrides,
    zero-width joiners: text that reads otherwise than it is), as U+XXXX, or ""."""
    for c in s:
        if c != "\t" and unicodedata.category(c) in ("Cc", "Cf"):
            return f"U+{ord(c):04X}"
    return ""


def _kind(code: str) -> str:
    return "invisible format" if unicodedata.category(chr(int(code[2:], 16))) == "Cf" else "control"


def _controls(value: object, path: str, problems: list[str]) -> None:
    if isinstance(value, str):
        if c := _control(value):
            problems.append(f"{path or '(top level)'}: contains the {_kind(c)} character {c}: remove it (tab "
                            "is the only control character allowed)")
    elif isinstance(value, dict):
        for k, v in value.items():
            if c := _control(str(k)):
                problems.append(f"{_join(path, str(k))}: the key contains the {_kind(c)} character {c}: rename it")
            else:
                _controls(v, _join(path, str(k)), problems)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _controls(v, f"{path}[{i}]", problems)


def _key(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part == "[key]" or part.startswith(("function-", "tagged-union")):
            continue
        else:
            out = _join(out, part)
    return out or "(top level)"


def _inner_model(ann: object) -> type[BaseModel] | None:
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann
    for a in typing.get_args(ann):
        if m := _inner_model(a):
            return m
    return None


def _fields_at(loc: tuple[int | str, ...]) -> list[str]:
    """The keys allowed where ``loc`` points (for "did you mean"), or []."""
    model: type[BaseModel] | None = Config
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        if model is None or part not in model.model_fields:
            return []
        model = _inner_model(model.model_fields[part].annotation)
    return list(model.model_fields) if model else []


# Keys that existed once: say what replaced them instead of "unknown key".
_REMOVED = {
    ("readiness", "api_key"): "removed: a key written in the config ends up on command lines and in the "
                              "journal; put it in a root-only file and set api_key_file = \"/etc/spark-supervisor/"
                              "api-key\", or set api_key_env to the name of an environment variable of the "
                              "supervisor",
}


def _format(err: ValidationError) -> list[str]:
    lines = []
    for e in err.errors(include_url=False, include_input=False):
        msg = e["msg"].removeprefix("Value error, ")
        loc = e["loc"]
        key = _key(loc)
        if e["type"] == "extra_forbidden":
            strs = tuple(p for p in loc if isinstance(p, str))
            msg = (_REMOVED.get((strs[-2], strs[-1])) if len(strs) >= 2 else None) or "unknown key"
            if msg == "unknown key" and strs:
                close = difflib.get_close_matches(strs[-1], _fields_at(loc), n=1, cutoff=0.75)
                if close:
                    msg += f" (did you mean {close[0]!r}?)"
        elif e["type"] == "finite_number":
            msg = "nan and inf are not allowed: give a finite number"
        elif e["type"] == "missing":
            msg = "required key is missing"
        found = e.get("ctx", {}).get("error")
        if not isinstance(found, Problems):
            lines += [f"{key}: {part}" for part in msg.split("\n")]
            continue
        for k, m in found.problems:
            if k.startswith((".", "[")):
                lines.append(f"{(key if key != '(top level)' else '') + k}: {m}".lstrip("."))
            else:
                lines.append(f"{k}: {m}")
    return lines


_SPECIAL_TREES = ("/dev", "/proc", "/sys")


def _special_link(path: str) -> str:
    """The first step of ``path``'s resolution into /dev, /proc or /sys (e.g. /dev/stdin, a link to
    /proc/self/fd/0), or "": those are never a config or a key, whatever they point at now."""
    todo, done, hops = [c for c in os.path.abspath(path).split("/") if c], "/", 0
    while todo:
        part = todo.pop(0)
        nxt = os.path.normpath(os.path.join(done, part))
        if any(_inside(nxt, t) for t in _SPECIAL_TREES):
            return os.path.join(nxt, *todo)
        try:
            target = os.readlink(nxt)
        except OSError:
            done = nxt
            continue
        hops += 1
        if hops > 40:
            return ""  # a loop: the open reports it
        base = "/" if target.startswith("/") else done
        todo = [c for c in target.split("/") if c] + todo
        done = base
    return ""


def _read(path: Path, limit: int) -> tuple[bytes, str]:
    """The bytes of a small regular file, or a problem saying why not (never raises, never blocks)."""
    try:
        if special := _special_link(str(path)):
            return b"", f"is not a regular file (it leads to {special}): give the path of a file"
        if os.path.isdir(path):
            return b"", "is a directory: give the path of a file"
        return files.read_bytes(path, limit), ""
    except files.Refused as e:
        return b"", e.why
    except OSError as e:
        return b"", e.strerror or type(e).__name__
    except ValueError as e:  # e.g. a NUL in the path
        return b"", str(e)


def _key_file_owner(path: str) -> str:
    """Why a key file is not the daemon's own ("" when it is): a warning (its owner could change the key)."""
    try:
        st = os.stat(path)
    except OSError as e:
        return e.strerror or type(e).__name__
    if st.st_uid != os.geteuid():
        return (f"is owned by uid {st.st_uid}, not by the supervisor (uid {os.geteuid()}): chown it to "
                f"{'root' if os.geteuid() == 0 else 'the supervisor'} and chmod 600")
    return ""


def _key_file_open(path: str) -> str:
    """Why a key file is refused for its mode ("" when others may not touch it): a key that others can read
    is no key."""
    try:
        st = os.stat(path)
    except OSError:
        return ""  # said where it is read
    if st.st_mode & 0o077:
        return (f"{path} has mode {stat.S_IMODE(st.st_mode):04o}: anyone but its owner could read or change the key; "
                "chmod 600 it")
    return ""


def _resolve_key(r: Readiness, env: dict[str, str]) -> tuple[str, str, str]:
    """(key, problem, field) for one readiness table; the key itself never goes into a problem."""
    if r.api_key_file:
        raw, why = _read(Path(r.api_key_file), MAX_KEY_BYTES)
        if why:
            return "", (f"cannot read {r.api_key_file}: {why}: it must be a file holding the API key, readable "
                        "by the supervisor (root)"), "api_key_file"
        if open_to := _key_file_open(r.api_key_file):
            return "", open_to, "api_key_file"
        try:
            key = raw.decode("utf-8").strip()
        except UnicodeDecodeError:
            return "", f"{r.api_key_file} is not UTF-8 text: put the API key in it as one line", "api_key_file"
        where, fld = r.api_key_file, "api_key_file"
    elif r.api_key_env:
        key, where, fld = env.get(r.api_key_env, "").strip(), f"environment variable {r.api_key_env}", "api_key_env"
        if r.api_key_env not in env:
            return "", (f"environment variable {r.api_key_env} is not set for the supervisor (for the unit: "
                        "Environment= or EnvironmentFile= in a drop-in)"), fld
    else:
        return "", "", ""
    if not key:
        return "", f"{where} is empty: put the API key in it", fld
    if not re.fullmatch(r"[\x21-\x7e]+", key):
        return "", (f"the key in {where} must be one line of printable ASCII without spaces (it is sent in an "
                    "HTTP header)"), fld
    return key, "", fld


def _source(path: str | Path) -> str:
    """The file as named in problems: quoted when its name would break the one-line format."""
    s = str(path)
    return _q(s) if _control(s) else s


def _env_tables(data: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(key, table) of every env table in the file as written."""
    out: list[tuple[str, dict[str, Any]]] = []

    def add(key: str, t: object) -> None:
        if isinstance(t, dict):
            out.append((key, t))
    for i, n in enumerate(data.get("nodes") or []):
        if isinstance(n, dict):
            add(f"nodes[{i}].env", n.get("env"))
    for d, dep in enumerate(data.get("deployments") or []):
        if isinstance(dep, dict):
            for table, name in (("ray", "env"), ("ray", "head_env"), ("serve", "env")):
                if isinstance(dep.get(table), dict):
                    add(f"deployments[{d}].{table}.{name}", dep[table].get(name))
    return out


def _warnings(raw: dict[str, Any], cfg: Config) -> list[str]:
    """What the config may well mean but should not be: reported by `check`, accepted."""
    out = []
    for key, table in _env_tables(raw):
        for name, value in table.items():
            k = _join(key, str(name))
            secret = secret_env(str(name)) and "TOKENIZER" not in str(name).upper()
            if secret and isinstance(value, str) and value and "${" not in value:
                out.append(f"{k}: a secret written in the config file (readable by whoever reads the config, "
                           f"kept in backups): put it in the unit's EnvironmentFile= (mode 600) and write "
                           f"\"${{{name}}}\" here")
            elif str(name).upper() in _SEARCH_PATH_ENV:
                out.append(f"{k}: {name} changes where every process in the container loads code from: "
                           "prefer building it into the image")
    for d, dep in enumerate(cfg.deployments):
        if dep.readiness.api_key_file and (why := _key_file_owner(dep.readiness.api_key_file)):
            out.append(f"deployments[{d}].readiness.api_key_file: {dep.readiness.api_key_file} {why}")
        for i, a in enumerate(dep.serve.extra_args):
            flag = a.split("=", 1)[0].replace("_", "-")
            if flag.startswith("--") and len(flag) >= 5 and "--hf-token".startswith(flag):
                out.append(f"deployments[{d}].serve.extra_args[{i}]: a token on the command line is seen by every "
                           "user in `ps`: set HF_TOKEN through the unit's EnvironmentFile= and serve.env instead")
            elif flag == "--trust-remote-code":
                out.append(f"deployments[{d}].serve.extra_args[{i}]: --trust-remote-code runs the model "
                           "repository's own Python in the serve, with the container's rights: only for a model you "
                           "trust, its revision pinned (serve.revision)")
    hook = urlsplit(cfg.alerts.webhook) if cfg.alerts.webhook else None
    if hook is not None and (hook.username or hook.password) and "${" not in str(raw.get("alerts", {}).get("webhook")):
        out.append("alerts.webhook: a user and password in the URL, written in the config file (readable by "
                   "whoever reads the config, kept in backups): put the URL in the unit's EnvironmentFile= "
                   "(mode 600) and write \"${WEBHOOK_URL}\" here")
    return out


def _parse(data: object, source: str, env: dict[str, str]) -> Config:
    if not isinstance(data, dict):
        raise ConfigError([f"{source}: (top level): expected a table of keys, got {type(data).__name__}"])
    if not data:
        raise ConfigError([f"{source}: (top level): the config is empty: it needs at least [[nodes]] and "
                           "[[deployments]] (see etc/spark-supervisor.toml)"])
    problems: list[str] = []
    raw = data
    data = _expand(data, "", problems, env)
    _controls(data, "", problems)  # as written, or brought in by an environment variable
    if problems:
        raise ConfigError([f"{source}: {p}" for p in problems])
    try:
        cfg = Config.model_validate(data)
    except ValidationError as e:
        raise ConfigError([f"{source}: {p}" for p in _format(e)]) from None
    for d, dep in enumerate(cfg.deployments):
        key, why, fld = _resolve_key(dep.readiness, env)
        if why:
            problems.append(f"{source}: deployments[{d}].readiness.{fld}: {why}")
        dep.readiness._api_key = SecretStr(key)
    if problems:
        raise ConfigError(problems)
    cfg._warnings = tuple(f"{source}: {w}" for w in _warnings(raw, cfg))
    return cfg


def parse(data: dict[str, Any], source: str, env: dict[str, str] | None = None) -> Config:
    """Validate a config already read; raises ConfigError only."""
    try:
        source = _source(source)
        return _parse(data, source, dict(os.environ) if env is None else env)
    except ConfigError:
        raise
    except RecursionError:
        raise ConfigError([f"{source}: (top level): nested too deeply to be a config"]) from None
    except Exception as e:  # a bug here must still read as a config problem, never as a traceback
        raise ConfigError([f"{source}: (top level): cannot check this config ({type(e).__name__}); "
                           "please report it"]) from None


def load(path: str | Path, env: dict[str, str] | None = None) -> Config:
    """Read and validate a config file; raises ConfigError only, whatever the file is."""
    src = _source(path)
    try:
        p = Path(path)
        raw, why = _read(p, MAX_CONFIG_BYTES)
        if why:
            raise ConfigError([f"{src}: cannot read: {why}"])
        try:
            text = raw.decode("utf-8").removeprefix("\ufeff")
        except UnicodeDecodeError as e:
            raise ConfigError([f"{src}: not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start}): is this "
                               "the config file? save it as UTF-8"]) from None
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ConfigError([f"{src}: not valid TOML: {e}"]) from None
        return parse(data, src, env)
    except ConfigError:
        raise
    except RecursionError:
        raise ConfigError([f"{src}: not valid TOML: nested too deeply"]) from None
    except Exception as e:
        raise ConfigError([f"{src}: cannot load ({type(e).__name__}); please report it"]) from None

