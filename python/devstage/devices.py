# SPDX-License-Identifier: Apache-2.0
"""One backend and one stager per device of a host: `stagers = devstage.stagers(devices=8)`.

Each device gets a backend of its own (`cuda(d)`, `ascend(d)`, or a simulated device; the
simulated devices share one simulated host, so pinned memory of any of them is pinned for all)
and a Stager over it. A stager is one thread's at a time: drive the devices from one thread in
turn, or give each thread its device's stager. Give each stager only its own device's streams
(another device's is refused, naming both)."""
from .backend import Backend
from .errors import InvalidArgument
from .stager import Stager

_KINDS = ("sim", "cuda", "ascend")


def _device_ids(devices):
    if isinstance(devices, bool) or not isinstance(devices, int) and not hasattr(devices, "__iter__"):
        raise TypeError(f"devstage devices: devices is a {type(devices).__name__}; give a count or device numbers")
    ids = list(range(devices)) if isinstance(devices, int) else list(devices)
    bad = [d for d in ids if isinstance(d, bool) or not isinstance(d, int) or d < 0]
    problems = []
    if isinstance(devices, int) and devices <= 0:
        problems.append(f"a count of {devices} devices (at least 1)")
    if bad:
        problems.append(f"device numbers {bad!r} (each an int >= 0)")
    if len(set(ids)) != len(ids):
        problems.append(f"device numbers repeated in {ids!r}")
    if not ids and not problems:
        problems.append("no devices")
    if problems:
        raise InvalidArgument("invalid_argument", "devstage devices: " + "; ".join(problems))
    return ids


def backends(devices, kind="sim", library_path=None, device_capacity=0):
    """One Backend per device: `devices` a count (devices 0..n-1) or device numbers; `kind` "sim"
    (the devices of one simulated host), "cuda" or "ascend" (library_path as for
    devstage.cuda / devstage.ascend). If one cannot be made, those made are closed and the error
    is raised."""
    if kind not in _KINDS:
        raise InvalidArgument("invalid_argument", f"devstage devices: kind {kind!r} (one of {', '.join(_KINDS)})")
    ids = _device_ids(devices)
    made = []
    try:
        for device in ids:
            if kind == "sim":
                made.append(Backend.simulator(device_capacity, device, made[0] if made else None))
            elif kind == "cuda":
                made.append(Backend.cuda(device, library_path))
            else:
                made.append(Backend.ascend(device, library_path))
    except BaseException:
        for backend in reversed(made):
            backend.close()
        raise
    return made


def stagers(devices, kind="sim", library_path=None, device_capacity=0, **config):
    """One Stager per device, over backends(devices, kind, library_path, device_capacity), each
    with the Stager keywords in `config` (pack_limit, pipeline_slots, ...). A configuration error
    is raised before any backend is made. `stagers[d].backend` is device d's backend."""
    made = backends(devices, kind, library_path, device_capacity)
    result = []
    try:
        for backend in made:
            result.append(Stager(backend, **config))
    except BaseException:
        result.clear()  # the stagers go first: each keeps its backend
        for backend in reversed(made):
            backend.close()
        raise
    return result
