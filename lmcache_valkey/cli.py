"""``lmcache-valkey``: demo, tierd, doctor, stats, evict, drain, bench.

Exit codes: 0 success, 1 the operation or a check failed, 2 bad usage or settings.
Connection flags are shared; ``--config`` reads the plugin's keys out of an
LMCache YAML file so the doctor checks exactly what the workers will use.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any, Sequence

from . import __version__
from .config import Settings, settings_from_mapping
from .errors import ConfigError, LmcacheValkeyError

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


def _add_connection_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("connection")
    g.add_argument("--config", help="an LMCache YAML file; the plugin's keys are read from its extra_config")
    g.add_argument("--plugin", default="valkey", help="plugin name in that file (default: valkey)")
    g.add_argument("--url", help="valkey://host:port, valkeys://host:port (TLS) or unix:///path")
    g.add_argument("--username")
    g.add_argument("--password-file")
    g.add_argument("--tls-ca-file")
    g.add_argument("--tenant")
    g.add_argument("--transport", choices=("auto", "tcp", "fabric"))


def settings_from_args(args: argparse.Namespace) -> Settings:
    raw: dict[str, Any] = {}
    if args.config:
        import yaml

        with open(args.config, encoding="utf-8") as f:
            doc = yaml.safe_load(f) or {}
        extra = doc.get("extra_config") or {}
        prefix = f"remote_storage_plugin.{args.plugin}."
        raw = {k[len(prefix):]: v for k, v in extra.items() if k.startswith(prefix)}
        if not raw:
            raise ConfigError("--config", f"an LMCache YAML with {prefix}* keys in extra_config", args.config)
        from .tiering.settings import split_tiering_keys, tiering_settings_from_mapping

        tier_raw, raw = split_tiering_keys(raw)
        tiering_settings_from_mapping(tier_raw, key_prefix=prefix)  # validated, as the workers will
        try:
            settings_from_mapping({k: v for k, v in raw.items() if k not in ("module_path", "class_name")})
        except ConfigError as e:  # name the key as written in the YAML
            raise ConfigError(prefix + e.key, e.expected, e.got) from None
    for flag, key in (("url", "url"), ("username", "username"), ("password_file", "password_file"),
                      ("tls_ca_file", "tls_ca_file"), ("tenant", "tenant"), ("transport", "transport")):
        value = getattr(args, flag, None)
        if value is not None:
            raw[key] = value
    raw.pop("module_path", None)
    raw.pop("class_name", None)
    return settings_from_mapping(raw)


def _cmd_doctor(args: argparse.Namespace) -> int:
    from .doctor import run_doctor

    return run_doctor(
        settings_from_args(args),
        as_json=args.json,
        s3_bucket=args.s3_bucket,
        s3_endpoint_url=args.s3_endpoint_url,
        s3_prefix=args.s3_prefix or "",
    )


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(args)


def _cmd_tierd(args: argparse.Namespace) -> int:
    from .tiering.service import run_tierd

    return asyncio.run(run_tierd(args)) or EXIT_OK


def _cmd_stats(args: argparse.Namespace) -> int:
    from .tiering.service import tier_stats_command

    stats = asyncio.run(tier_stats_command(args))
    if args.json:
        print(json.dumps(stats, indent=2, default=str))
    else:
        for tier, values in stats.items():
            shown = ", ".join(f"{k}={v}" for k, v in values.items()) if isinstance(values, dict) else values
            print(f"{tier:<6} {shown}")
    return EXIT_OK


def _cmd_evict(args: argparse.Namespace) -> int:
    from .tiering.service import evict_command

    n = asyncio.run(evict_command(args))
    print(json.dumps({"evicted": n}) if args.json else f"evicted {n} chunk(s) from {args.tier}")
    return EXIT_OK


def _cmd_drain(args: argparse.Namespace) -> int:
    from .tiering.service import drain_command

    drained = asyncio.run(drain_command(args))
    print(json.dumps({"drained": drained}) if args.json else ("flush backlog drained" if drained else "flush backlog NOT drained in time"))
    return EXIT_OK if drained else EXIT_FAIL


def _cmd_bench(args: argparse.Namespace) -> int:
    from .quickbench import run_quickbench

    return run_quickbench(settings_from_args(args), args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lmcache-valkey", description="A shared, tiered KV-cache store for LMCache on Valkey.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    from .demo import add_demo_arguments  # both import only the standard library and this package
    from .tiering import service

    demo = sub.add_parser("demo", help="two workers share a prefix's KV cache through an embedded Valkey")
    add_demo_arguments(demo)
    demo.set_defaults(func=_cmd_demo)

    doctor = sub.add_parser("doctor", help="check connectivity, auth/ACL, TLS, server, modules, fabric and S3")
    _add_connection_arguments(doctor)
    doctor.add_argument("--s3-bucket")
    doctor.add_argument("--s3-endpoint-url")
    doctor.add_argument("--s3-prefix")
    doctor.add_argument("--json", action="store_true", help="machine-readable output")
    doctor.set_defaults(func=_cmd_doctor)

    tierd = sub.add_parser("tierd", help="run the tiering manager next to Valkey (NVMe and S3 tiers)")
    service.add_tierd_arguments(tierd)
    tierd.set_defaults(func=_cmd_tierd)

    for name, helptext, func in (
        ("stats", "per-tier statistics", _cmd_stats),
        ("evict", "evict a namespace or keys from one tier", _cmd_evict),
        ("drain", "wait until tierd's write-behind backlog is flushed", _cmd_drain),
    ):
        p = sub.add_parser(name, help=helptext)
        getattr(service, f"add_{name}_arguments")(p)  # adds --url/--tenant/--json too
        p.set_defaults(func=func)

    bench = sub.add_parser("bench", help="quick put/get throughput against a server")
    _add_connection_arguments(bench)
    bench.add_argument("--chunk-bytes", type=int, default=4 << 20)
    bench.add_argument("--chunks", type=int, default=64)
    bench.add_argument("--rounds", type=int, default=3)
    bench.add_argument("--json", action="store_true")
    bench.set_defaults(func=_cmd_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ConfigError as e:
        print(f"lmcache-valkey {args.command}: {e}", file=sys.stderr)
        return EXIT_USAGE
    except LmcacheValkeyError as e:
        print(f"lmcache-valkey {args.command}: {e}", file=sys.stderr)
        return EXIT_FAIL
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
