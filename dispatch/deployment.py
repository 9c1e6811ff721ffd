"""Worker Deployment Versioning: which deployment version a worker serves, and making it the
version that new turns start on.

A turn is pinned (`VersioningBehavior.PINNED`, the versioned worker's default for its only
workflow) to the version it started on:
its every task goes to workers of that build, so a deploy never hands a running turn to code
it was not recorded with. New turns go to the deployment's current version. A deploy starts
workers of the new build, makes their version current, and stops the old workers once their
version has drained (no open pinned turn left; `temporal worker deployment describe-version`).
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from importlib import metadata
from pathlib import Path

from temporalio.api.workflowservice.v1 import SetWorkerDeploymentCurrentVersionRequest
from temporalio.client import Client
from temporalio.common import VersioningBehavior, WorkerDeploymentVersion
from temporalio.service import RPCError
from temporalio.worker import WorkerDeploymentConfig

from parley.config import Settings

REPO = Path(__file__).resolve().parent.parent
# A new version exists once one of its workers has polled; promotion waits that long.
PROMOTE_WITHIN_S = 30.0


def build_id(settings: Settings) -> str:
    """The configured build id, else the package version and the git commit when run from a
    checkout (`0.1.0+3f2a9c1`), else the package version alone (an installed image)."""
    if settings.worker_build_id:
        return settings.worker_build_id
    version = metadata.version("parley")
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
        return version
    return f"{version}+{commit}" if commit else version


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


async def promote(client: Client, version: WorkerDeploymentVersion) -> None:
    """Make `version` the deployment's current version, once its workers have polled."""
    request = SetWorkerDeploymentCurrentVersionRequest(
        namespace=client.namespace,
        deployment_name=version.deployment_name,
        build_id=version.build_id,
        identity=client.identity,
    )
    deadline = time.monotonic() + PROMOTE_WITHIN_S
    while True:
        try:
            await client.workflow_service.set_worker_deployment_current_version(request)
            return
        except RPCError:
            # Not registered yet (no poll has reached the server), or a concurrent change.
            if time.monotonic() >= deadline:
                raise
            await asyncio.sleep(0.2)
