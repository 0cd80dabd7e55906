"""`loom serve SERVICE` builds its core from a registry: every service the CLI offers has a
builder, and each builds the core that answers under that service's name."""

from __future__ import annotations

import pytest

from loom.builders import BUILDERS, ServeOptions, build_service
from loom.live_args import SERVICES
from tests.builders import cluster

CLUSTER = cluster(2, 4)
CORE_NAMES = {"scheduler": "scheduler", "placer": "placer", "metrics": "metrics",
              "injector": "injector", "nodeagent": "nodeagent-n0"}


def test_every_service_the_cli_offers_has_a_builder() -> None:
    assert set(BUILDERS) == set(SERVICES) == set(CORE_NAMES)


@pytest.mark.parametrize("service", SERVICES)
def test_each_builder_builds_its_own_core(service: str) -> None:
    built = build_service(ServeOptions(service=service, nats_url="nats://x", cluster=CLUSTER,
                                       node="n0"))
    assert built.core.name == CORE_NAMES[service]
    assert (built.metrics is not None) == (service == "metrics")
    assert built.agent is None and built.backend is None  # simulated trainers by default
    assert built.core.state(5.0)["now"] == 5.0


def test_an_unknown_service_is_refused_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown service 'gateway'; one of scheduler"):
        build_service(ServeOptions(service="gateway", nats_url="nats://x", cluster=CLUSTER))


def test_a_node_agent_names_the_nodes_it_could_be() -> None:
    with pytest.raises(ValueError, match=r"needs --node, one of the cluster's nodes \(n0, n1\)"):
        build_service(ServeOptions(service="nodeagent", nats_url="nats://x", cluster=CLUSTER))


def test_only_simulated_or_pytorch_trainers_are_known() -> None:
    with pytest.raises(ValueError, match="--trainers must be pytorch or simulated"):
        build_service(ServeOptions(service="nodeagent", nats_url="nats://x", cluster=CLUSTER,
                                   node="n0", trainers="jax"))
