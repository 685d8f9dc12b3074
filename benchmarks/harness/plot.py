"""The benchmark record's figure: the profile's (:func:`vyre_cuda.profile.plot.plot_report`) with
every peer beside the floors, and a panel of the peers on their own device arrays against vyre_cuda
on the same arrays."""

from __future__ import annotations

from vyre_cuda.profile.plot import plot_report

__all__ = ["PEER_STYLES", "plot_bench", "peer_style"]

PEER_STYLES = {  # name -> label, colour, marker (a peer not listed here takes one of _SPARE)
    "cuda_bindings": ("cuda.bindings", "#9467bd", "D"),
    "cupy": ("CuPy", "#1f77b4", "^"),
    "torch": ("PyTorch", "#2ca02c", "P"),
    "cuda_core": ("cuda.core", "#8c564b", "X"),
}
_SPARE = (("#17becf", "h"), ("#bcbd22", "*"), ("#e377c2", "p"))
# the peer's device-resident row is compared with vyre_cuda's row on the same library's arrays
_DEVICE_VYRE = {"torch": ("vyre.device.torch", "vyre.device")}
_DEVICE_VYRE_DEFAULT = ("vyre.device", "vyre.device.torch")


def _keys(sizes, pattern):
    """``(peer name, key)`` of the series that match ``pattern`` (``peer.{}``), in run order."""
    found = {k for s in sizes for k in s.systems}
    names = list(PEER_STYLES) + sorted({k.split(".")[1] for k in found if k.startswith("peer.")})
    return [(name, pattern.format(name)) for name in dict.fromkeys(names) if pattern.format(name) in found]


def peer_style(name):
    """The line style of peer ``name``, the same in every panel."""
    color, marker = _SPARE[sum(map(ord, name)) % len(_SPARE)]
    label, color, marker = PEER_STYLES.get(name, (name, color, marker))
    return {"label": label, "color": color, "marker": marker, "linestyle": "-"}


def plot_bench(report, path):
    """Save the record's figure to ``path``; returns the matplotlib ``Figure`` (axes labelled
    ``headline``, ``device``, ``stages`` and ``bandwidth``)."""
    sizes = sorted(report.sizes, key=lambda s: s.nbytes)
    host = [(peer_style(name), key) for name, key in _keys(sizes, "peer.{}")]
    device = [
        (peer_style(name), key, _DEVICE_VYRE.get(name, _DEVICE_VYRE_DEFAULT))
        for name, key in _keys(sizes, "peer.{}.device")
    ]
    return plot_report(report, path, host, device)
