"""Secrets never leave the daemon in what it logs or shows: a URL's credentials, a secret flag's value in an
argv, a secret environment variable's value, a known secret (the API key) wherever it appears."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from urllib.parse import urlsplit, urlunsplit

MARK = "[redacted]"

# Options whose value is a secret, by vLLM's and the hub's names without their leading dashes (matched the
# way argparse matches: a prefix of at least the distinguishing part, `_` for `-`). Recognised here only to
# be redacted: the daemon itself never puts a secret on a command line (the key goes in VLLM_API_KEY).
SECRET_OPTIONS = ("api-key", "hf-token")
# Environment variable names whose value is a secret.
_SECRET_ENV = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|APIKEY|CREDENTIAL|PRIVATE_KEY|(^|_)KEY$"
                         r"|(^|_)PASS(PHRASE|WD)?(_|$))", re.I)
# user:password@ in any scheme (ssh://root@spark-2 names a user, not a secret); any userinfo in http(s).
_URL_CREDENTIALS = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]*://)[^\s/@:]*:[^\s/@]*@|\b(https?://)[^\s/@]+@")


def secret_env(name: str) -> bool:
    # TOKENIZERS_PARALLELISM and the like name a tokenizer, not a token.
    return bool(_SECRET_ENV.search(re.sub(r"TOKENIZERS?", "", name, flags=re.I)))


def url(u: str) -> str:
    """The URL with any user:password@ replaced (the rest kept: callers that may show a path holding a token
    use ``url_origin``)."""
    try:
        parts = urlsplit(u)
    except ValueError:
        return MARK
    if "@" not in parts.netloc:
        return u
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit((parts.scheme, f"{MARK}@{host}", parts.path, parts.query, parts.fragment))


def url_origin(u: str) -> str:
    """Scheme and host[:port] only, never credentials, path or query (a webhook's path may be a token)."""
    try:
        parts = urlsplit(u)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return MARK
    if ":" in host:
        host = f"[{host}]"
    return f"{parts.scheme}://{host}{port}"


def _secret_flag(arg: str) -> bool:
    flag = arg.split("=", 1)[0].replace("_", "-")
    if not flag.startswith("--"):
        return False
    # argparse takes any unambiguous prefix: `--api-ke` is `--api-key`. Three letters past `--` is where
    # vLLM's own flags stop being ambiguous; anything shorter is refused by its parser anyway.
    name = flag[2:]
    return len(name) > 2 and any(s.startswith(name) for s in SECRET_OPTIONS)


def argv(args: Sequence[str], secrets: Iterable[str] = ()) -> list[str]:
    """An argv fit for a log line: the value of a secret flag (`--api-key K`, `--api-key=K`, by any prefix)
    and of a secret `NAME=value` replaced, and every known secret replaced wherever it appears."""
    out: list[str] = []
    hide_next = False
    for a in args:
        if hide_next:
            out.append(MARK)
            hide_next = False
            continue
        if a.startswith("--") and _secret_flag(a):
            if "=" in a:
                out.append(f"{a.split('=', 1)[0]}={MARK}")
            else:
                out.append(a)
                hide_next = True
            continue
        m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)", a, re.S)
        if m and secret_env(m.group(1)) and m.group(2):
            out.append(f"{m.group(1)}={MARK}")
            continue
        out.append(text(a, secrets))
    return out


def flag_values(args: Sequence[str]) -> list[str]:
    """The values given to secret flags in an argv (`--hf-token T`, `--api-key=K`): secrets to redact
    wherever they turn up (vLLM echoes its arguments)."""
    out = []
    for a, nxt in zip(args, [*args[1:], ""], strict=False):
        if a.startswith("--") and _secret_flag(a):
            value = a.split("=", 1)[1] if "=" in a else nxt
            if value:
                out.append(value)
    return out


def env(values: dict[str, str], secrets: Iterable[str] = ()) -> dict[str, str]:
    """An environment fit for a log line: secret names' values replaced, known secrets replaced."""
    return {k: MARK if secret_env(k) and v else text(v, secrets) for k, v in values.items()}


def text(s: str, secrets: Iterable[str] = ()) -> str:
    """``s`` with every known secret replaced (see ``scrub`` for text that may quote a URL)."""
    for secret in secrets:
        if secret and len(secret) >= 4:
            s = s.replace(secret, MARK)
    return s


def scrub(s: str, secrets: Iterable[str] = ()) -> str:
    """The one redactor of text from anywhere (the daemon's log, `logs`, the support bundle): a URL's credentials,
    whatever URL it is, and every known secret (``known``: the config's and the environment's)."""
    if "://" in s and "@" in s:
        s = _URL_CREDENTIALS.sub(lambda m: f"{m.group(1) or m.group(2)}{MARK}@", s)
    return text(s, secrets)


def url_secrets(u: str) -> list[str]:
    """What of a URL (a webhook's) must not appear anywhere, in whatever form a text may quote it: the URL, its
    credentials, its path and every path segment that looks like a token (Slack's /services/T…/B…/…, Discord's
    /api/webhooks/<id>/<token>: a segment of 8 characters or more holding a digit, or of 16 or more)."""
    try:
        parts = urlsplit(u)
        userinfo = parts.netloc.rpartition("@")[0]
        password = parts.password or ""
    except ValueError:
        parts, userinfo, password = None, u.partition("://")[2].rpartition("@")[0], ""
    path = (f"{parts.path}?{parts.query}" if parts.query else parts.path) if parts else ""
    segments = [x for x in re.split(r"[/?&=]", path) if len(x) >= 16 or (len(x) >= 8 and re.search(r"\d", x))]
    found = [u, u.partition("://")[2], userinfo, *userinfo.split(":"), password, path, *segments]
    return sorted({s for s in found if len(s) >= 4}, key=len, reverse=True)

