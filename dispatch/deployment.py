"""Worker Deployment Versioning: which deployment version a worker serves, and making it the
version that new turns start on.

A turn is pinned (`VersioningBehavior.PINNED`, the versioned worker's default for its only
workflow) to the version it started on:
its every task goes to workers of that build, so a deploy never hands a running turn to code
it was not recorded with. New turns go to the deployment's current version. A deploy starts
workers of the new build, makes their version current, and stops the old workers once their
version has drained (no open pinned turn left; `temporal worker deployment describe-version`).

Versioned is the default (`Settings.worker_deployment` = "parley") wherever a worker starts:
`parley dev`, compose, the test stacks and the bench. A turn started before any version of
the deployment is current (a worker still starting) is not lost: it waits, unpinned, and the
promoted version takes it within a second; still, `parley dev` and the bench make sure of the
promotion before they say they are running. Whoever starts several workers reads the build id
once and hands it to all of them, so a commit in between cannot split them into two versions.
"""

from __future__ import annotations

import asyncio
import hashlib
import subprocess
import time
from importlib import metadata
from pathlib import Path

from temporalio.api.deployment.v1 import WorkerDeploymentVersion as WorkerDeploymentVersionProto
from temporalio.api.enums.v1 import WorkerDeploymentVersionStatus
from temporalio.api.workflowservice.v1 import (
    DescribeWorkerDeploymentRequest,
    DescribeWorkerDeploymentVersionRequest,
    SetWorkerDeploymentCurrentVersionRequest,
)
from temporalio.client import Client
from temporalio.common import VersioningBehavior, WorkerDeploymentVersion
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import WorkerDeploymentConfig

from parley.config import Settings

REPO = Path(__file__).resolve().parent.parent
# A new version exists once one of its workers has polled; promotion waits that long.
PROMOTE_WITHIN_S = 30.0


def build_id(settings: Settings) -> str:
    """The configured build id, else the package version and the git commit when run from a
    checkout (`0.1.0+3f2a9c1d0e4b`), else the version and a digest of the installed files (an
    image: `0.1.0+sha.1b2c3d4e5f60`), so every image of changed code is a new build without
    anyone remembering to pass one. Every worker of one checkout or one image agrees."""
    if settings.worker_build_id:
        return settings.worker_build_id
    version = metadata.version("parley")
    commit = _git_commit()
    if commit:
        return f"{version}+{commit}"
    digest = installed_digest(metadata.distribution("parley").read_text("RECORD") or "")
    return f"{version}+sha.{digest}" if digest else version


def _git_commit() -> str:
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
    return commit


def installed_digest(record: str) -> str:
    """A digest of an installed distribution's RECORD (every file with its sha256), or ""
    for an editable install, whose RECORD names no source file."""
    if not any(line.startswith("parley/workflows/") for line in record.splitlines()):
        return ""
    return hashlib.sha256(record.encode()).hexdigest()[:12]


def deployment_version(settings: Settings) -> WorkerDeploymentVersion | None:
    if not settings.worker_deployment:
        return None
    return WorkerDeploymentVersion(settings.worker_deployment, build_id(settings))


def deployment_config(settings: Settings) -> WorkerDeploymentConfig | None:
    """The worker's deployment version, its turns pinned; None for an unversioned worker
    (which may not name a versioning behavior at all)."""
    version = deployment_version(settings)
    if version is None:
        return None
    return WorkerDeploymentConfig(
        version=version,
        use_worker_versioning=True,
        default_versioning_behavior=VersioningBehavior.PINNED,
    )


# A version that was current once and has since been replaced: its workers (one restarting
# mid-deploy, an old replica) never take new turns back; a rollback is an operator's
# `temporal worker deployment set-current-version`.
REPLACED = (
    WorkerDeploymentVersionStatus.WORKER_DEPLOYMENT_VERSION_STATUS_DRAINING,
    WorkerDeploymentVersionStatus.WORKER_DEPLOYMENT_VERSION_STATUS_DRAINED,
)


async def promote(
    client: Client, version: WorkerDeploymentVersion, *, take_back: bool = False
) -> bool:
    """Make `version` the deployment's current version once its workers have polled, unless
    another version replaced it (then False, nothing changed) or `take_back` says it wins
    anyway (`parley dev`, where the checkout is the truth). True: it is current."""
    request = SetWorkerDeploymentCurrentVersionRequest(
        namespace=client.namespace,
        deployment_name=version.deployment_name,
        build_id=version.build_id,
        identity=client.identity,
    )
    deadline = time.monotonic() + PROMOTE_WITHIN_S
    while True:
        try:
            status = await _status(client, version)
            if status == WorkerDeploymentVersionStatus.WORKER_DEPLOYMENT_VERSION_STATUS_CURRENT:
                return True
            if status in REPLACED and not take_back:
                return False
            await client.workflow_service.set_worker_deployment_current_version(request)
            return True
        except RPCError:
            # Not registered yet (no poll has reached the server), or a concurrent change.
            if time.monotonic() >= deadline:
                raise
            await asyncio.sleep(0.2)


async def _status(
    client: Client, version: WorkerDeploymentVersion
) -> WorkerDeploymentVersionStatus.ValueType:
    """The version's status; RPCError (not found) until one of its workers has polled."""
    response = await client.workflow_service.describe_worker_deployment_version(
        DescribeWorkerDeploymentVersionRequest(
            namespace=client.namespace,
            deployment_version=WorkerDeploymentVersionProto(
                deployment_name=version.deployment_name, build_id=version.build_id
            ),
        )
    )
    return response.worker_deployment_version_info.status


async def promote_configured(client: Client, settings: Settings) -> bool:
    """What a started worker does (`run_worker`, the test stacks): make its version current
    when it is versioned and `worker_promote` is on, unless a newer build replaced it. Safe to
    repeat: a version that is already current stays so (a second worker of the same build).
    False: this worker serves a version that new turns do not go to."""
    version = deployment_version(settings)
    if version is None or not settings.worker_promote:
        return True
    return await promote(client, version)


# What the server answers while its deployment workflow cannot take a request just now.
_PASSING = (RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED)


async def current_build(client: Client, deployment_name: str) -> str | None:
    """The build id of the deployment's current version; None while it has none (or the
    deployment does not exist yet). The server's answer that it cannot read the deployment
    now (its deployment workflow moving, under load) is asked again, for a while."""
    request = DescribeWorkerDeploymentRequest(
        namespace=client.namespace, deployment_name=deployment_name
    )
    deadline = time.monotonic() + PROMOTE_WITHIN_S
    while True:
        try:
            response = await client.workflow_service.describe_worker_deployment(request)
            break
        except RPCError as error:
            if error.status not in _PASSING or time.monotonic() >= deadline:
                return None
            await asyncio.sleep(0.2)
    routing = response.worker_deployment_info.routing_config
    if not routing.HasField("current_deployment_version"):
        return None
    return routing.current_deployment_version.build_id or None


async def wait_promoted(client: Client, settings: Settings, timeout_s: float) -> None:
    """Until the version the settings' workers serve is current (one of them promoted it), so
    a caller that says "running" knows new turns reach a worker of this build. Returns at once
    for unversioned workers or a version promoted by hand (`worker_promote` off)."""
    version = deployment_version(settings)
    if version is None or not settings.worker_promote:
        return
    deadline = time.monotonic() + timeout_s
    while await current_build(client, version.deployment_name) != version.build_id:
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{version.to_canonical_string()} is not current after {timeout_s}s")
        await asyncio.sleep(0.2)
