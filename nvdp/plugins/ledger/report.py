"""The /allocations document as one screen of text (pure): what `nvdp status` prints and `nvdp
simulate` shows after its Allocate.

- Each resource gets a line of counts; each held or not Healthy device a line (holder: pod
  container or DRA claim; why Unhealthy; its share); the free Healthy rest are only counted.
- Without pod detail (--pod-detail), a held device shows how many containers hold it.
- A document from another nvdp version shows what it lacks as unknown, never a traceback.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nvdp.base.units import format_go_duration
from nvdp.plugins.ledger.document import WITHHELD

_HEADER = f"  {'DEVICE':<47} {'INDEX':<6} {'HEALTH':<10} HELD BY\n"


def describe_allocations(document: Mapping[str, Any]) -> str:
    """The text of one /allocations document."""
    out = [_source_line(document)]
    resources = document.get("resources")
    if not isinstance(resources, Mapping) or not resources:
        out.append("  no resources served\n")
        return "".join(out)
    for name, devices in sorted(resources.items()):
        entries = [d for d in devices if isinstance(d, Mapping)] if isinstance(devices, list) else []
        out.append(_resource(str(name), entries))
    return "".join(out)


def _source_line(document: Mapping[str, Any]) -> str:
    source, problem, age = document.get("source"), document.get("problem"), document.get("ageSeconds")
    where = f"kubelet PodResources at {source}" if source else "kubelet PodResources"
    if document.get("readAt") is None:
        read = "not read yet"
    else:
        read = f"read {format_go_duration(round(float(age)))} ago" if isinstance(age, int | float) else "read"
    line = f"Allocations ({where}, {read})\n"
    if problem:
        line += f"  last read failed: {problem}\n"
    if document.get("podDetail") == WITHHELD:
        line += "  pods withheld: the plugin names them to clients on its loopback only (--pod-detail)\n"
    return line


def _resource(name: str, devices: list[Mapping[str, Any]]) -> str:
    held = [d for d in devices if _is_held(d)]
    unhealthy = [d for d in devices if d.get("health") != "Healthy"]
    free = len(devices) - len([d for d in devices if _is_held(d) or d.get("health") != "Healthy"])
    noun = "device" if len(devices) == 1 else "devices"
    counts = f"{len(devices)} {noun}: {len(held)} held, {len(unhealthy)} not healthy, {free} free"
    lines = [f"\n{name}  {counts}\n"]
    shown = [d for d in devices if _is_held(d) or d.get("health") != "Healthy"]
    if shown:
        lines.append(_HEADER)
    for device in shown:
        holders = _holders(device)
        index = device.get("index") or "?"
        lines.append(
            f"  {device.get('device', '?'):<47} {index:<6} {device.get('health', '?'):<10} {holders}\n"
        )
        if device.get("reason"):
            lines.append(f"  {'':<47} {'':<6} why: {device['reason']}\n")
        if device.get("share"):
            lines.append(f"  {'':<47} {'':<6} share: {device['share']}\n")
    return "".join(lines)


def _is_held(device: Mapping[str, Any]) -> bool:
    holders = device.get("holders")
    return bool(device.get("pods") or device.get("claims")) or (isinstance(holders, int) and holders > 0)


def _holders(device: Mapping[str, Any]) -> str:
    """The containers holding `device`: named, or counted where the pods are withheld."""
    pods = device.get("pods")
    if pods and isinstance(pods, list):
        return ", ".join(_pod(p) for p in pods if isinstance(p, Mapping)) or "-"
    claims = device.get("claims")
    if claims and isinstance(claims, list):  # a DRA claim whose pods are not known (yet)
        return ", ".join(
            f"claim {c.get('namespace', '?')}/{c.get('name', '?')}" for c in claims if isinstance(c, Mapping)
        )
    count = device.get("holders")
    if isinstance(count, int) and count > 0:
        return f"{count} container{'' if count == 1 else 's'} (pods withheld)"
    return "-"


def _pod(pod: Mapping[str, Any]) -> str:
    held = f"claim {pod['claim']}" if pod.get("claim") else pod.get("container", "?")  # DRA's: a claim
    return f"{pod.get('namespace', '?')}/{pod.get('name', '?')} ({held})"
