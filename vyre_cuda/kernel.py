"""Kernel code: CUDA C++ for NVRTC or PTX text for the driver, immutable, keyed by its digest."""

from __future__ import annotations

import dataclasses
import hashlib

from ._interned import Interned, remembered_constructor
from .errors import InvalidProgram

__all__ = ["Kernel"]


def _text(value, what: str) -> str:
    """``value`` as str that NVRTC or the driver can take as a C string, or InvalidProgram."""
    if isinstance(value, (bytes, bytearray)):
        try:
            value = bytes(value).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidProgram(
                f"{what} is not UTF-8 text: byte 0x{exc.object[exc.start]:02x} at offset {exc.start} cannot be decoded",
                "pass the text as a str, or bytes in UTF-8 (decode other encodings first)",
            ) from None
    if not isinstance(value, str):
        raise InvalidProgram(f"{what} must be text (got {type(value).__name__})", "pass it as a str")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidProgram(
            f"{what} holds an unpaired surrogate U+{ord(exc.object[exc.start]):04X} at index "
            f"{exc.start}, which has no UTF-8 encoding",
            "remove it (unpaired surrogates come from decoding with errors='surrogateescape' "
            "or from splitting a surrogate pair)",
        ) from None
    if "\0" in value:
        # NVRTC and the driver read C strings: everything after a NUL would be dropped silently
        raise InvalidProgram(
            f"{what} contains a NUL character at index {value.index(chr(0))}",
            "remove the NUL character(s)",
        )
    return value


def _options(options) -> tuple:
    if options is None:
        return ()
    if isinstance(options, (str, bytes, bytearray)):
        options = (options,)  # one option, not one per character
    try:
        items = list(options)
    except TypeError:
        raise InvalidProgram(
            f"kernel options must be a sequence of strings (got {type(options).__name__})",
            "pass options=('-lineinfo', ...), a single option string, or None",
        ) from None
    return tuple(_text(o, f"kernel option {i}") for i, o in enumerate(items))


class Kernel(metaclass=Interned):
    """Kernel code: CUDA C++ for NVRTC (:meth:`cuda`) or PTX text (:meth:`ptx`). Immutable.

    Use the factories, not ``Kernel(...)``. Kernels with the same kind, entry, options and source
    are equal; one built again from the same arguments is the one built first.

    Examples
    --------
    >>> k = Kernel.cuda('VYRE_KERNEL vyre_main() {}', options=None)
    >>> k.kind, k.entry, k.options, len(k.digest)
    ('cuda', 'vyre_main', (), 64)
    """

    # a dict: its values are the attributes' docstrings
    __slots__ = {
        "kind": '``"cuda"`` (CUDA C++ for NVRTC) or ``"ptx"`` (PTX text for the driver).',
        "source": "The kernel's text, as given (a PTX image without its trailing NULs).",
        "entry": 'The ``extern "C" __global__`` function to launch.',
        "options": "NVRTC options, a tuple of strings (empty for PTX).",
        "_digest": "SHA-256 over kind, entry, options and source (:attr:`digest`).",
    }

    _interned_limit = 1024  # kernels remembered for a rebuild (a program may generate sources)

    kind: str
    source: str
    entry: str
    options: tuple
    _digest: str

    def __init__(self, kind, source, entry, options=()):
        # (built again from the same arguments, the first build is returned: _interned)
        if kind not in ("cuda", "ptx"):
            raise InvalidProgram(
                f"Kernel kind must be 'cuda' or 'ptx' (got {kind!r})",
                "build kernels with Kernel.cuda(source) or Kernel.ptx(text)",
            )
        if kind == "ptx" and isinstance(source, (bytes, bytearray)):
            source = bytes(source).rstrip(b"\0")  # a NUL-terminated image is fine
        elif kind == "ptx" and isinstance(source, str):
            source = source.rstrip("\0")
        if source is None or not isinstance(source, (str, bytes, bytearray)):
            raise InvalidProgram(
                f"{kind} kernel source must be non-empty text (got {type(source).__name__})",
                "pass the kernel source as a str",
            )
        source = _text(source, f"{kind} kernel source")
        if not source.strip():
            raise InvalidProgram(
                f"{kind} kernel source must be non-empty text (got {len(source)} blank characters)",
                "pass the kernel source as a str",
            )
        if not isinstance(entry, str) or not entry.isascii() or not entry.isidentifier():
            raise InvalidProgram(
                f"kernel entry must be an ASCII identifier (got {entry!r})",
                "pass entry='name_of_the_extern_C_global_function'",
            )
        options = _options(options)
        h = hashlib.sha256()
        for part in (kind, entry, *options, source):
            raw = part.encode()
            h.update(len(raw).to_bytes(8, "little"))  # length-prefixed: no two part lists collide
            h.update(raw)
        # every field is final before the digest is taken from it, and none can change after
        for name, value in zip(self.__slots__, (kind, source, entry, options, h.hexdigest())):
            object.__setattr__(self, name, value)

    def __setattr__(self, name, value):
        raise dataclasses.FrozenInstanceError(
            f"cannot assign to Kernel.{name}: kernels are immutable (their digest keys the "
            "compile caches); build a new one with Kernel.cuda(...) or Kernel.ptx(...)"
        )

    def __delattr__(self, name):
        raise dataclasses.FrozenInstanceError(f"cannot delete Kernel.{name}: kernels are immutable")

    def __reduce__(self):
        return (Kernel, (self.kind, self.source, self.entry, self.options))

    def __eq__(self, other):
        if not isinstance(other, Kernel):
            return NotImplemented
        return self._digest == other._digest

    def __hash__(self):
        return hash(self._digest)

    @classmethod
    def cuda(cls, source: str | bytes, entry: str = "vyre_main", options=()) -> Kernel:
        """CUDA C++ compiled by NVRTC. The entry must be ``extern "C" __global__``.

        C++ forbids a ``__global__`` function named ``main``, so the default entry of CUDA
        kernels is ``vyre_main`` (the header's ``VYRE_KERNEL`` macro declares it). ``options``
        is None, one option string, or a sequence of them.
        """
        return cls("cuda", source, entry, options)

    @classmethod
    def ptx(cls, text: str | bytes, entry: str = "main") -> Kernel:
        """PTX text loaded (and JIT-compiled) by the driver."""
        return cls("ptx", text, entry)

    @property
    def digest(self) -> str:
        """SHA-256 over kind, entry, options and source."""
        return self._digest

    def __repr__(self) -> str:
        return f"Kernel.{self.kind}(<{len(self.source)} chars>, entry={self.entry!r})"


def remember_constructors(cls, names) -> None:
    """Make the classmethods ``names`` of the interned ``cls`` remember their plain-argument calls."""
    for name in names:
        setattr(cls, name, remembered_constructor(cls.__dict__[name].__func__, cls))


remember_constructors(Kernel, ("cuda", "ptx"))
