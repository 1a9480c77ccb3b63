"""What the `lineage` commands share: flags, their reading, usage errors, formatters.

The engine's settings become options here, generated from their one declaration
(engine.config.declare): `add_serve_arguments` adds every `lineage serve` flag (the
benchmarks that run an engine add them too), `add_settings` a chosen few, and
`config_from_args` builds the EngineConfig of the flags given plus the
environment. A setting's value is parsed as the option is read, so a bad one is
refused at once, naming its flag and its variable. Beside them: the client
commands' connection and sampling flags, JSON-file readers and `format_stats`.
It imports no command, no MLX and no Ray.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Iterable, Mapping

from clients.client import DEFAULT_MAX_TOKENS, DEFAULT_SERVER
from engine.config import EngineConfig, format_bytes
from engine.config.catalog import SETTINGS, branches
from engine.config.declare import Setting, settings_of

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """Bad input found after parsing (an unreadable file, a bad setting, ...): exit 2."""


class CommandError(Exception):
    """A command that cannot go on, said in one line, with its exit status."""

    def __init__(self, message: str, status: int = EXIT_ERROR):
        super().__init__(message)
        self.status = status


# ------------------------------------------------------------- settings ----


class _SettingAction(argparse.Action):
    """Store a setting's value parsed and checked; a refusal names its flag and variable."""

    def __init__(self, option_strings, dest, setting: Setting, **kwargs):
        super().__init__(option_strings, dest, **kwargs)
        self.setting = setting

    def __call__(self, parser, namespace, values, option_string=None):
        try:
            if self.setting.repeat:  # each time the flag is given, one more value
                given = getattr(namespace, self.dest) or ()
                setattr(namespace, self.dest, given + self.setting.parse_value((values,)))
            else:
                setattr(namespace, self.dest, self.setting.parse_value(values))
        except ValueError as error:
            parser.error(str(error))


def add_settings(parser: argparse.ArgumentParser, settings: Iterable[Setting]) -> None:
    """An option per setting that has a flag; every default None (only flags given count)."""
    for s in settings:
        if s.flag is None:
            continue
        again = "; repeatable" if s.repeat else ""
        help = f"{s.help} (default: {s.default_text()}; ${s.var}{again})".replace("%", "%%")
        if s.switch:
            parser.add_argument(s.flag, dest=s.name, action="store_true", default=None, help=help)
        else:
            parser.add_argument(
                s.flag, dest=s.name, action=_SettingAction, setting=s, metavar=s.metavar, help=help
            )


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """Every `lineage serve` setting, in groups named after the configuration's branches."""
    for cls in branches():
        group = parser.add_argument_group(cls.__doc__.strip().splitlines()[0].rstrip(".").lower())
        add_settings(group, settings_of(cls))


def config_from_args(
    args: argparse.Namespace, env: Mapping[str, str], names: Iterable[str] | None = None
) -> EngineConfig:
    """The EngineConfig of the setting flags given (those of `names`, default all) plus
    `env`. ValueError naming the flag and variable of a value that does not parse."""
    wanted = set(names) if names is not None else {s.name for s in SETTINGS}
    flags = {s.name: getattr(args, s.name, None) for s in SETTINGS if s.name in wanted}
    return EngineConfig.from_sources(flags, env)


# ----------------------------------------------------- client commands ----


def add_server_arguments(p: argparse.ArgumentParser) -> None:
    """--server and how to reach it (a client command)."""
    p.add_argument(
        "--server",
        metavar="HOST:PORT",
        help=f"engine address (default: $LINEAGE_SERVER or {DEFAULT_SERVER})",
    )
    p.add_argument(
        "--auth-token", metavar="TOKEN", help="bearer token (default: $LINEAGE_AUTH_TOKEN)"
    )
    p.add_argument(
        "--tls-ca", metavar="PEM", help="CA to verify the server by (default: $LINEAGE_TLS_CA)"
    )
    p.add_argument(
        "--tls-client-cert",
        metavar="PEM",
        help="client certificate for mTLS ($LINEAGE_TLS_CLIENT_CERT)",
    )
    p.add_argument(
        "--tls-client-key", metavar="PEM", help="its private key ($LINEAGE_TLS_CLIENT_KEY)"
    )


def connect_from_args(args: argparse.Namespace, env: Mapping[str, str]) -> dict:
    """Keyword arguments of Client/AsyncClient: flags first, then the environment."""
    from clients.channel import Security

    try:
        s = Security.from_env(
            getattr(args, "auth_token", None),
            None,
            getattr(args, "tls_ca", None),
            getattr(args, "tls_client_cert", None),
            getattr(args, "tls_client_key", None),
            env,
        )
    except ValueError as error:
        raise UsageError(str(error))
    return dict(
        auth_token=s.auth_token, tls=s.tls, tls_ca=s.tls_ca, tls_cert=s.tls_cert, tls_key=s.tls_key
    )


def add_sampling_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS)
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    p.add_argument("--top-p", type=float, default=0.0, help="0 or 1: off")
    p.add_argument("--top-k", type=int, default=0, help="0: off")
    p.add_argument("--seed", type=int)
    p.add_argument(
        "--stop", action="append", default=[], metavar="TEXT", help="stop string (repeatable)"
    )
    p.add_argument("--namespace", default="", help="cache namespace")
    p.add_argument(
        "--session",
        default="",
        metavar="KEY",
        help="the conversation's key: with several replicas its turns stay on one",
    )


def sampling_from_args(args: argparse.Namespace) -> dict:
    """The generate() keyword arguments of the sampling flags."""
    return {
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "top_k": args.top_k,
        "seed": args.seed,
        "stop": args.stop,
        "namespace": args.namespace,
        "session": args.session,
    }


def positive_ints(text: str) -> list[int]:
    """An argparse type: a comma-separated list of positive integers ("1,4,8")."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}")
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"need positive integers, got {text!r}")
    return values


def read_json(path: str, what: str):
    """Load a JSON file ("-" reads stdin); UsageError naming the file on failure."""
    try:
        if path == "-":
            return json.load(sys.stdin)
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as error:
        raise UsageError(f"cannot read {what} from {path}: {error}")


def read_json_list(path: str | None, what: str) -> list | None:
    if path is None:
        return None
    value = read_json(path, what)
    if not isinstance(value, list):
        raise UsageError(f"{what} file {path} must hold a JSON list")
    return value


def format_stats(stats: dict) -> str:
    """A CacheStats dict as a two-column table; byte counters human-readable."""
    lines = []
    for key, value in stats.items():
        if key == "replicas":
            continue
        if isinstance(value, dict):
            value = ", ".join(f"{k}={v}" for k, v in sorted(value.items())) or "-"
        elif key.endswith("_bytes"):
            value = f"{format_bytes(value)} ({value})"
        lines.append(f"{key:<16} {value}")
    if stats.get("prompt_tokens"):
        fraction = stats["cached_tokens"] / stats["prompt_tokens"]
        lines.append(f"{'cached_fraction':<16} {fraction:.1%}")
    for r in stats.get("replicas", ()):
        restores = ", ".join(f"{k}={v}" for k, v in sorted(r["restores"].items())) or "-"
        lines.append(
            f"replica {r['replica']:<8} {'alive' if r['alive'] else 'DOWN'}, "
            f"entries={r['entries']} ({format_bytes(r['ram_bytes'])}), "
            f"queued={r['queued_prefill_tokens']} tokens, in_flight={r['in_flight']}, "
            f"served={r['requests']}, restores: {restores}, "
            f"handovers={r['handovers']} ({format_bytes(r['handover_bytes'])})"
        )
    return "\n".join(lines)
