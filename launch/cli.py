"""The operator CLI: `parley token create | token revoke | feature grant | feature revoke |
export | purge | erase | erasure receipt | erasure show | usage | migrate | seed | api |
worker | demo-backend | eval | dev`."""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import re
import sys
import traceback
from collections.abc import Callable
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any, NoReturn

from parley.config import Settings, get_settings
from parley.features import KNOWN as KNOWN_FEATURES
from parley.launch.devstate import with_dev_services
from parley.launch.evaluate import add_parser as add_eval_parser
from parley.launch.seeding import create_token, require_database, revoke_tokens, seed, set_feature
from parley.logs import configure_logging, exit_unfinalized

_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def duration(text: str) -> timedelta:
    """`90s`, `15m`, `12h`, `30d` (a bare number is seconds)."""
    match = re.fullmatch(r"([0-9]+)([smhd]?)", text.strip())
    if match is None or int(match.group(1)) == 0:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (try 30d, 12h, 15m)")
    return timedelta(**{_UNITS[match.group(2) or "s"]: int(match.group(1))})


def day(text: str) -> date:
    """`2026-12-06`."""
    try:
        return date.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a day: {text!r} (try 2026-12-01)") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="parley", description="Parley operator commands")
    commands = parser.add_subparsers(dest="command", required=True)

    token = commands.add_parser("token", help="manage bearer tokens")
    token_commands = token.add_subparsers(dest="token_command", required=True)
    create = token_commands.add_parser("create", help="create a token and print it")
    create.add_argument("--tenant", required=True)
    create.add_argument("--user", required=True)
    create.add_argument(
        "--ttl", type=duration, default=None, help="expire after this long (30d, 12h, 15m)"
    )
    revoke = token_commands.add_parser(
        "revoke", help="revoke a token (or every token of a user); refused from the next request"
    )
    revoke.add_argument("token", nargs="?", help="the token to revoke")
    revoke.add_argument("--tenant")
    revoke.add_argument("--user", help="revoke every token of this user (with --tenant)")

    feature = commands.add_parser("feature", help="grant or revoke a user's feature")
    feature_commands = feature.add_subparsers(dest="feature_command", required=True)
    for verb, what in (("grant", "give the user"), ("revoke", "take from the user")):
        change = feature_commands.add_parser(verb, help=f"{what} a feature (`assistant`)")
        change.add_argument("feature", choices=KNOWN_FEATURES)
        change.add_argument("--tenant", required=True)
        change.add_argument("--user", required=True)

    _data_commands(commands)
    _erasure_commands(commands)
    commands.add_parser("migrate", help="apply database migrations")
    commands.add_parser("seed", help="insert the Northwind demo tenants and users")
    knowledge = commands.add_parser("knowledge", help="manage tenants' knowledge documents")
    knowledge_commands = knowledge.add_subparsers(dest="knowledge_command", required=True)
    load = knowledge_commands.add_parser(
        "load", help="load a folder of <tenant>/<doc>.md files (new versions where changed)"
    )
    load.add_argument("--dir", type=Path, default=None, help="default: the demo library")

    api = commands.add_parser("api", help="serve the session API and web page")
    api.add_argument("--host", default=None)
    api.add_argument("--port", type=int, default=None)

    commands.add_parser("worker", help="run a Temporal worker for turns")

    backend = commands.add_parser("demo-backend", help="serve the Northwind demo backend")
    backend.add_argument("--host", default="127.0.0.1")
    backend.add_argument("--port", type=int, default=None)
    add_eval_parser(commands)
    dev = commands.add_parser("dev", help="start everything locally (make run)")
    dev.add_argument("--workers", type=int, default=1, help="worker processes to run")
    return parser


def _data_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    export = commands.add_parser("export", help="write a user's data archive (zip)")
    export.add_argument("--tenant", required=True)
    export.add_argument("--user", required=True)
    export.add_argument("--out", type=Path, default=None, help="the file (default: stdout)")
    purge = commands.add_parser("purge", help="run the retention purge now")
    purge.add_argument("--tenant", default=None, help="only this tenant")
    purge.add_argument(
        "--now", type=datetime.fromisoformat, default=None, help="purge as of (ISO 8601)"
    )


def _erasure_commands(commands: Any) -> None:
    erase = commands.add_parser(
        "erase", help="erase a user: every row of theirs, their tokens, then the account"
    )
    erase.add_argument("--tenant", required=True)
    erase.add_argument("--user", required=True)
    erase.add_argument(
        "--no-wait", action="store_true", help="print the erasure's id without waiting"
    )
    receipts = commands.add_parser("erasure", help="find erasure receipts")
    receipt_commands = receipts.add_subparsers(dest="erasure_command", required=True)
    receipt = receipt_commands.add_parser(
        "receipt", help="the receipts of a user (or of one of their sessions)"
    )
    receipt.add_argument("--tenant", required=True)
    receipt.add_argument("--user", required=True)
    receipt.add_argument("--session", default=None)
    show = receipt_commands.add_parser("show", help="one receipt by its erasure id")
    show.add_argument("erasure_id")
    usage = commands.add_parser("usage", help="what a tenant's model calls cost in a period")
    usage.add_argument("--tenant", required=True)
    usage.add_argument("--from", dest="start", type=day, required=True, help="YYYY-MM-DD, UTC")
    usage.add_argument("--to", dest="end", type=day, required=True, help="the last day, included")
    usage.add_argument("--by", choices=["user", "model", "day", "session"])
    usage.add_argument("--csv", action="store_true", help="CSV instead of JSON")


def _erasure(settings: Settings, args: argparse.Namespace) -> None:
    """`parley erase` prints the receipt; `parley erasure ...` prints what it finds."""
    from parley.launch import erasure

    found: Any
    if args.command == "erase":
        found = asyncio.run(
            erasure.erase_user(settings, tenant=args.tenant, user=args.user, wait=not args.no_wait)
        )
    elif args.erasure_command == "receipt":
        found = asyncio.run(
            erasure.find_receipts(
                settings, tenant=args.tenant, user=args.user, session=args.session
            )
        )
    else:
        found = asyncio.run(erasure.show_receipt(settings, erasure_id=args.erasure_id))
        if found is None:
            sys.exit(f"no erasure {args.erasure_id!r}")
    print(json.dumps(found, indent=2))


def _usage(settings: Settings, args: argparse.Namespace) -> None:
    from parley.launch.usage import usage_report

    if args.end < args.start:
        sys.exit("--to is before --from")
    report = asyncio.run(
        usage_report(
            settings, tenant=args.tenant, start=args.start, end=args.end, by=args.by, csv=args.csv
        )
    )
    sys.stdout.write(report if args.csv else report + "\n")


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    settings = get_settings()
    if args.command != "dev":
        # Whatever the environment leaves unset comes from a running `parley dev`.
        settings = with_dev_services(settings)
    configure_logging(settings.log_format, settings.log_level)

    if args.command == "token" and args.token_command == "create":
        try:
            print(asyncio.run(create_token(settings, args.tenant, args.user, args.ttl)))
        except LookupError as exc:
            sys.exit(str(exc))
    elif args.command == "token":
        _revoke(settings, args)
    elif args.command == "feature":
        _feature(settings, args)
    elif args.command in ("export", "purge"):
        _exit_skipping_teardown(lambda: _data(settings, args))
    elif args.command in ("erase", "erasure"):
        _exit_skipping_teardown(lambda: _erasure(settings, args))
    elif args.command == "usage":
        _usage(settings, args)
    elif args.command == "migrate":
        from parley.store.migrate import upgrade

        upgrade(require_database(settings))
    elif args.command == "seed":
        asyncio.run(seed(settings))
    elif args.command == "knowledge":
        _load_knowledge(settings, args)
    elif args.command == "api":
        # The API holds a Temporal client too; uvicorn has closed everything when it returns.
        _exit_skipping_teardown(lambda: _serve_api(settings, args))
    elif args.command == "worker":
        from parley.worker import serve

        serve(settings)
    elif args.command == "demo-backend":
        import uvicorn

        from parley.demo_backend.app import create_app as create_backend

        uvicorn.run(
            create_backend(),
            host=args.host,
            port=args.port or settings.northwind_port,
            log_level="warning",
            log_config=None,
        )
    elif args.command == "eval":
        from parley.launch.evaluate import run_eval

        run_eval(settings, args)
    elif args.command == "dev":
        from parley.launch.dev import run_dev

        # Its readiness probes used Temporal clients; run_dev stops everything it started.
        _exit_skipping_teardown(lambda: run_dev(settings, workers=max(1, args.workers)))


def _exit_skipping_teardown(command: Callable[[], None]) -> NoReturn:
    """Run a command whose process used a Temporal client and end the process without the
    interpreter's teardown (`exit_unfinalized`: a process that had done its work could still
    abort there). Exit codes and messages are those of a normal exit."""
    code = 0
    try:
        command()
    except SystemExit as exc:
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
        code = 1 if isinstance(exc.code, str) else (exc.code or 0)
    except KeyboardInterrupt:
        code = 130
    except BaseException:
        traceback.print_exc()
        code = 1
    exit_unfinalized(code)


def _serve_api(settings: Settings, args: argparse.Namespace) -> None:
    import uvicorn

    from parley.api.main import create_app

    app = create_app(settings)
    # What the imports and the app made stays out of the collector's full passes, as in the
    # worker (worker.py `freeze_startup_objects`): about 180k objects here.
    gc.collect()
    gc.freeze()
    uvicorn.run(
        app,
        host=args.host or settings.api_host,
        port=args.port or settings.api_port,
        log_level="info",
        # Logging is configured in `main` (ids, redaction); uvicorn must not replace it.
        log_config=None,
    )


def _data(settings: Settings, args: argparse.Namespace) -> None:
    """`parley export` (the archive to --out or stdout) and `parley purge` (counts by table)."""
    from parley.launch.data import export_user, purge_now

    require_database(settings)
    if args.command == "purge":
        purged = asyncio.run(purge_now(settings, tenant_id=args.tenant, now=args.now))
        for table, count in sorted(purged.items()):
            print(f"{table}: {count}")
        return
    try:
        archive = asyncio.run(export_user(settings, tenant_id=args.tenant, user_id=args.user))
    except (LookupError, RuntimeError) as exc:
        sys.exit(str(exc))
    if args.out is None:
        sys.stdout.buffer.write(archive)
        sys.stdout.buffer.flush()
    else:
        args.out.write_bytes(archive)
        print(f"wrote {len(archive)} bytes to {args.out}", file=sys.stderr)


def _load_knowledge(settings: Settings, args: argparse.Namespace) -> None:
    """`parley knowledge load [--dir D]`: (re)load the tenants' documents, one line each."""
    from parley.launch.knowledge import KNOWLEDGE_DIR, load_knowledge

    require_database(settings)
    for line in asyncio.run(load_knowledge(settings, args.dir or KNOWLEDGE_DIR)):
        print(line)


def _feature(settings: Settings, args: argparse.Namespace) -> None:
    """`parley feature grant|revoke assistant --tenant T --user U`: from the next request."""
    enabled = args.feature_command == "grant"
    found = asyncio.run(
        set_feature(
            settings, tenant=args.tenant, user=args.user, feature=args.feature, enabled=enabled
        )
    )
    if not found:
        sys.exit(f"unknown user {args.user!r} in tenant {args.tenant!r}")
    print(f"{args.feature} {'granted to' if enabled else 'revoked from'} {args.user}")


def _revoke(settings: Settings, args: argparse.Namespace) -> None:
    if (args.token is None) == (args.user is None) or (args.user and not args.tenant):
        sys.exit("give either a token, or --tenant and --user")
    revoked = asyncio.run(
        revoke_tokens(settings, token=args.token, tenant=args.tenant, user=args.user)
    )
    if args.token is not None and revoked == 0:
        sys.exit("no such live token")
    print(f"revoked {revoked} token(s)")


if __name__ == "__main__":
    main()
