"""The thermal and power guard (``--max-temp``, ``--max-power``): a device above either
limit takes no new job until it is back under the limit by a hysteresis margin, so that
admission does not flap around the limit. Pure: fed readings, it says which devices are
held and why."""

from __future__ import annotations

from dataclasses import dataclass

from gq import defaults
from gq.messages import DeviceReading


@dataclass(frozen=True)
class Limits:
    max_temp: float | None = None  # degrees Celsius
    max_power: float | None = None  # watts

    @property
    def any(self) -> bool:
        return self.max_temp is not None or self.max_power is not None


class Guard:
    def __init__(self, limits: Limits):
        self.limits = limits
        self.held: dict[str, str] = {}  # device -> why it admits nothing now

    def update(self, device: str, reading: DeviceReading) -> bool:
        """Take a new reading; True if the device's state (held or not) changed."""
        was_held = device in self.held
        why = self._over(device, reading, margin=was_held)
        if why is None:
            self.held.pop(device, None)
        else:
            self.held[device] = why
        return was_held != (why is not None)

    def _over(self, device: str, reading: DeviceReading, margin: bool) -> str | None:
        """Why the device must not take jobs: above a limit, or (``margin``: held already)
        not yet under it by the hysteresis."""
        limits = self.limits
        if limits.max_temp is not None and reading.temperature is not None:
            resume = limits.max_temp - defaults.TEMP_HYSTERESIS
            if reading.temperature > (resume if margin else limits.max_temp):
                return (
                    f"{device} too hot: {reading.temperature:g} C (--max-temp "
                    f"{limits.max_temp:g}); admits again at {resume:g} C"
                )
        if limits.max_power is not None and reading.power is not None:
            resume = limits.max_power * (1 - defaults.POWER_HYSTERESIS)
            if reading.power > (resume if margin else limits.max_power):
                return (
                    f"{device} over its power limit: {reading.power:g} W (--max-power "
                    f"{limits.max_power:g}); admits again at {resume:g} W"
                )
        return None
