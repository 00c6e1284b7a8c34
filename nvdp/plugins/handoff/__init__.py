"""One GPU, one API: the hand-over of a node's GPUs between the device plugin and the DRA driver, so
that no GPU is ever advertised by both.

- `rule`: what a record says and what an API may serve given the other's (pure).
- `records`: the records and locks both processes keep in the DRA driver's directory, failing closed.
- `proofs`: a stopped side's holds, once its record and lock are gone, from what the other can prove.
"""

from nvdp.plugins.handoff.records import LOST_GRACE_S, MAX_RECORD_BYTES, SWITCH_GRACE_S, Handoff
from nvdp.plugins.handoff.rule import (
    API_WORDS,
    DEVICE_PLUGIN,
    DRA,
    UNKNOWN_HOLDER,
    Record,
    Settled,
    device_plugin_record_dir,
    settle,
)

__all__ = [
    "API_WORDS",
    "DEVICE_PLUGIN",
    "DRA",
    "LOST_GRACE_S",
    "MAX_RECORD_BYTES",
    "SWITCH_GRACE_S",
    "UNKNOWN_HOLDER",
    "Handoff",
    "Record",
    "Settled",
    "device_plugin_record_dir",
    "settle",
]
