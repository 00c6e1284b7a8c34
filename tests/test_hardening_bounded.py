"""Issue 26 item 2, in process: every JSON and YAML reader of nvdp parses through `nvdp.base.bounded`, so a
document nested 100,000 levels deep, one over the reader's size, or (YAML) an alias bomb is refused in
one line where it used to raise RecursionError (or walk 10^9 nodes). The daemons' half (they keep
serving) is `test_hardening_bounded_process.py`."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nvdp.base.bounded import MAX_DEPTH, BoundExceeded, json_depth, loads_json, loads_yaml
from nvdp.base.errors import ConfigError, KubeError, NvdpError, UnreadableFile
from nvdp.config import parse_text
from nvdp.kube import client as kube_client
from nvdp.node.nvml.sim import SimEventError, load_node_file, open_sim
from nvdp.plugins.dra.checkpoint import Checkpoint
from nvdp.plugins.dra.nvidia_checkpoint import adopt as adopt_nvidia_checkpoint
from nvdp.plugins.handoff import DEVICE_PLUGIN, DRA, UNKNOWN_HOLDER, Handoff, Record
from nvdp.plugins.ledger.checkpoint import read_pod_uids
from nvdp.plugins.ledger.status import read_allocations
from tests.odd_files import make_sparse
from tests.readings import log_lines

LEVELS = 100_000
DEEP_ARRAY = "[" * LEVELS + "]" * LEVELS  # 200 KB, under every size bound
DEEP_OBJECT = '{"a":' * LEVELS + "1" + "}" * LEVELS
TOO_DEEP_JSON = f"JSON nested deeper than {MAX_DEPTH} levels"
DEEP_FLOW_YAML = "[" * LEVELS + "]" * LEVELS
DEEP_BLOCK_YAML = "".join(f"{'  ' * i}a:\n" for i in range(1000))
LAUGHS = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{b}: &{b} [{', '.join([f'*{a}'] * 9)}]\n" for a, b in zip("abcdefgh", "bcdefghi", strict=True)
)  # 10 lines, 9^9 = 387 million strings for whoever walks it
LAUGHS_REFUSED = "YAML aliases stand for more than 524288 nodes at line 6, column 32"


def brackets(levels: int) -> str:
    return "[" * levels + "]" * levels


# ---- the parsers ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [DEEP_ARRAY, DEEP_OBJECT, DEEP_ARRAY.encode(), '{"x": [' + DEEP_ARRAY + "]}"],
    ids=["array", "object", "bytes", "inside-an-object"],
)
def test_json_nested_past_the_bound_is_refused_in_one_line(text: str | bytes) -> None:
    with pytest.raises(BoundExceeded) as raised:
        loads_json(text)
    assert str(raised.value) == TOO_DEEP_JSON


def test_json_at_the_bound_is_read_and_brackets_in_strings_are_no_nesting() -> None:
    assert json_depth(brackets(MAX_DEPTH)) == MAX_DEPTH
    loads_json(brackets(MAX_DEPTH))
    with pytest.raises(BoundExceeded):
        loads_json(brackets(MAX_DEPTH + 1))
    in_strings = json.dumps(["[" * 5000, "{" * 5000, 'a\\"[[[[', {"k": "]]]"}])
    assert loads_json(in_strings) == json.loads(in_strings)
    assert json_depth(in_strings) == 2


def test_json_size_bound_and_text_that_is_no_utf8() -> None:
    with pytest.raises(BoundExceeded) as raised:
        loads_json("[" + "1," * 600 + "1]", max_bytes=1024)
    assert str(raised.value) == "JSON larger than 1 KiB"
    with pytest.raises(ValueError, match="can't decode byte 0xff"):
        loads_json(b'{"a": "\xff"}')


def test_the_depth_scan_is_linear_in_unterminated_strings() -> None:
    """An unterminated string of escaped quotes: a string pattern restarted at each quote is
    quadratic (hours for this text); the scan ends in milliseconds and JSON says what is wrong."""
    started = time.monotonic()
    with pytest.raises(json.JSONDecodeError, match="Unterminated string"):
        loads_json('["' + '\\"' * 400_000 + "[" * 1000)
    assert time.monotonic() - started < 5


json_values = st.recursive(
    st.none() | st.integers() | st.text(alphabet='[]{}"\\ab', max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(alphabet="[]{}k", max_size=3), inner),
    max_leaves=30,
)


def depth_of(value: object) -> int:
    if isinstance(value, list):
        return 1 + max(map(depth_of, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(depth_of, value.values()), default=0)
    return 0


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_the_depth_scan_agrees_with_the_decoded_value(value: object) -> None:
    text = json.dumps(value)
    assert json_depth(text) == depth_of(value)
    assert loads_json(text) == value


@pytest.mark.parametrize(
    "text, max_bytes, refused",
    [
        (DEEP_FLOW_YAML, 1 << 20, "YAML nested deeper than 100 levels at line 1, column 101"),
        (DEEP_BLOCK_YAML, 1 << 20, "YAML nested deeper than 100 levels at line 100, column 199"),
        (LAUGHS, 1 << 20, LAUGHS_REFUSED),
        ("a: &a [x, *a]\n", 1 << 20, "YAML alias *a inside its own anchor at line 1, column 11"),
        ("a: " + "x" * 2000, 1024, "YAML larger than 1 KiB"),
    ],
    ids=["deep-flow", "deep-block", "billion-laughs", "self-alias", "oversize"],
)
def test_yaml_past_a_bound_is_refused_in_one_line(text: str, max_bytes: int, refused: str) -> None:
    started = time.monotonic()
    with pytest.raises(BoundExceeded) as raised:
        loads_yaml(text, max_bytes=max_bytes)
    assert str(raised.value) == refused
    assert time.monotonic() - started < 5


def test_yaml_within_the_bounds_is_plain_data_with_its_aliases() -> None:
    assert loads_yaml("a: &x {k: [1, 2]}\nb: *x\nc: [*x, *x]\n") == {
        "a": {"k": [1, 2]},
        "b": {"k": [1, 2]},
        "c": [{"k": [1, 2]}, {"k": [1, 2]}],
    }
    assert loads_yaml(brackets(MAX_DEPTH)) == json.loads(brackets(MAX_DEPTH))
    assert loads_yaml("") is None


# ---- the readers ----------------------------------------------------------------------------------


@pytest.mark.parametrize("content", ["deep", "oversize"])
def test_an_unreadable_hand_over_record_is_the_unreadable_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, content: str
) -> None:
    """The other side's record unreadable: one WARNING, and the record is unknown (the other side may
    hold any GPU: none is taken from it)."""
    path = tmp_path / "served-by-dra.json"
    if content == "deep":
        path.write_text(DEEP_ARRAY)
        error = TOO_DEEP_JSON
    else:
        make_sparse(path, (1 << 20) + 1)
        error = f"{path}: larger than 1 MiB"
    plugin = Handoff(DEVICE_PLUGIN, tmp_path)
    try:
        with caplog.at_level(logging.WARNING):
            assert plugin.read_other() == Record(alive=False, known=False)
            assert plugin.settle(frozenset({"GPU-a"}), {}).waiting == {"GPU-a": UNKNOWN_HOLDER}
        assert log_lines(caplog) == [
            "GPU hand-over record unreadable; no GPU is taken from the other API until it is readable "
            f'path={path} error="{error}"'
        ]
    finally:
        plugin.close()


@pytest.mark.parametrize("content", ["deep", "oversize"])
def test_an_unreadable_dra_checkpoint_is_set_aside(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, content: str
) -> None:
    path = tmp_path / "checkpoint.json"
    if content == "deep":
        path.write_text(DEEP_OBJECT)
        error = TOO_DEEP_JSON
    else:
        make_sparse(path, (16 << 20) + 1)
        error = f"{path}: larger than 16 MiB"
    with caplog.at_level(logging.WARNING):
        adopt_nvidia_checkpoint(Checkpoint(path), "")  # read first at start: not NVIDIA's either
        assert Checkpoint(path).load() is None
    (aside,) = tmp_path.glob("checkpoint.json.bad-*")
    assert log_lines(caplog) == [
        "checkpoint unreadable; rebuilding the prepared claims from their CDI specs and the API "
        f'path={path} error="{error}" kept_as={aside}'
    ]
    assert not path.exists()


def test_an_unreadable_kubelet_checkpoint_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "kubelet_internal_checkpoint"
    path.write_text('{"Data": {"PodDeviceEntries": ' + DEEP_ARRAY + "}}")
    with pytest.raises(NvdpError) as raised:
        read_pod_uids(path)
    assert str(raised.value) == f"{path}: not a kubelet device checkpoint: {TOO_DEEP_JSON}"
    make_sparse(path, (8 << 20) + 1)
    with pytest.raises(UnreadableFile) as unreadable:
        read_pod_uids(path)
    assert str(unreadable.value) == f"{path}: larger than 8 MiB"


@pytest.mark.parametrize(
    "text, problem",
    [
        ('{"version": "v1", "flags": ' + DEEP_ARRAY + "}", f"invalid config: {TOO_DEEP_JSON}"),
        (
            "version: v1\nflags: " + DEEP_FLOW_YAML,
            "invalid config: YAML nested deeper than 100 levels at line 2, column 107",
        ),
        ("version: v1\n" + LAUGHS, "invalid config: " + LAUGHS_REFUSED.replace("line 6", "line 7")),
        (
            "version: v1\nx: &a [*a]\n",
            "invalid config: YAML alias *a inside its own anchor at line 2, column 8",
        ),
        ("version: v1\n#" + "x" * (1 << 20), "invalid config: larger than 1 MiB"),
    ],
    ids=["deep-json", "deep-yaml", "billion-laughs", "self-alias", "oversize"],
)
def test_a_config_past_a_bound_is_one_config_error(text: str, problem: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_text(text, source="config.yaml")
    assert raised.value.problems == [problem]


@pytest.mark.parametrize(
    "text, problem",
    [
        (DEEP_FLOW_YAML, "YAML nested deeper than 100 levels at line 1, column 101"),
        (LAUGHS, LAUGHS_REFUSED),
        (
            "gpus: " + "1" * 5000,
            "invalid YAML: Exceeds the limit (4300 digits) for integer string conversion...",
        ),
    ],
    ids=["deep", "billion-laughs", "long-integer"],
)
def test_a_simulated_node_file_past_a_bound_is_one_config_error(
    tmp_path: Path, text: str, problem: str
) -> None:
    path = tmp_path / "node.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as raised:
        load_node_file(path)
    assert raised.value.problems == [problem]


def test_a_deep_events_file_line_is_skipped_in_one_line() -> None:
    nvml = open_sim("pcie-4")
    with pytest.raises(SimEventError) as raised:
        nvml.inject('{"uuid": ' + DEEP_ARRAY + ', "xid": 79}')
    assert str(raised.value) == TOO_DEEP_JSON


def test_a_deep_kubeconfig_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text("apiVersion: v1\nclusters: " + DEEP_FLOW_YAML)
    with pytest.raises(KubeError) as raised:
        kube_client.new_api_client(kubeconfig=str(path))
    assert str(raised.value) == (
        f"cannot load kubeconfig {path}: YAML nested deeper than 100 levels at line 2, column 110"
    )
    path.write_text(LAUGHS)
    with pytest.raises(KubeError) as raised:
        kube_client.new_api_client(kubeconfig=str(path))
    assert str(raised.value) == f"cannot load kubeconfig {path}: {LAUGHS_REFUSED}"


class _Answers(BaseHTTPRequestHandler):
    """Every GET is answered 200 with the server's `body`."""

    def do_GET(self) -> None:
        body: bytes = self.server.body  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def answering(body: str) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Answers)
    server.body = body.encode()  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_deep_api_answer_is_one_kube_error_and_a_deep_watch_event_a_bad_line() -> None:
    with answering('{"type": "ADDED", "object": ' + DEEP_ARRAY + "}\n") as url:
        api_client = kube_client.new_api_client(host=url, retries=0)
        with pytest.raises(KubeError) as raised:
            kube_client.get_json(api_client, "/api/v1/nodes/a", {}, 5)
        assert str(raised.value) == TOO_DEEP_JSON
        (event,) = kube_client.watch(api_client, "/api/v1/nodes", {"watch": "true"}, silence=5)
    assert event == kube_client.BadLine(TOO_DEEP_JSON, '{"type": "ADDED", "object": ' + DEEP_ARRAY[:72])


def test_an_api_answer_over_the_size_bound_is_one_kube_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kube_client, "MAX_ANSWER_BYTES", 1024)
    with answering(json.dumps({"items": ["x" * 2000]})) as url:
        with pytest.raises(KubeError) as raised:
            kube_client.get_json(kube_client.new_api_client(host=url, retries=0), "/api/v1/pods", {}, 5)
    assert str(raised.value) == "JSON larger than 1 KiB"


def test_a_deep_allocations_page_is_one_line() -> None:
    with answering(DEEP_OBJECT) as url:
        with pytest.raises(NvdpError) as raised:
            read_allocations(f"{url}/allocations")
    assert str(raised.value) == f"cannot read {url}/allocations: the answer is not an allocations document"


def test_the_dra_records_reader_reads_its_own_previous_record_bounded(tmp_path: Path) -> None:
    (tmp_path / "served-by-dra.json").write_text(DEEP_ARRAY)
    dra = Handoff(DRA, tmp_path)
    try:
        assert dra.settle(frozenset({"GPU-a"}), {}).serve == {"GPU-a"}  # its old holds: none readable
    finally:
        dra.close()
