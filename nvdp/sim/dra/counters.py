"""Partitionable devices for the stand-in scheduler (pure): a pool's shared counters (KEP-4815,
resource.k8s.io/v1 `sharedCounters`) and what each device consumes of them (`consumesCounters`), as
the scheduler accounts them: a device is allocatable only while every counter it consumes has that
much left after the devices already allocated; allocating it takes that much. So two MIG placements
that share a memory slice are never both allocated. A device naming a counter set or counter the pool
does not publish is never allocatable (the scheduler treats it so)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from fractions import Fraction
from typing import Any

Obj = Mapping[str, Any]
DeviceKey = tuple[str, str, str]  # (driver, pool, device)
SetKey = tuple[str, str, str]  # (driver, pool, counter set)

_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?$")
_SUFFIX = {
    None: Fraction(1), "m": Fraction(1, 1000), "k": Fraction(10**3), "M": Fraction(10**6),
    "G": Fraction(10**9), "T": Fraction(10**12), "P": Fraction(10**15), "E": Fraction(10**18),
    "Ki": Fraction(2**10), "Mi": Fraction(2**20), "Gi": Fraction(2**30), "Ti": Fraction(2**40),
    "Pi": Fraction(2**50), "Ei": Fraction(2**60),
}  # fmt: skip


def quantity(text: object) -> Fraction:
    """A Kubernetes quantity ("40Gi", "4864Mi", "14", "500m") as an exact number; ValueError else."""
    m = _QUANTITY.match(str(text))
    if m is None:
        raise ValueError(f"{text!r} is not a quantity")
    return Fraction(m[1]) * _SUFFIX[m[2]]


class Counters:
    """The pool's counters left, given the devices allocated already (`taken`)."""

    def __init__(self, slices: Sequence[Obj], taken: Iterable[DeviceKey] = ()) -> None:
        self._left: dict[SetKey, dict[str, Fraction]] = {}
        self._consumes: dict[DeviceKey, list[tuple[SetKey, dict[str, Fraction]]]] = {}
        for s in slices:
            spec = s.get("spec") or {}
            driver, pool = spec.get("driver", ""), (spec.get("pool") or {}).get("name", "")
            for counter_set in spec.get("sharedCounters") or []:
                counters = counter_set.get("counters") or {}
                left = {name: quantity(c.get("value")) for name, c in counters.items()}
                self._left[(driver, pool, counter_set["name"])] = left
            for device in spec.get("devices") or []:
                consumes = [
                    (
                        (driver, pool, c["counterSet"]),
                        {name: quantity(v.get("value")) for name, v in (c.get("counters") or {}).items()},
                    )
                    for c in device.get("consumesCounters") or []
                ]
                if consumes:
                    self._consumes[(driver, pool, device["name"])] = consumes
        for key in taken:
            self.take(key)

    def fits(self, key: DeviceKey) -> bool:
        """Whether the device's consumption fits what is left (a device consuming nothing: always)."""
        for set_key, wanted in self._consumes.get(key, ()):
            left = self._left.get(set_key)
            if left is None or any(name not in left or left[name] < n for name, n in wanted.items()):
                return False
        return True

    def take(self, key: DeviceKey) -> None:
        for set_key, wanted in self._consumes.get(key, ()):
            left = self._left.setdefault(set_key, {})
            for name, n in wanted.items():
                left[name] = left.get(name, Fraction(0)) - n
