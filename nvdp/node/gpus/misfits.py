"""Node facts that keep part of the config from applying on this node: reported, never fatal.

- nvdp is strict about the config's form (`nvdp.config` refuses it) and tolerant about the node's
  facts: one ConfigMap serves a whole fleet, so what a node *is* never stops a process.
- Misfits: a sharing entry for a resource the node lacks, a MIG-enabled GPU between layouts, a
  missing device node, a GPU whose queries fail, an MPS control daemon that is not up.
- Each is a `Misfit`, returned beside what it could build by the pure code that builds what the
  node serves (resources, CDI specs, MPS readiness); the rest of the node is served.
- `nvdp.node.gpus.misfit_report` reports them: a WARNING line, a Node event, a metric, readiness.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Misfit:
    """One node fact that keeps part of the config from applying here.

    `reason` is CamelCase from a small fixed set (the Node event's reason and the metric's label);
    `subject` names what it is about (`sharing.timeSlicing.resources[0]`, `GPU 3`, `/dev/nvidia3`);
    `message` is the one line an operator reads, saying what was done instead; `withholds` are the
    resources the config asks for that are left with no device because of it.
    """

    reason: str
    subject: str
    message: str
    withholds: tuple[str, ...] = ()
