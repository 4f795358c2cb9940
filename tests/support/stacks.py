"""The test image and the stacks the tests deploy.

Images come from the local build (gpuhost-test/busybox:1) and the registry on
127.0.0.1:5000 (scripts/build-test-images.sh); nothing is pulled from outside
this machine.
"""

from __future__ import annotations

TEST_IMAGE = "gpuhost-test/busybox:1"
REGISTRY_IMAGE = "127.0.0.1:5000/gpuhost-test/busybox:1"
# busybox plus openssl: a real HTTPS origin (scripts/build-test-images.sh).
TLS_IMAGE = "gpuhost-test/tls:1"
# The smallest valid Create-stack template, for tests of the HTTP surface alone.
TEMPLATE = {"name": "n", "description": "d", "content": "services: {}\n", "environmentVariables": {}}
# One long-running service that stops at once on SIGTERM-less removal.
SLEEPER = f"services:\n  app:\n    image: {TEST_IMAGE}\n    command: ['sleep', '3600']\n    stop_grace_period: 1s\n"


def job_payload(job_id: str, stack_id: str, job_type: str = "stack.deploy", *, rental_id: str = "rental-1") -> dict:
    """A stack job as the marketplace's job poll hands it to the agent
    (docs/agent-api.yaml, Job), deploying SLEEPER."""
    return {
        "jobId": job_id,
        "type": job_type,
        "stackId": stack_id,
        "rentalId": rental_id,
        "envId": "env-1",
        "stackName": "s",
        "template": {"name": "s", "description": "", "content": SLEEPER, "environmentVariables": {}},
    }
