"""Write man/spark-supervisor.1 from spark-supervisor's own argument parser (argparse-manpage), so the
page says what `--help` says. `make man` runs it; `--check` only says whether the committed page is
current (tests/unit/test_cli.py runs that, so the page cannot drift from the parser)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

PAGE = Path(__file__).resolve().parent / "spark-supervisor.1"


def roff(text: str) -> str:
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\\&" + text if text[:1] in (".", "'") else text


def render() -> str:
    from argparse_manpage.manpage import Manpage

    from spark_supervisor import cli, version
    p = cli.parser()
    p.epilog = None  # --help's epilog, here as proper sections from the same data
    page = Manpage(p)
    page.source = f"spark-supervisor {version()}"
    page.manual = "spark-supervisor manual"
    page.description = "keep multi-node vLLM deployments serving"
    page.add_section("environment", "=", "\n".join(f".TP\n.B {roff(name)}\n{roff(text)}"
                                                  for name, text in cli.ENVIRONMENT))
    page.add_section("exit status", "=", "\n".join(
        [roff(cli.EXIT_NOTE)] + [f".TP\n.B {code}\n{roff(text)}" for code, text in cli.STATUS_CODES]
        + [".PP", roff(cli.STATUS_NOTE)]))
    page.add_section("files", "=", "\n".join([
        f".TP\n.I {roff(cli.SYSTEM_CONFIG)}\nthe config (TOML); `spark\\-supervisor schema` prints its JSON Schema",
        ".TP\n.I /var/lib/spark\\-supervisor\nthe state directory (supervisor.state_dir): status.json, the lock, "
        "the control socket, the repair log; each deployment's under deployments/<name>/ (its records: records.jsonl, "
        "record\\-bad.json); the support bundles of `spark\\-supervisor report` under reports/"]))
    page.add_section("see also", "=", "systemctl(1), journalctl(1), systemd.service(5)")
    return str(page)


def same(a: str, b: str) -> bool:
    """Equal but for the .TH line's date (the day it was generated)."""
    def body(text: str) -> list[str]:
        lines = text.splitlines()
        if lines and lines[0].startswith(".TH "):
            parts = lines[0].split('"')
            lines[0] = '"'.join(parts[:3] + parts[4:]) if len(parts) > 4 else lines[0]
        return lines
    return body(a) == body(b)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--check", action="store_true", help="exit 1 when the committed page is not current")
    args = ap.parse_args()
    new = render()
    old = PAGE.read_text() if PAGE.exists() else ""
    if same(old, new):
        return 0
    if args.check:
        print(f"{PAGE} is out of date: run `make man` and commit it", file=sys.stderr)
        return 1
    PAGE.write_text(new)
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
