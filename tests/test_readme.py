"""The README's first screens, as a newcomer and an operator read them.

The first screen (above the first `---` rule) holds exactly two set-up commands that work on a fresh
machine: one installs nvdp and runs `nvdp simulate` (tests/test_simulate.py runs the demo itself),
one runs the test suite. Right after them, *Install on a cluster* builds and pushes the image with the
repository's Dockerfile and installs the chart with that image, through values the chart has. The
`nvdp status` example picks the plugin's pod on a node by names the chart renders (and NVIDIA's chart
gives too: the same DaemonSet name, selector labels and container name).
"""

from __future__ import annotations

import re
import shlex
import tomllib
from collections.abc import Callable

import pytest
import yaml

from testkit import REPO
from tests import test_deploy as deploy
from tests.test_deploy import CHART, RELEASE, Doc, Rendered, container_env

render = deploy.render  # the chart fixtures, shared with tests/test_deploy.py
renderer = deploy.renderer

README = REPO / "README.md"
FENCE = re.compile(r"^ *```(\w*)\n(.*?)^ *```$", re.MULTILINE | re.DOTALL)  # also inside a list item
PLUGIN_CONTAINER = "nvidia-device-plugin-ctr"


def first_screen() -> str:
    text = README.read_text()
    head, rule, _ = text.partition("\n---\n")
    assert rule, "the first screen ends at a `---` rule"
    return head


def section(title: str) -> str:
    text = README.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def commands(block: str) -> list[list[str]]:
    """The shell commands of a block: lines joined at `\\`, split at `&&`."""
    joined = block.replace("\\\n", " ")
    return [shlex.split(part) for line in joined.splitlines() if line.strip() for part in line.split("&&")]


def test_first_screen_has_exactly_two_set_up_commands() -> None:
    blocks = FENCE.findall(first_screen())
    assert [language for language, _ in blocks] == ["bash", "bash"]
    assert all(body.count("\n") == 1 for _, body in blocks), "one line each, to copy"
    demo, suite = (commands(body) for _, body in blocks)
    venv = ["python3", "-m", "venv", ".venv"]
    assert demo == [venv, [".venv/bin/pip", "install", "."], [".venv/bin/nvdp", "simulate"]]
    assert suite == [
        venv,
        [".venv/bin/pip", "install", "-q", ".[test]"],
        [".venv/bin/python", "-m", "pytest", "-q"],
    ]
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert "test" in project["optional-dependencies"]
    assert project["scripts"]["nvdp"] == "nvdp.cli:main"


def test_install_on_a_cluster_follows_the_first_screen() -> None:
    text = README.read_text()
    line = text[: text.index("\n## Install on a cluster\n")].count("\n") + 2
    assert line <= 60, f"*Install on a cluster* starts at line {line}"
    (block,) = [
        body for language, body in FENCE.findall(section("Install on a cluster")) if language == "bash"
    ]
    clone, cd, build, push, helm = commands(block)
    assert clone[:2] == ["git", "clone"] and cd == ["cd", clone[-1]]
    assert build[:3] == ["docker", "build", "-t"] and build[4:] == ["."] and (REPO / "Dockerfile").is_file()
    image = build[3]
    assert push == ["docker", "push", image]
    assert helm[:4] == ["helm", "upgrade", "--install", RELEASE] and helm[4] == "charts/nvidia-device-plugin"
    assert (REPO / helm[4] / "Chart.yaml").is_file()
    sets = dict(helm[i + 1].split("=", 1) for i, word in enumerate(helm) if word == "--set")
    assert set(sets) == {"image.repository", "image.tag"}
    assert f"{sets['image.repository']}:{sets['image.tag']}" == image
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert {"repository", "tag"} <= set(values["image"])
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert sets["image.tag"] == chart["appVersion"], "the tag the chart's version builds"
    assert helm[helm.index("--namespace") + 1] == status_names()["namespace"]


def status_names() -> dict[str, str]:
    """The names the README's `nvdp status` example uses to find the plugin's pod on a node."""
    (block,) = [
        body
        for _, body in FENCE.findall(README.read_text())
        if "-- nvdp status" in body and "kubectl" in body
    ]
    found = {
        "namespace": re.findall(r"kubectl -n (\S+)", block),
        "label": re.findall(r" -l (\S+)", block),
        "field": re.findall(r"--field-selector (\S+)", block),
        "daemonset": re.findall(r'ownerReferences\[0\]\.name=="([^"]+)"', block),
        "container": re.findall(r" -c (\S+)", block),
    }
    assert all(found.values()), found
    namespaces = set(found["namespace"])
    assert len(namespaces) == 1, "one namespace for both commands"
    return {
        "namespace": namespaces.pop(),
        "label": found["label"][0],
        "field": found["field"][0],
        "daemonset": found["daemonset"][0],
        "container": found["container"][0],
    }


def _pod(doc: Doc) -> Doc:
    pod: Doc = doc["spec"]["template"]["spec"]
    return pod


def test_status_example_finds_the_plugin_pod_by_the_charts_names(render: Callable[..., Rendered]) -> None:
    names = status_names()
    assert names["field"] == "spec.nodeName=$NODE"
    key, value = names["label"].split("=")
    values = {"gfd": {"enabled": True}, "nfd": {"enabled": False}, "mps": {"enabled": True}}
    out = render(values, namespace=names["namespace"])
    daemonsets = {doc["metadata"]["name"]: doc for doc in out.docs if doc["kind"] == "DaemonSet"}
    plugin = daemonsets[names["daemonset"]]
    assert plugin["metadata"]["namespace"] == names["namespace"]
    # the label selects the plugin's pods (and, as in NVIDIA's chart, may select GFD's and MPS's too:
    # the DaemonSet's name picks the plugin's pod among them)
    assert plugin["spec"]["template"]["metadata"]["labels"].get(key) == value
    assert len(daemonsets) == 3
    (ctr,) = [c for c in _pod(plugin)["containers"] if c["name"] == names["container"]]
    assert names["container"] == PLUGIN_CONTAINER and "METRICS_ADDRESS" in container_env(ctr)


def test_readme_links_resolve() -> None:
    text = README.read_text()
    for target in re.findall(r"\]\(((?:docs|tests|charts|deployments)/[^)#]+)", text):
        assert (REPO / target).exists(), target
    anchors = {heading_anchor(h) for h in re.findall(r"^#+ (.+)$", text, re.MULTILINE)}
    for anchor in re.findall(r"\]\(#([^)]+)\)", text):
        assert anchor in anchors, anchor


def heading_anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize(
    "title", ["Migrating from NVIDIA", "Install on a cluster"], ids=["migrating", "install"]
)
def test_section_in_contents(title: str) -> None:
    contents = section("Contents")
    assert f"[{title}](#{heading_anchor(title)})" in contents
