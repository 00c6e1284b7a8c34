"""nvdp.kube's one client constructor: every user gets the same one-line KubeError when no
configuration can be loaded (gfd's NodeFeature output used to crash with the client's own exception)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nvdp.base.errors import KubeError
from nvdp.kube import Involved, KubeEvents, new_api_client
from nvdp.side.gfd.output import NodeFeatureOutput

NO_CONFIG = "no such file"  # said before the client is asked (its words: "Invalid kube-config file")


def test_missing_kubeconfig_is_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "kubeconfig"
    with pytest.raises(KubeError) as raised:
        new_api_client(kubeconfig=str(missing))
    assert str(raised.value) == f"cannot load kubeconfig {missing}: {NO_CONFIG}"


def test_unreadable_kubeconfig_is_one_line_with_the_clients_reason(tmp_path: Path) -> None:
    empty = tmp_path / "kubeconfig"
    empty.write_text("")
    with pytest.raises(KubeError) as raised:
        new_api_client(kubeconfig=str(empty))
    assert str(raised.value).startswith(f"cannot load kubeconfig {empty}: ")
    assert "\n" not in str(raised.value)


def test_node_feature_output_without_a_config_retries_then_one_line(tmp_path: Path) -> None:
    missing = str(tmp_path / "kubeconfig")
    output = NodeFeatureOutput(
        "node-a", "ns", api_factory=lambda: new_api_client(kubeconfig=missing), attempts=2, backoff=0.01
    )
    with pytest.raises(KubeError) as raised:
        output.write({"nvidia.com/gpu.count": "1"})
    assert str(raised.value) == f"cannot load kubeconfig {missing}: {NO_CONFIG}"


def test_node_event_to_nowhere_is_one_line() -> None:
    events = KubeEvents("node-a", host="http://127.0.0.1:9", request_timeout=2)
    with pytest.raises(KubeError) as raised:
        events.create_event(Involved.node("node-a"), "Warning", "GPUUnhealthy", "x")
    assert str(raised.value).startswith("cannot create event on node node-a: ")
    assert "\n" not in str(raised.value)
