"""A stand-in for the Kubernetes API server on 127.0.0.1, for the tests and the benchmarks that run
a real `kubernetes` client (in a child process or in process) against it. Not used by any command.

Generic: objects are kept by their URL path (`/api/v1/nodes/node-a`,
`/apis/nfd.k8s-sigs.io/v1alpha1/namespaces/ns/nodefeatures/x`); a collection path (the object path
less its last segment) lists them, `fieldSelector=metadata.name=X,spec.nodeName=Y` filters (any
dotted field, compared as text), and `watch=true` streams ADDED / MODIFIED / DELETED events as
chunked JSON lines from `resourceVersion` on, ending after `timeoutSeconds`. One resourceVersion
counter for everything, as etcd has. A discovery document is an object put at its path
(`/apis/resource.k8s.io`).

Tests drive it from the Python side: `put(path, obj)`, `patch_labels(path, labels)`, `delete(path)`,
`collect_garbage()` (Kubernetes' garbage collector: objects none of whose owners exist are deleted);
`fail(status, count, method=None, path_prefix=None)` answers the next requests with an error Status
(500, 410, ...); `expire()` forgets the event history, so a watch resuming from an older version
gets an ERROR event with code 410 (the server's "too old resource version"); `end_watches()` closes
open watch streams (a dropped connection). POST creates an object in the collection (Events) and
records it in `created` (`events(kind, name)`: the Events recorded about one Node or Pod; 409 when
its name is taken; `dryRun=All`: answered, not stored); PUT replaces an object (409 when the body's
metadata.resourceVersion is not the stored one); PATCH merges a JSON merge patch into one (a watched
MODIFIED), refused with 409 Conflict when it names a `metadata.resourceVersion` the object is no
longer at, or a strategic merge patch (`status.conditions` merged by `type`, as the API server does
for Nodes); a PATCH of `<object>/status` changes only the object's `status`; DELETE removes one.
`requests` logs (method, path, query) of every request. `drop_device_taints = True` drops the
`taints` of ResourceSlice devices on writes, as a server without the DRADeviceTaints feature does
(`drop_consumable_capacity = True`: `allowMultipleAllocations` and `requestPolicy`, DRAConsumableCapacity).
`foreground_deletes = True` answers a DELETE whose body asks `propagationPolicy: Foreground` by
marking the object (`metadata.deletionTimestamp`) and keeping it, as the server does while the
garbage collector deletes its dependents; the test `delete`s it when they are gone.

Faults of the connection, as real servers and networks produce them: `late_bodies = seconds` sends
every answer's headers first and its body (a stream: its final chunk) that much later, on a
keep-alive connection (a client that hands the connection back without reading the body then reads
it as the next answer's status line); `gone_every_watch = True` answers every watch with an
in-stream ERROR 410 event; `stall_watches = True` answers new watches with their headers and then
nothing (a half-open connection), until `end_watches()`; `end_every_watch = True` answers every
watch with its headers and the stream's end at once (a proxy that cuts streams); `ignore_name_selector
= True` lists and watches every object of a collection whatever `metadata.name` the field selector
names (a proxy that drops it); `inject(collection, event)` sends `event` as is (any JSON value; bytes:
the line itself, no JSON) to the watches of `collection`, in order with the stored changes.
"""

from testkit.kube_api_standin.patches import MERGE_KEYS, merge_patch, strategic_merge_patch
from testkit.kube_api_standin.server import KubeApiStandin

__all__ = ["MERGE_KEYS", "KubeApiStandin", "merge_patch", "strategic_merge_patch"]
