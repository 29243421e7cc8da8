"""What the GPU ran at while a bench row was timed: SM clock, power, temperature and NVML's clock-event
(throttle) reasons, sampled in a background thread through the driver's NVML library (ctypes; no extra
dependency). These fields say whether a row's time moved with the clock. The samples include one just
before and one just after the timed calls. The thread wakes every SAMPLE_INTERVAL_S and holds the GIL only
for its ctypes calls (which release it); an on/off A/B (scripts/sampler_ab.py, RESULTS.md sixth run) found
no effect on the timed calls.

Without NVML (no NVIDIA driver, e.g. CI) ``GpuSampler.fields`` returns the keys with None values.
"""

from __future__ import annotations

import ctypes
import statistics
import threading
from typing import Optional

SAMPLE_INTERVAL_S = 0.005
# power_w_max: the largest of NVML's power readings during the row; on Hopper each reading is NVML's
# average over about the last second, so it lags short bursts (it is not an instantaneous peak)
FIELDS = ("sm_clock_mhz_min", "sm_clock_mhz_median", "sm_clock_mhz_max", "power_w_max", "temp_c_max",
          "clock_event_reasons")

# nvmlClocksEventReasons bits (nvml.h); "GpuIdle" is left out: between calls the GPU idles by design
CLOCK_EVENT_REASONS = {
    0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x10: "sync_boost",
    0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
_NVML_CLOCK_SM = 1
_NVML_TEMPERATURE_GPU = 0


def decode_reasons(mask: int) -> str:
    """The names of the set clock-event bits, comma-separated ("" when none but idle)."""
    return ",".join(name for bit, name in CLOCK_EVENT_REASONS.items() if mask & bit)


class _Nvml:
    """The few NVML calls the sampler makes, on one device handle. Every function is looked up here, so a
    driver without one fails now (and the sampler then records nothing) rather than in the middle of a row."""

    def __init__(self, uuid: Optional[str], index: int, visible_devices: int):   # uuid as device_uuid gives it
        lib = ctypes.CDLL("libnvidia-ml.so.1")
        handle_type = ctypes.c_void_p
        for name in ("nvmlInit_v2", "nvmlDeviceGetHandleByUUID", "nvmlDeviceGetHandleByIndex_v2",
                     "nvmlDeviceGetClockInfo", "nvmlDeviceGetPowerUsage", "nvmlDeviceGetTemperature"):
            getattr(lib, name).restype = ctypes.c_int
        lib.nvmlDeviceGetHandleByUUID.argtypes = [ctypes.c_char_p, ctypes.POINTER(handle_type)]
        lib.nvmlDeviceGetHandleByIndex_v2.argtypes = [ctypes.c_uint, ctypes.POINTER(handle_type)]
        lib.nvmlDeviceGetClockInfo.argtypes = [handle_type, ctypes.c_int, ctypes.POINTER(ctypes.c_uint)]
        lib.nvmlDeviceGetPowerUsage.argtypes = [handle_type, ctypes.POINTER(ctypes.c_uint)]
        lib.nvmlDeviceGetTemperature.argtypes = [handle_type, ctypes.c_int, ctypes.POINTER(ctypes.c_uint)]
        # the clock-event reasons: the current name (driver 535+), else the deprecated one it replaced
        self.reasons_fn = getattr(lib, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            lib.nvmlDeviceGetCurrentClocksThrottleReasons
        self.reasons_fn.restype = ctypes.c_int
        self.reasons_fn.argtypes = [handle_type, ctypes.POINTER(ctypes.c_ulonglong)]
        if lib.nvmlInit_v2() != 0:
            raise OSError("nvmlInit_v2 failed")
        self.lib = lib
        self.handle = handle_type()
        if uuid:   # torch's index need not be NVML's (CUDA_VISIBLE_DEVICES); the UUID names the same device
            if lib.nvmlDeviceGetHandleByUUID(uuid.encode(), ctypes.byref(self.handle)) != 0:
                raise OSError("no NVML device with torch's UUID")
        elif visible_devices != 1 or lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(self.handle)) != 0:
            raise OSError("no UUID from torch, and more than one device: which NVML device is ours is unknown")

    def sample(self) -> tuple[Optional[int], Optional[float], Optional[int], int]:
        """(SM clock MHz, power W, temperature C, clock-event reason bits); None where a call failed."""
        clock, milliwatts, temp = ctypes.c_uint(), ctypes.c_uint(), ctypes.c_uint()
        reasons = ctypes.c_ulonglong()
        ok_clock = self.lib.nvmlDeviceGetClockInfo(self.handle, _NVML_CLOCK_SM, ctypes.byref(clock)) == 0
        ok_power = self.lib.nvmlDeviceGetPowerUsage(self.handle, ctypes.byref(milliwatts)) == 0
        ok_temp = self.lib.nvmlDeviceGetTemperature(self.handle, _NVML_TEMPERATURE_GPU, ctypes.byref(temp)) == 0
        ok_reasons = self.reasons_fn(self.handle, ctypes.byref(reasons)) == 0
        return (clock.value if ok_clock else None, milliwatts.value / 1000 if ok_power else None,
                temp.value if ok_temp else None, reasons.value if ok_reasons else 0)


def device_uuid(device_index: int) -> Optional[str]:
    """torch's device as NVML and nvidia-smi name it ("GPU-<uuid>"), or None where torch gives no UUID."""
    import torch
    uuid = getattr(torch.cuda.get_device_properties(device_index), "uuid", None)
    return f"GPU-{uuid}" if uuid else None


_nvml_cache: dict[int, Optional[_Nvml]] = {}


def _nvml_for(device_index: int) -> Optional[_Nvml]:
    if device_index not in _nvml_cache:
        try:
            import torch
            _nvml_cache[device_index] = _Nvml(device_uuid(device_index), device_index, torch.cuda.device_count())
        except Exception:  # no driver library, no such function or device, no CUDA torch: no telemetry
            _nvml_cache[device_index] = None
    return _nvml_cache[device_index]


class GpuSampler:
    """``with GpuSampler(index) as s: ...`` samples the GPU every SAMPLE_INTERVAL_S (and once at each end);
    ``s.fields()`` summarises the samples under the FIELDS keys."""

    def __init__(self, device_index: Optional[int]):
        self.nvml = _nvml_for(device_index) if device_index is not None else None
        self.samples: list[tuple] = []
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def _sample(self) -> None:
        try:
            self.samples.append(self.nvml.sample())
        except Exception:  # telemetry must never cost a measurement: a failed read is a missing sample
            pass

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_INTERVAL_S):
            self._sample()

    def __enter__(self) -> "GpuSampler":
        if self.nvml is not None:
            self._sample()
            self._thread = threading.Thread(target=self._run, name="convforge-gpu-sampler", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=1.0)
            self._sample()

    def fields(self) -> dict:
        clocks = [s[0] for s in self.samples if s[0] is not None]
        powers = [s[1] for s in self.samples if s[1] is not None]
        temps = [s[2] for s in self.samples if s[2] is not None]
        mask = 0
        for s in self.samples:
            mask |= s[3]
        if not self.samples:
            return dict.fromkeys(FIELDS)
        return {"sm_clock_mhz_min": min(clocks, default=None),
                "sm_clock_mhz_median": statistics.median_low(clocks) if clocks else None,
                "sm_clock_mhz_max": max(clocks, default=None), "power_w_max": max(powers, default=None),
                "temp_c_max": max(temps, default=None), "clock_event_reasons": decode_reasons(mask)}
