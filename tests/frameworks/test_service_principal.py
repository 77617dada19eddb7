"""The service framework's principal (what `offerbus job run` submits with): with a CURVE
key it is the key's name, which the master binds to the key and requires (it refused the
job's framework when the principal was the job's name); without one, the service's name."""

from __future__ import annotations

from frameworks.service import ServiceSpec, framework_info
from services.bus.curve import SECRET_ENV, SERVER_ENV, principal_from_env


def test_the_principal_is_the_keys_name_with_a_key_else_the_services_name() -> None:
    spec = ServiceSpec(name="web", image="busybox", instances=2, cpus=0.1, mem=16, role="eng")
    keyed = {SECRET_ENV: "/etc/offerbus/keys/deployer.key_secret",
             SERVER_ENV: "/etc/offerbus/keys/server.key"}
    assert principal_from_env(keyed) == "deployer"
    assert principal_from_env({}) is None
    info = framework_info(spec, 30.0, keyed)
    assert (info.name, info.role, info.principal, info.failover_timeout_s) == (
        "web", "eng", "deployer", 30.0)
    assert framework_info(spec, 30.0, {}).principal == "web"
