"""`parley eval SUITE` and `parley eval capture --feedback`: where the evaluator finds Parley
and as whom it speaks.

Against `make run` (the default) it mints short-lived tokens in the running dev database
(found through `.data/dev.json`, like every `parley` command): one per conversation's user,
one for the tenant's operator (`--admin`, default `ops_admin`), and it reads the demo
backend's address from there too. Against any other Parley, `--url` and `--token` (an
operator's token) with `--user-token TENANT/USER=TOKEN` for each user of the suite.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from parley.config import Settings
from parley.launch.seeding import create_token

if TYPE_CHECKING:
    from parley.eval.runner import Target

TOKEN_TTL = timedelta(hours=2)


def add_parser(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    run = commands.add_parser(
        "eval",
        help="run a suite of labelled conversations (or `eval capture --feedback`)",
        description="Run SUITE (a folder of YAML conversations) against a running Parley; "
        "`parley eval capture --feedback` writes draft conversations from negative feedback.",
    )
    run.add_argument("suite", help="a suite folder (evals/<name>), or `capture`")
    run.add_argument("--url", help="the API (default: the running `make run`)")
    run.add_argument("--token", help="an operator's token (with --url)")
    run.add_argument("--user-token", action="append", default=[], metavar="TENANT/USER=TOKEN")
    run.add_argument("--admin", default="ops_admin", help="operator user for dev tokens")
    run.add_argument("--backend", help="the demo backend (default: the dev one, if any)")
    run.add_argument("--tenant-config", type=Path, metavar="B.json")
    run.add_argument("--compare", nargs=2, type=Path, metavar=("A.json", "B.json"))
    run.add_argument("--json", type=Path, dest="json_out", metavar="FILE", help="`-`: stdout")
    run.add_argument("--html", type=Path, dest="html_out", metavar="FILE")
    run.add_argument("--baseline", type=Path, metavar="FILE", help="a saved --json result")
    run.add_argument("--trace-url", help="a trace viewer: a template with {turn_id}")
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    run.add_argument("--feedback", action="store_true", help="with `capture`")
    run.add_argument(
        "--tenant", default="northwind", help="the tenant configured, or captured from"
    )
    run.add_argument("--out", type=Path, help="with `capture` (default: PARLEY_EVAL_CAPTURE_DIR)")


def run_eval(settings: Settings, args: argparse.Namespace) -> None:
    from parley.eval.command import Options, main

    target = _target(settings, args)
    if args.suite == "capture":
        if not args.feedback:
            sys.exit("`parley eval capture` needs --feedback (the only source so far)")
        sys.exit(_capture(target, args, args.out or settings.eval_capture_dir))
    options = Options(
        suite=Path(args.suite),
        tenant_config=args.tenant_config,
        compare=tuple(args.compare) if args.compare else None,
        json_out=args.json_out,
        html_out=args.html_out,
        baseline=args.baseline,
        trace_url=args.trace_url,
        quiet=args.quiet,
        config_tenant=args.tenant,
    )
    sys.exit(main(options, target))


def _target(settings: Settings, args: argparse.Namespace) -> Target:
    from parley.eval.runner import Target

    given: dict[tuple[str, str], str] = {}
    for item in args.user_token:
        who, _, token = item.partition("=")
        tenant, _, user = who.partition("/")
        if not (tenant and user and token):
            sys.exit(f"--user-token wants TENANT/USER=TOKEN, not {item!r}")
        given[(tenant, user)] = token
    if args.url:
        return _remote(args, given)
    url = f"http://{settings.api_host}:{settings.api_port}"

    async def token_for(tenant: str, user: str) -> str:
        if (tenant, user) in given:
            return given[(tenant, user)]
        return await create_token(settings, tenant, user, TOKEN_TTL)

    async def admin_token_for(tenant: str) -> str | None:
        try:
            return await create_token(settings, tenant, args.admin, TOKEN_TTL)
        except LookupError:
            return None

    async def after_faults() -> None:
        # An outage conversation may have opened the worker's circuit breaker: wait out its
        # cooldown so the next conversation meets a closed one.
        await asyncio.sleep(settings.breaker_cooldown_s)

    backend = args.backend or settings.northwind_url
    return Target(url, token_for, admin_token_for, backend, after_faults)


def _remote(args: argparse.Namespace, given: dict[tuple[str, str], str]) -> Target:
    from parley.eval.runner import Target

    async def token_for(tenant: str, user: str) -> str:
        if (tenant, user) not in given:
            raise SystemExit(f"no token for {tenant}/{user}: add --user-token {tenant}/{user}=…")
        return given[(tenant, user)]

    async def admin_token_for(tenant: str) -> str | None:
        return args.token

    return Target(args.url.rstrip("/"), token_for, admin_token_for, args.backend)


def _capture(target: Target, args: argparse.Namespace, out: Path) -> int:
    from parley.eval.capture import capture_feedback

    async def token_or_none(tenant: str, user: str) -> str | None:
        try:
            return await target.token_for(tenant, user)
        except (SystemExit, LookupError):
            return None

    async def capture() -> list[Path]:
        admin = await target.admin_token_for(args.tenant)
        if admin is None:
            raise SystemExit(f"capturing feedback needs an operator token for {args.tenant}")
        return await capture_feedback(
            url=target.url,
            admin_token=admin,
            tenant=args.tenant,
            token_for=token_or_none,
            out=out,
        )

    written = asyncio.run(capture())
    for path in written:
        print(f"draft: {path}")
    print(f"{len(written)} draft(s) written to {out}")
    return 0
