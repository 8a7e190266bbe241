"""``lmcache-valkey``: demo, tierd, doctor, stats, evict, drain, bench, endpoint.

Exit codes: 0 success, 1 the operation or a check failed, 2 bad usage, settings or a missing
extra, 3 (``tierd``) stopped with chunks its drain could not flush. Every error is one line on
stderr (and, with ``--json``, one JSON object on stdout). Connection flags are shared;
``--config`` reads the plugin's keys out of an LMCache YAML file so the doctor checks exactly
what the workers will use.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any, Callable, Sequence

from . import __version__
from .config import Settings, parse_size
from .errors import ConfigError, LmcacheValkeyError, MissingExtra
from .extras import missing_extra
from .tiering.settings import TieringSettings
from .tiering.tierd import EXIT_UNFLUSHED  # tierd: stopped with chunks its drain could not flush

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
DRAIN_PROGRESS_S = 2.0  # how often `drain` reports the backlog while it waits
DRAIN_PROBE_S = 10.0  # a tierd that serves requests answers `stats` in milliseconds

EXIT_CODES_HELP = (
    f"exit codes: {EXIT_OK} ok, {EXIT_FAIL} a check or operation failed, {EXIT_USAGE} bad usage, settings or a "
    f"missing extra; tierd also {EXIT_UNFLUSHED}: stopped with chunks its drain could not flush to S3"
)


def _add_connection_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("connection")
    g.add_argument("--config", help="an LMCache YAML file; the plugin's keys are read from its extra_config")
    g.add_argument("--plugin", default="valkey", help="plugin name in that file (default: valkey)")
    g.add_argument("--url", help="valkey://host:port, valkeys://host:port (TLS) or unix:///path")
    g.add_argument("--username")
    g.add_argument("--password-file")
    g.add_argument("--tls-ca-file")
    g.add_argument("--tenant")
    g.add_argument("--transport", choices=("auto", "tcp", "fabric", "rdma", "blob-tcp"))


def plugin_keys_from_yaml(path: str, plugin: str) -> dict[str, Any]:
    """The ``remote_storage_plugin.<plugin>.*`` keys of an LMCache YAML file, prefix removed.
    A missing, unreadable or malformed file is a ConfigError naming ``--config``."""
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ConfigError("--config", "a readable LMCache YAML file", f"{path}: {e.strerror or e}") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise ConfigError("--config", "valid YAML", f"{path}{where}: {getattr(e, 'problem', None) or e}") from None
    if not isinstance(doc, dict):
        raise ConfigError("--config", "an LMCache YAML mapping (chunk_size:, extra_config:, ...)", path)
    from .settings import plugin_keys, plugin_prefix

    extra = doc.get("extra_config") or {}
    if not isinstance(extra, dict):
        raise ConfigError("--config", "extra_config to be a mapping", f"{path}: {type(extra).__name__}")
    raw = plugin_keys(extra, plugin)
    if not raw:
        raise ConfigError("--config", f"an LMCache YAML with {plugin_prefix(plugin)}* keys in extra_config", path)
    raw.pop("module_path", None)
    raw.pop("class_name", None)
    return raw


def settings_and_tiering_from_args(args: argparse.Namespace) -> tuple[Settings, TieringSettings]:
    """What the workers would run with: the ``--config`` file's keys (validated and named as
    written there), then the connection flags on top."""
    from .settings import load_settings, plugin_prefix

    raw: dict[str, Any] = {}
    if args.config:
        raw = plugin_keys_from_yaml(args.config, args.plugin)
        load_settings(raw, key_prefix=plugin_prefix(args.plugin))
    for flag in ("url", "username", "password_file", "tls_ca_file", "tenant", "transport"):
        value = getattr(args, flag, None)
        if value is not None:
            raw[flag] = value
    return load_settings(raw)


def settings_from_args(args: argparse.Namespace) -> Settings:
    return settings_and_tiering_from_args(args)[0]


def _cmd_doctor(args: argparse.Namespace) -> int:
    from .doctor import run_doctor

    settings, tiering = settings_and_tiering_from_args(args)
    return run_doctor(
        settings,
        tiering=tiering,
        as_json=args.json,
        s3_bucket=args.s3_bucket,
        s3_endpoint_url=args.s3_endpoint_url,
        s3_prefix=args.s3_prefix or "",
    )


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(args)


def _cmd_tierd(args: argparse.Namespace) -> int:
    from .tiering.tierd import run_tierd

    return asyncio.run(run_tierd(args)) or EXIT_OK


def _no_tierd(args: argparse.Namespace, waited_s: float) -> LmcacheValkeyError:
    return LmcacheValkeyError(
        f"no tierd answered for tenant {args.tenant!r} on {args.valkey_url} within {waited_s:g}s: "
        f"is `lmcache-valkey tierd --valkey-url {args.valkey_url} --tenant {args.tenant}` running "
        "(the chart's tierd sidecar)?")


def _tierd_call(args: argparse.Namespace, command: Callable[[argparse.Namespace], Any]) -> Any:
    """Run a control command against tierd; no answer within ``--timeout`` is one clear error."""
    try:
        return asyncio.run(command(args))
    except LmcacheValkeyError:
        raise  # Valkey unreachable, refused, no tierd (above), ...: already says what
    except (TimeoutError, asyncio.TimeoutError):
        raise _no_tierd(args, args.timeout) from None
    except RuntimeError as e:  # tierd answered with an error
        raise LmcacheValkeyError(str(e)) from None


def _cmd_stats(args: argparse.Namespace) -> int:
    from .report import render_stats
    from .tiering.tierd import tier_stats_command

    stats = _tierd_call(args, tier_stats_command)
    print(json.dumps(stats, indent=2, default=str) if args.json else render_stats(stats))
    return EXIT_OK


def _cmd_evict(args: argparse.Namespace) -> int:
    from .tiering.tierd import evict_command

    n = _tierd_call(args, evict_command)
    print(json.dumps({"evicted": n}) if args.json else f"evicted {n} chunk(s) from {args.tier}")
    return EXIT_OK


async def _drain_with_progress(args: argparse.Namespace, say: Callable[[str], None]) -> Any:
    """Ask tierd to drain; while it works, report its S3 backlog every DRAIN_PROGRESS_S."""
    from .report import describe_backlog
    from .tiering.tierd import drain, tier_stats, with_remote

    async def body(tc: Any) -> Any:
        started = time.monotonic()
        probe_s = min(args.timeout, DRAIN_PROBE_S)
        try:  # is a tierd there at all? (a drain request alone would wait its whole timeout)
            stats = await tier_stats(tc, timeout=probe_s)
        except (TimeoutError, asyncio.TimeoutError):
            raise _no_tierd(args, probe_s) from None
        say(f"drain: {describe_backlog(stats)}; waiting up to {args.timeout:g}s")
        waiting = asyncio.ensure_future(drain(tc, timeout=args.timeout))
        try:
            while True:
                done, _ = await asyncio.wait({waiting}, timeout=DRAIN_PROGRESS_S)
                if done:
                    return waiting.result()
                try:
                    stats = await tier_stats(tc, timeout=min(5.0, DRAIN_PROGRESS_S * 2))
                except (TimeoutError, asyncio.TimeoutError, RuntimeError, LmcacheValkeyError):
                    stats = None
                spent = time.monotonic() - started
                say(f"drain: {describe_backlog(stats)}; waited {spent:.0f}s of {args.timeout:g}s")
        finally:
            if not waiting.done():
                waiting.cancel()
                await asyncio.gather(waiting, return_exceptions=True)

    return await with_remote(args, body)


def _cmd_drain(args: argparse.Namespace) -> int:
    say = (lambda m: None) if args.json else (lambda m: print(m, file=sys.stderr, flush=True))
    report = _tierd_call(args, lambda a: _drain_with_progress(a, say))
    if args.json:
        print(json.dumps({"drained": report.drained, "backlog": report.backlog, "dropped": report.dropped,
                          "tiers": report.tiers}))
    else:
        print(report.describe(args.timeout))
    return EXIT_OK if report.drained else EXIT_FAIL


def _cmd_bench(args: argparse.Namespace) -> int:
    from .quickbench import run_quickbench

    args.chunk_bytes = parse_size("--chunk-bytes", args.chunk_bytes)
    return run_quickbench(settings_from_args(args), args)


def _cmd_endpoint_build(args: argparse.Namespace) -> int:
    from .endpoint_build import build_endpoint

    path = build_endpoint(args.out, say=(lambda m: None) if args.json else (lambda m: print(m, file=sys.stderr)))
    print(json.dumps({"module": str(path)}) if args.json else path)
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lmcache-valkey", description="A shared, tiered KV-cache store for LMCache on Valkey.",
                                     epilog=EXIT_CODES_HELP)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    from .demo import add_demo_arguments  # both import only the standard library and this package
    from .tiering import tierd as tierd_cli

    demo = sub.add_parser("demo", help="two workers share a prefix's KV cache through an embedded Valkey")
    add_demo_arguments(demo)
    demo.set_defaults(func=_cmd_demo)

    doctor = sub.add_parser("doctor", help="check connectivity, auth/ACL, TLS, server, modules, fabric, tiers and S3",
                            epilog=EXIT_CODES_HELP)
    _add_connection_arguments(doctor)
    doctor.add_argument("--s3-bucket", help="check this bucket (default: s3_bucket of --config)")
    doctor.add_argument("--s3-endpoint-url")
    doctor.add_argument("--s3-prefix")
    doctor.add_argument("--json", action="store_true", help="machine-readable output")
    doctor.set_defaults(func=_cmd_doctor)

    tierd = sub.add_parser("tierd", help="run the tiering manager next to Valkey (NVMe and S3 tiers)",
                           epilog=EXIT_CODES_HELP)
    tierd_cli.add_tierd_arguments(tierd)
    tierd.set_defaults(func=_cmd_tierd)

    for name, helptext, func in (
        ("stats", "per-tier statistics from tierd", _cmd_stats),
        ("evict", "evict a namespace or keys from one tier", _cmd_evict),
        ("drain", "wait until tierd's write-behind backlog is flushed (reports progress)", _cmd_drain),
    ):
        p = sub.add_parser(name, help=helptext)
        getattr(tierd_cli, f"add_{name}_arguments")(p)  # adds --url/--tenant/--json too
        p.set_defaults(func=func)

    bench = sub.add_parser("bench", help="quick put/get throughput against a server")
    _add_connection_arguments(bench)
    bench.add_argument("--chunk-bytes", default="4MiB", help="chunk size, e.g. 4MiB or 4194304 (default 4MiB)")
    bench.add_argument("--chunks", type=int, default=64)
    bench.add_argument("--rounds", type=int, default=3)
    bench.add_argument("--json", action="store_true")
    bench.set_defaults(func=_cmd_bench)

    endpoint = sub.add_parser("endpoint", help="the reference Valkey module (RMA fast path)")
    esub = endpoint.add_subparsers(dest="endpoint_command", required=True)
    build = esub.add_parser("build", help="compile the module from the sources shipped in this package "
                                          "(needs a C compiler and libfabric headers)")
    build.add_argument("--out", default=".", help="directory to write lmcv_blob.so into (default: .)")
    build.add_argument("--json", action="store_true")
    build.set_defaults(func=_cmd_endpoint_build)
    return parser


def _report_error(args: argparse.Namespace, message: str, code: int) -> int:
    command = " ".join(c for c in (args.command, getattr(args, "endpoint_command", None)) if c)
    print(f"lmcache-valkey {command}: {message}", file=sys.stderr)
    if getattr(args, "json", False):
        print(json.dumps({"ok": False, "error": message, "exit_code": code}))
    return code


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ConfigError, MissingExtra) as e:
        return _report_error(args, str(e), EXIT_USAGE)
    except LmcacheValkeyError as e:
        return _report_error(args, str(e), EXIT_FAIL)
    except ModuleNotFoundError as e:
        extra = missing_extra(e, f"`lmcache-valkey {args.command}`")
        if extra is None:
            raise
        return _report_error(args, str(extra), EXIT_USAGE)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
