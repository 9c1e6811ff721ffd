"""deploy/kubernetes, checked offline: every object against the Kubernetes API schemas, and
the manifests against the code they run (the CLI, Settings, the routes, the contracts), as
tests/unit/test_compose.py does for docker-compose.yml."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from parley.api.routes.ops import router as ops_router
from parley.config import Settings
from parley.contracts import SEARCH_ATTRIBUTES
from tests.support.deploy_files import parse_parley, settings_env_names

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "deploy" / "kubernetes"
# The oldest Kubernetes the manifests promise to fit (the preStop `sleep` action is GA in
# 1.34); strict: a misspelled field is an error, not silently dropped.
KUBERNETES = "1.34.0"
# The Secret the operator creates (kustomization.yaml shows the command).
SECRET = "parley-secrets"
SECRET_KEYS = ("DATABASE_URL", "PARLEY_ERASURE_RECEIPT_KEY")

Obj = dict[str, Any]


@pytest.fixture(scope="module")
def kustomization() -> Obj:
    return yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())


@pytest.fixture(scope="module")
def objects(kustomization: Obj) -> list[Obj]:
    found = []
    for resource in kustomization["resources"]:
        found += [doc for doc in yaml.safe_load_all((MANIFESTS / resource).read_text()) if doc]
    return found


def of_kind(objects: list[Obj], kind: str) -> dict[str, Obj]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def pod_templates(objects: list[Obj]) -> Iterator[tuple[str, Obj]]:
    for obj in objects:
        if obj["kind"] in ("Deployment", "Job"):
            yield obj["metadata"]["name"], obj["spec"]["template"]


def containers(pod: Obj) -> list[Obj]:
    return [*pod["spec"].get("initContainers", []), *pod["spec"]["containers"]]


def parley_containers(objects: list[Obj]) -> Iterator[tuple[str, Obj]]:
    for name, pod in pod_templates(objects):
        for container in containers(pod):
            if container["image"] == "parley":
                yield f"{name}/{container['name']}", container


def environment(objects: list[Obj], container: Obj) -> dict[str, str]:
    """The container's variables: its ConfigMaps' data, stand-ins for its Secret's keys,
    then its own `env`."""
    config_maps = of_kind(objects, "ConfigMap")
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            env |= config_maps[source["configMapRef"]["name"]]["data"]
        if "secretRef" in source:
            env |= {
                "DATABASE_URL": "postgresql://parley:secret@postgres.example:5432/parley",
                "PARLEY_ERASURE_RECEIPT_KEY": "a-key-the-operator-generated-" + "x" * 32,
            }
    env |= {item["name"]: item["value"] for item in container.get("env", [])}
    return env


def settings_of(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Settings:
    for variable in list(os.environ):
        if variable.upper() in settings_env_names():
            monkeypatch.delenv(variable)
    for variable, value in env.items():
        monkeypatch.setenv(variable, value)
    return Settings()


def deployment(objects: list[Obj], component: str) -> Obj:
    [found] = [
        o
        for o in objects
        if o["kind"] == "Deployment"
        and o["metadata"]["labels"]["app.kubernetes.io/component"] == component
    ]
    return found


def test_every_file_is_a_resource_and_every_object_fits_the_kubernetes_schema(
    kustomization: Obj, objects: list[Obj]
) -> None:
    files = {p.name for p in MANIFESTS.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files
    problems = []
    for obj in objects:
        try:
            kubernetes_validate.validate(obj, KUBERNETES, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = "/".join(map(str, exc.path))
            problems.append(f"{obj['kind']}/{obj['metadata']['name']}: {exc.message} at {where}")
    assert problems == []


def test_a_field_the_schema_does_not_know_is_refused() -> None:
    # Guards the check above: a typo must fail, not pass unnoticed.
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "i", "comand": ["x"]}]},
    }
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pod, KUBERNETES, strict=True)


def test_every_parley_container_runs_a_command_the_cli_accepts(objects: list[Obj]) -> None:
    commands = {}
    for where, container in parley_containers(objects):
        command = container["command"]
        assert command[0] == "parley", f"{where} runs {command}, not the parley CLI"
        commands[where] = parse_parley(command[1:], where).command
    assert set(commands.values()) == {"migrate", "api", "worker"}
    # Every pod that serves migrates first (the advisory lock makes that safe at once).
    for component in ("api", "worker"):
        init = deployment(objects, component)["spec"]["template"]["spec"]["initContainers"]
        assert [c["command"] for c in init] == [["parley", "migrate"]]


def test_every_variable_is_one_settings_reads_and_builds_production_settings(
    objects: list[Obj], kustomization: Obj, monkeypatch: pytest.MonkeyPatch
) -> None:
    accepted = settings_env_names() | {"TEMPORAL_NAMESPACE"}  # the temporal CLI's
    for config_map in of_kind(objects, "ConfigMap").values():
        assert set(config_map["data"]) <= accepted
    for where, container in parley_containers(objects):
        assert {item["name"] for item in container.get("env", [])} <= accepted, where
        refs = [s["secretRef"]["name"] for s in container["envFrom"] if "secretRef" in s]
        assert refs == [SECRET], f"{where} must read {SECRET}"
        settings = settings_of(environment(objects, container), monkeypatch)
        assert settings.env == "production"
    assert set(SECRET_KEYS) <= settings_env_names()
    told = (MANIFESTS / "kustomization.yaml").read_text()
    for key in SECRET_KEYS:  # the comment's `kubectl create secret` makes each key
        assert f"--from-literal={key}=" in told


def test_the_api_serves_probes_and_ports_the_pod_declares(
    objects: list[Obj], monkeypatch: pytest.MonkeyPatch
) -> None:
    api = deployment(objects, "api")
    pod = api["spec"]["template"]["spec"]
    [container] = pod["containers"]
    args = parse_parley(container["command"][1:], "api")
    assert args.host == "0.0.0.0"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": args.port}
    routes = {route.path for route in ops_router.routes}  # type: ignore[attr-defined]
    for probe in ("readinessProbe", "livenessProbe"):
        check = container[probe]["httpGet"]
        assert check["path"] in routes and check["port"] == "http"
    # Streams get their grace to end or move before the pod is killed.
    settings = settings_of(environment(objects, container), monkeypatch)
    pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert pod["terminationGracePeriodSeconds"] >= settings.stream_grace_s + pre_stop
    [ingress] = of_kind(objects, "Ingress").values()
    notes = ingress["metadata"]["annotations"]
    assert notes["nginx.ingress.kubernetes.io/proxy-buffering"] == "off"
    assert int(notes["nginx.ingress.kubernetes.io/proxy-read-timeout"]) > (
        settings.stream_keepalive_s * 4
    )
    body_limit = notes["nginx.ingress.kubernetes.io/proxy-body-size"]
    assert body_limit.endswith("m")
    largest = max(settings.max_import_bytes, settings.max_file_bytes, settings.max_body_bytes)
    assert int(body_limit[:-1]) * 1024 * 1024 >= largest


def test_the_worker_drains_within_its_grace_and_joins_its_own_version(
    objects: list[Obj], monkeypatch: pytest.MonkeyPatch
) -> None:
    worker = deployment(objects, "worker")
    pod = worker["spec"]["template"]
    [container] = pod["spec"]["containers"]
    settings = settings_of(environment(objects, container), monkeypatch)
    assert pod["spec"]["terminationGracePeriodSeconds"] > settings.worker_shutdown_grace_s
    assert settings.worker_deployment and settings.api_host == "0.0.0.0"
    # One Deployment per build: its name, label and the build id the pods join agree.
    version = pod["metadata"]["labels"]["app.kubernetes.io/version"]
    assert settings.worker_build_id == version
    assert worker["metadata"]["name"].endswith(f"-{version}")
    assert worker["spec"]["selector"]["matchLabels"]["app.kubernetes.io/version"] == version
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": settings.worker_metrics_port}
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(ports["metrics"])


def test_every_reference_names_an_object_that_exists(objects: list[Obj]) -> None:
    templates = {
        name: pod["metadata"]["labels"]
        for name, pod in pod_templates(objects)
        if name in of_kind(objects, "Deployment")
    }

    def selects_a_deployment(selector: dict[str, str]) -> bool:
        return any(selector.items() <= labels.items() for labels in templates.values())

    for pdb in of_kind(objects, "PodDisruptionBudget").values():
        assert selects_a_deployment(pdb["spec"]["selector"]["matchLabels"])
    services = of_kind(objects, "Service")
    for service in services.values():
        assert selects_a_deployment(service["spec"]["selector"])
    for hpa in of_kind(objects, "HorizontalPodAutoscaler").values():
        assert hpa["spec"]["scaleTargetRef"]["name"] in templates
    for ingress in of_kind(objects, "Ingress").values():
        for rule in ingress["spec"]["rules"]:
            for path in rule["http"]["paths"]:
                backend = path["backend"]["service"]
                ports = {p["name"] for p in services[backend["name"]]["spec"]["ports"]}
                assert backend["port"]["name"] in ports
    claims = set(of_kind(objects, "PersistentVolumeClaim"))
    for _, pod in pod_templates(objects):
        for volume in pod["spec"].get("volumes", []):
            assert volume["persistentVolumeClaim"]["claimName"] in claims


def test_the_search_attributes_registered_are_exactly_the_contracts(objects: list[Obj]) -> None:
    script = "\n".join(
        "\n".join(container.get("args", []))
        for _, pod in pod_templates(objects)
        for container in containers(pod)
    )
    registered = dict(re.findall(r"search-attribute create --name (\w+) --type (\w+)", script))
    expected = {
        key.name: "".join(p.capitalize() for p in key.indexed_value_type.name.split("_"))
        for key in SEARCH_ATTRIBUTES
    }
    assert registered == expected
