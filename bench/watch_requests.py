"""API requests per minute of one node's watches (the config-manager's Node and ConfigMap, the DRA
plugin's ResourceSlices) against the API stand-in, with production's timers:
`python -m bench.watch_requests idle|storm410|endatonce|malformed|other SECONDS` from the repository
root. To measure an older nvdp, export its tree (`git archive REF nvdp | tar -x -C DIR`) and run with
`PYTHONPATH=DIR` (its `nvdp` is then imported, with its own API stand-in). Every command's requests
per hour, idle and after a ConfigMap edit, are `bench/api_cost.py`'s."""

import collections
import json
import logging
import sys
import threading
import time

import nvdp
from nvdp import kube
from nvdp.plugins.dra.cluster import KubeResourceApi
from nvdp.plugins.dra.devices import DriverFacts, node_devices
from nvdp.plugins.dra.publisher import SlicePublisher
from nvdp.side.configmanager.object_watch import ConfigMapWatch, NodeWatch
from testkit import sim_gpus
from testkit.dra import GROUP, serve_dra
from testkit.kube_api_standin import KubeApiStandin

FACTS = DriverFacts("550.54.15", "12.4")

logging.disable(logging.CRITICAL)
scenario, seconds = sys.argv[1], float(sys.argv[2])
NS = "gpu-system"
out = {"nvdp": nvdp.__file__, "scenario": scenario, "seconds": seconds}
with KubeApiStandin() as api:
    serve_dra(api)
    api.put(
        f"/api/v1/namespaces/{NS}/configmaps/cfg",
        {"kind": "ConfigMap", "metadata": {"name": "cfg", "namespace": NS}, "data": {"a": "1"}},
    )
    client = kube.new_api_client(host=api.url, retries=0)
    seen = []
    stop = threading.Event()
    node = NodeWatch(client, "node-a", lambda n: None)
    cm = ConfigMapWatch(
        client,
        NS,
        "cfg",
        lambda d, listed: seen.append(None if d is None else {k: v.decode() for k, v in d.entries.items()}),
    )
    threads = [threading.Thread(target=w.run, args=(stop,), daemon=True) for w in (node, cm)]
    pub = SlicePublisher(KubeResourceApi(client), "node-a")
    pub.update(node_devices(sim_gpus("pcie-4"), FACTS), {})
    for t in threads:
        t.start()
    pub.start()
    api.wait_for(lambda: pub.published.is_set() and seen, 20, "ready")
    api.wait_for(lambda: api.count("GET", f"{GROUP}/v1/resourceslices", watch=True) >= 1, 20, "slice watch")
    if scenario == "storm410":
        api.gone_every_watch = True
        api.end_watches()
    elif scenario == "endatonce":
        api.end_every_watch = True
        api.end_watches()
    elif scenario == "malformed":
        api.inject(f"/api/v1/namespaces/{NS}/configmaps", {"type": "MODIFIED", "object": "x"})
        api.put(
            f"/api/v1/namespaces/{NS}/configmaps/cfg",
            {"kind": "ConfigMap", "metadata": {"name": "cfg", "namespace": NS}, "data": {"a": "2"}},
        )
    elif scenario == "other":
        api.ignore_name_selector = True
        api.end_watches()
        time.sleep(1)
        api.put(
            f"/api/v1/namespaces/{NS}/configmaps/other",
            {"kind": "ConfigMap", "metadata": {"name": "other", "namespace": NS}, "data": {"a": "not ours"}},
        )
    n0 = len(api.requests)
    t0 = time.monotonic()
    time.sleep(seconds)
    reqs = api.requests[n0:]
    dt = time.monotonic() - t0

    def per_min(prefix):
        return round(sum(1 for m, p, q in reqs if p.startswith(prefix)) * 60 / dt, 1)

    out["per_min"] = {
        "slices": per_min(f"{GROUP}/v1/resourceslices"),
        "nodes": per_min("/api/v1/nodes"),
        "configmaps": per_min(f"/api/v1/namespaces/{NS}/configmaps"),
        "all": round(len(reqs) * 60 / dt, 1),
    }
    out["top"] = collections.Counter(f"{m} {p} watch={q.get('watch')}" for m, p, q in reqs).most_common(6)
    out["configmap_seen"] = seen[-3:]
    out["configmap_thread_alive"] = threads[1].is_alive()
    stop.set()
    pub.stop()
    api.end_watches()
print(json.dumps(out))
