"""The program model and the dispatch options: roles, dtypes, declarations, validation, kernels."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import pickle
import subprocess
import sys
import weakref

import fakes
import numpy as np
import pytest

import vyre_cuda
from vyre_cuda.config import MAX_FIXPOINT_ITERATIONS, MAX_TIMEOUT_S, DispatchConfig, as_config
from vyre_cuda.errors import InvalidProgram, ValidationError
from vyre_cuda.planning.binding import input_spec
from vyre_cuda.program import (
    DTYPES,
    BindingRole,
    BufferAccess,
    BufferDecl,
    Kernel,
    Program,
    dtype_of,
)

# the folder holding the vyre_cuda under test, for child interpreters
_PACKAGE_ROOT = str(pathlib.Path(vyre_cuda.__file__).resolve().parents[1])

A = BufferAccess
R = BindingRole
KERNEL = Kernel.cuda('#include "vyre_cuda.cuh"\nVYRE_KERNEL vyre_main(const vyre_u32* p) {}\n')


def assert_fix(err: BaseException) -> None:
    """The message is the contract: it ends with a non-empty ``Fix: ...`` line."""
    last = str(err).splitlines()[-1]
    assert last.startswith("Fix: ") and last[5:].strip(), str(err)


def raises(exc_type, fn, *args, **kwargs):
    with pytest.raises(exc_type) as info:
        fn(*args, **kwargs)
    assert_fix(info.value)
    return info.value


def program(*buffers, **kw) -> Program:
    return Program(KERNEL, list(buffers) or [BufferDecl.read("a", 0, "u32")], **kw)


# ---------------------------------------------------------------- role table
@pytest.mark.parametrize(
    ("access", "output", "persistent", "role"),
    [
        # first match wins: workgroup beats persistent and the output flag
        (A.WORKGROUP, False, False, R.SHARED),
        (A.WORKGROUP, True, True, R.SHARED),
        # persistent beats the output flag and the access kind
        (A.READ_ONLY, False, True, R.PERSISTENT),
        (A.READ_WRITE, True, True, R.PERSISTENT),
        # the output flag beats the access kind
        (A.READ_ONLY, True, False, R.OUTPUT),
        (A.UNIFORM, True, False, R.OUTPUT),
        (A.READ_WRITE, True, False, R.OUTPUT),
        (A.WRITE_ONLY, True, False, R.OUTPUT),
        # then the access kind alone
        (A.READ_ONLY, False, False, R.INPUT),
        (A.UNIFORM, False, False, R.INPUT),
        (A.READ_WRITE, False, False, R.INPUT_OUTPUT),
        (A.WRITE_ONLY, False, False, R.OUTPUT),
    ],
)
def test_role_table_first_match_wins(access, output, persistent, role):
    decl = BufferDecl("b", 0, access, "f32", count=4, output=output, persistent=persistent)
    assert decl.role is role


@pytest.mark.parametrize(
    ("factory", "access", "role"),
    [
        (BufferDecl.read, A.READ_ONLY, R.INPUT),
        (BufferDecl.uniform, A.UNIFORM, R.INPUT),
        (BufferDecl.read_write, A.READ_WRITE, R.INPUT_OUTPUT),
        (BufferDecl.output, A.READ_WRITE, R.OUTPUT),
        (BufferDecl.write_only, A.WRITE_ONLY, R.OUTPUT),
        (BufferDecl.workgroup, A.WORKGROUP, R.SHARED),
    ],
)
def test_constructors(factory, access, role):
    decl = factory("b", 3, "i16", 8)
    assert (decl.name, decl.binding, decl.access, decl.dtype, decl.count) == ("b", 3, access, DTYPES["i16"], 8)
    assert decl.role is role
    assert decl.output is (factory == BufferDecl.output)
    assert decl.static_byte_len == 16


def test_output_is_both_a_flag_and_a_constructor():
    assert BufferDecl.read("a", 0, "u8").output is False
    assert BufferDecl.output("o", 0, "u8").output is True
    assert BufferDecl.output("o", 0, "u8", output_byte_range=(0, 0)).output_byte_range == (0, 0)


def test_the_output_flag_field_is_is_output():
    # the field no longer shares its name with the BufferDecl.output constructor
    assert [f.name for f in dataclasses.fields(BufferDecl)][5] == "is_output"
    decl = BufferDecl("o", 0, A.READ_WRITE, "f32", 4, output=True)
    assert decl.is_output is True and decl.output is True and decl.role is R.OUTPUT
    assert BufferDecl("o", 0, A.READ_WRITE, "f32", 4, True).is_output is True  # positional
    assert BufferDecl("o", 0, A.READ_WRITE, "f32", is_output=True).role is R.OUTPUT
    # dataclasses.replace passes the field name: it must keep the flag
    assert dataclasses.replace(decl, count=8) == BufferDecl.output("o", 0, "f32", 8)
    assert dataclasses.replace(BufferDecl.read("a", 0, "u8"), count=3).is_output is False
    assert dataclasses.replace(BufferDecl.read_write("a", 0, "u8"), is_output=True).role is R.OUTPUT
    raises(InvalidProgram, dataclasses.replace, BufferDecl.read_write("a", 0, "u8"), output=True)  # never ignored
    assert callable(BufferDecl.output) and BufferDecl.output.__doc__


@pytest.mark.parametrize("kw", [{"output": "yes"}, {"output": 1}, {"persistent": "no"}, {"persistent": None}])
def test_declaration_flags_must_be_bools(kw):
    err = raises(InvalidProgram, BufferDecl, "b", 0, A.READ_WRITE, "u32", 4, **kw)
    assert repr(next(iter(kw.values()))) in err.message


@pytest.mark.parametrize(("dtype", "rng"), [("f32", (2, 10)), ("f32", (0, 6)), ("u16", (1, 3)), ("f64", (8, 12))])
def test_byte_range_cutting_elements_is_refused(dtype, rng):
    # (2, 10) on f32 used to come back as two floats built from the bytes of three elements
    err = raises(InvalidProgram, BufferDecl.output, "o", 0, dtype, 16, output_byte_range=rng)
    assert str(rng) in err.message and "multiples" in err.message


@pytest.mark.parametrize(("dtype", "rng"), [("f32", (4, 12)), ("u8", (1, 3)), ("f64", (0, 0)), ("u16", (6, 6))])
def test_byte_range_of_whole_elements(dtype, rng):
    assert BufferDecl.output("o", 0, dtype, 16, output_byte_range=rng).output_byte_range == rng
    assert BufferDecl.read_write("o", 0, dtype, 16, output_byte_range=rng).output_byte_range == rng
    assert BufferDecl.write_only("o", 0, dtype, 16, output_byte_range=rng).output_byte_range == rng


@pytest.mark.parametrize("factory", [BufferDecl.read, BufferDecl.uniform, BufferDecl.workgroup])
def test_byte_range_on_a_buffer_never_read_back_is_refused(factory):
    # a byte range on a read-only input used to be ignored silently
    err = raises(InvalidProgram, factory, "a", 0, "u32", 4, output_byte_range=(0, 8))
    assert "'a'" in err.message and "never read back" in err.message


def test_access_given_as_a_string():
    assert BufferDecl("a", 0, "uniform", "u8").access is A.UNIFORM
    raises(InvalidProgram, BufferDecl, "a", 0, "readonly", "u8")


@pytest.mark.parametrize("access", [3, None, BindingRole.INPUT])
def test_access_of_another_type_is_refused(access):
    raises(InvalidProgram, BufferDecl, "a", 0, access, "u8")


def test_runtime_sized_has_no_static_length():
    assert BufferDecl.read("a", 0, "f64").static_byte_len is None
    assert BufferDecl.read("a", 0, "f64", 3).static_byte_len == 24


# ---------------------------------------------------------------- dtypes
EXPECTED_DTYPES = {
    "u8": (1, np.uint8),
    "i8": (1, np.int8),
    "u16": (2, np.uint16),
    "i16": (2, np.int16),
    "f16": (2, np.float16),
    "bf16": (2, None),
    "u32": (4, np.uint32),
    "i32": (4, np.int32),
    "f32": (4, np.float32),
    "u64": (8, np.uint64),
    "i64": (8, np.int64),
    "f64": (8, np.float64),
}


def test_the_twelve_dtypes():
    assert set(DTYPES) == set(EXPECTED_DTYPES)


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("u8", "u"),
        ("i8", "i"),
        ("u16", "u"),
        ("i16", "i"),
        ("f16", "f"),
        ("bf16", "u"),
        ("u32", "u"),
        ("i32", "i"),
        ("f32", "f"),
        ("u64", "u"),
        ("i64", "i"),
        ("f64", "f"),
    ],
)
def test_input_spec_kinds(name, kind):
    # bf16 travels as raw bits: the dispatch checks its inputs as uint16 (kind "u", 2 bytes), so
    # int16, float16 and big-endian arrays are refused; it used to skip the check (kind "")
    decl = BufferDecl.read("a", 0, name)
    assert input_spec(decl) == (DTYPES[name].itemsize, kind)


def test_input_spec_matches_numpy_kinds():
    for d in DTYPES.values():
        if d.name != "bf16":
            assert d.kind == d.numpy.kind


@pytest.mark.parametrize("name", sorted(EXPECTED_DTYPES))
def test_dtype_by_name_and_numpy(name):
    itemsize, npt = EXPECTED_DTYPES[name]
    d = dtype_of(name)
    assert d is DTYPES[name] and d.itemsize == itemsize and d.numpy.itemsize == itemsize
    assert dtype_of(d) is d
    if npt is not None:
        assert d.numpy == np.dtype(npt)
        assert dtype_of(np.dtype(npt)) is d
        assert dtype_of(npt) is d
        assert dtype_of(np.dtype(npt).name) is d  # 'float32' etc.


def test_bf16_without_numpy_type_never_shadows_u16():
    # without ml_dtypes bf16 travels as uint16 bits; numpy uint16 must still mean u16
    assert dtype_of(np.uint16) is DTYPES["u16"]
    assert DTYPES["bf16"].capability == "bf16" and DTYPES["bf16"].min_cc == (8, 0)
    assert DTYPES["f16"].capability == "f16" and DTYPES["f16"].min_cc == (5, 3)


@pytest.mark.parametrize(
    ("alias", "name"), [("half", "f16"), ("float", "f32"), ("double", "f64"), ("bfloat16", "bf16")]
)
def test_dtype_aliases(alias, name):
    assert dtype_of(alias) is DTYPES[name]


@pytest.mark.parametrize("value", ["f128", "", "complex64", np.complex64, np.bool_, bool, object, 1.5, ">f4"])
def test_unknown_dtype(value):
    raises(InvalidProgram, dtype_of, value)


def test_big_endian_numpy_dtype_is_not_native():
    raises(InvalidProgram, dtype_of, np.dtype(">f4"))


def test_none_is_not_a_dtype():
    raises(InvalidProgram, dtype_of, None)


def test_numpy_value_error_becomes_invalid_program():
    raises(InvalidProgram, dtype_of, ("f4", -1))


# ---------------------------------------------------------------- invalid declarations
@pytest.mark.parametrize(
    "kw",
    [
        {"name": ""},
        {"name": 7},
        {"binding": -1},
        {"binding": 1.0},
        {"binding": True},
        {"binding": "0"},
        {"count": -1},
        {"count": 2.5},
        {"count": False},
        {"alignment": 0},
        {"alignment": 3},
        {"alignment": -16},
        {"alignment": 8192},
        {"alignment": 16.0},
        {"output_byte_range": (4, 2)},
        {"output_byte_range": (-1, 2)},
        {"output_byte_range": (0, 1, 2)},
        {"output_byte_range": (0.0, 4)},
        {"output_byte_range": (False, 4)},
        {"output_byte_range": 8},
        {"dtype": "f128"},
    ],
)
def test_invalid_declaration(kw):
    args = {"name": "b", "binding": 0, "access": A.READ_ONLY, "dtype": "u32"} | kw
    raises(InvalidProgram, BufferDecl, **args)


def test_workgroup_buffer_needs_a_static_count():
    raises(InvalidProgram, BufferDecl, "s", 0, A.WORKGROUP, "u32", 0)


def test_numpy_integers_are_normalised():
    decl = BufferDecl.output("a", np.int32(2), "u8", np.uint64(7), output_byte_range=(np.int64(1), np.int64(3)))
    assert (decl.binding, decl.count, decl.output_byte_range) == (2, 7, (1, 3))
    assert all(type(v) is int for v in (decl.binding, decl.count, *decl.output_byte_range))


@pytest.mark.parametrize("alignment", [1, 2, 16, 256, 4096])
def test_valid_alignments(alignment):
    assert BufferDecl.read("a", 0, "u8", alignment=alignment).alignment == alignment


def test_bool_alignment_is_refused():
    raises(InvalidProgram, BufferDecl.read, "a", 0, "u8", alignment=True)


def test_declarations_are_frozen():
    decl = BufferDecl.read("a", 0, "u8")
    with pytest.raises(AttributeError):
        decl.count = 3


# ---------------------------------------------------------------- Program validation
def test_duplicate_bindings():
    raises(InvalidProgram, program, BufferDecl.read("a", 1, "u8"), BufferDecl.output("b", 1, "u8"))


def test_workgroup_buffers_share_the_binding_namespace():
    raises(InvalidProgram, program, BufferDecl.read("a", 0, "u8"), BufferDecl.workgroup("s", 0, "u8", 4))


def test_duplicate_names():
    raises(InvalidProgram, program, BufferDecl.read("a", 0, "u8"), BufferDecl.output("a", 1, "u8"))


def test_binding_upper_bound():
    assert program(BufferDecl.read("a", 65535, "u8")).buffers[0].binding == 65535
    raises(InvalidProgram, program, BufferDecl.read("a", 65536, "u8"))


def test_program_needs_buffers_and_a_kernel():
    raises(InvalidProgram, Program, KERNEL, [])
    raises(InvalidProgram, Program, "source", [BufferDecl.read("a", 0, "u8")])
    raises(InvalidProgram, Program, KERNEL, [("a", 0, "read_only", "u8")])


@pytest.mark.parametrize("ws", [(0, 1, 1), (256, 0, 1), (-1, 1, 1), (1.5, 1, 1), (True, 1, 1), (1, 1, 1, 1), ()])
def test_bad_workgroup_size(ws):
    raises(InvalidProgram, program, workgroup_size=ws)


def test_workgroup_size_int_becomes_1d():
    assert program(workgroup_size=128).workgroup_size == (128, 1, 1)
    assert program(workgroup_size=np.int64(64)).workgroup_size == (64, 1, 1)
    assert program(workgroup_size=[8, 4, 2]).workgroup_size == (8, 4, 2)


@pytest.mark.parametrize(
    ("ws", "padded"), [((256,), (256, 1, 1)), ((16, 16), (16, 16, 1)), ((np.int64(8), np.uint8(2)), (8, 2, 1))]
)
def test_short_workgroup_size_is_padded(ws, padded):
    got = program(workgroup_size=ws).workgroup_size
    assert got == padded and all(type(v) is int for v in got)


@pytest.mark.parametrize(
    "kw",
    [
        {"workgroup_size": None},
        {"workgroup_size": 1.5},
        {"workgroup_size": "256"},
        {"requires": None},
        {"requires": "f16"},
    ],
)
def test_wrong_types_raise_invalid_program(kw):
    raises(InvalidProgram, program, **kw)


@pytest.mark.parametrize("buffers", [None, 3, "abc"])
def test_buffers_must_be_a_sequence(buffers):
    raises(InvalidProgram, Program, KERNEL, buffers)


@pytest.mark.parametrize("phases", [0, -1, 65536, 2.0, True])
def test_bad_phase_count(phases):
    raises(InvalidProgram, program, grid_sync=True, phases=phases)


def test_phases_need_grid_sync():
    raises(InvalidProgram, program, phases=3)
    assert program(phases=3, grid_sync=True).phases == 3
    assert program(phases=65535, grid_sync=True).phases == 65535


def test_unknown_requirement():
    raises(InvalidProgram, program, requires=("f16", "tensor_cores"))
    assert program(requires=["f16", "collectives"]).requires == ("f16", "collectives")


def test_inputs_and_outputs_in_declaration_order():
    decls = [
        BufferDecl.output("o1", 0, "u32"),
        BufferDecl.read("in2", 7, "u32"),
        BufferDecl.workgroup("s", 1, "u32", 4),
        BufferDecl.read_write("io", 2, "u32"),
        BufferDecl.uniform("u", 3, "u32", 1),
        BufferDecl.write_only("o2", 4, "u32"),
        BufferDecl.read("in1", 5, "u32"),
    ]
    p = program(*decls)
    assert [d.name for d in p.inputs] == ["in2", "io", "u", "in1"]
    assert [d.name for d in p.outputs] == ["o1", "io", "o2"]
    assert p.buffers == tuple(decls)


def test_programs_built_twice_are_equal():
    decls = [BufferDecl.read("a", 0, "u8")]
    p, q = Program(KERNEL, decls), Program(KERNEL, decls)
    assert p is q  # built again from the same plain arguments: the first build
    fresh = fakes.built_anew(p)
    assert fresh is not p and fresh == p and hash(fresh) == hash(p) and len({p, fresh}) == 1


def test_identity_covers_every_field():
    # what vyre_cuda.dask keys programs on: a field left out would let two programs that compute
    # different things share a worker's copy (and a Dask graph name)
    variants = fakes.field_variants()
    assert {f for f, _, _ in variants} == {f.name for f in dataclasses.fields(Program)}
    for field, a, b in variants:
        assert a._identity() != b._identity(), field
        assert [name for name, _ in a._identity()] == [f.name for f in dataclasses.fields(Program)]


def test_identity_of_equal_programs_built_twice():
    for (_, a, b), (_, a2, b2) in zip(fakes.field_variants(), fakes.field_variants()):
        for p, q in ((a, fakes.built_anew(a2)), (b, fakes.built_anew(b2))):
            assert p is not q
            if not (callable(p.launch) and p.launch.__name__ == "<lambda>"):  # a new lambda each time
                assert p._identity() == q._identity()
                assert pickle.loads(pickle.dumps(p))._identity() == p._identity()


# ---------------------------------------------------------------- kernels
def test_kernel_factories():
    c = Kernel.cuda("src", options=["-O3"])
    assert (c.kind, c.entry, c.options) == ("cuda", "vyre_main", ("-O3",))
    p = Kernel.ptx(b".version 8.0")
    assert (p.kind, p.entry, p.source) == ("ptx", "main", ".version 8.0")


@pytest.mark.parametrize(
    "make",
    [
        lambda: Kernel.cuda(""),
        lambda: Kernel.cuda("   \n"),
        lambda: Kernel.cuda(None),
        lambda: Kernel.cuda("src", entry="not an id"),
        lambda: Kernel.cuda("src", entry=""),
        lambda: Kernel.ptx("src", entry=3),
        lambda: Kernel("opencl", "src", "main"),
    ],
)
def test_bad_kernel(make):
    raises(InvalidProgram, make)


@pytest.mark.parametrize(
    ("make", "needles"),
    [
        (lambda: Kernel.cuda(b"__global__ void f() {} // \xff\xfe"), ("UTF-8", "0xff", "offset 26")),
        (lambda: Kernel.cuda("__global__ void f() {} // \ud800"), ("surrogate", "U+D800", "index 26")),
        (lambda: Kernel.cuda("__global__ void f() {}\0 more"), ("NUL", "index 22")),
        (lambda: Kernel.ptx(".version 8.0\0.entry x"), ("NUL",)),
        (lambda: Kernel.cuda("src", options=["-G", b"\xff"]), ("option 1", "UTF-8")),
        (lambda: Kernel.cuda("src", options=["\udcff"]), ("option 0", "surrogate")),
        (lambda: Kernel.cuda("src", options=3), ("int",)),
        (lambda: Kernel.cuda("src", options=[3]), ("option 0", "int")),
        (lambda: Kernel.cuda("src", entry="k\u00e9"), ("ASCII",)),
    ],
)
def test_undecodable_or_unencodable_text_is_invalid_program(make, needles):
    # these used to raise UnicodeDecodeError / UnicodeEncodeError / TypeError
    err = raises(InvalidProgram, make)
    for needle in needles:
        assert needle in err.message


def test_options_none_means_no_options():
    # Kernel.cuda(src, options=None) used to raise TypeError
    k = Kernel.cuda("src", options=None)
    assert k.options == () and k.digest == Kernel.cuda("src").digest


def test_ptx_trailing_nul_is_dropped():
    assert Kernel.ptx(b".version 8.0\0").source == Kernel.ptx(".version 8.0").source == ".version 8.0"


@pytest.mark.parametrize("attr", ["source", "entry", "options", "kind", "_digest", "new_attribute"])
def test_kernels_are_immutable(attr):
    # changing source after construction used to keep the old digest, so the disk cache stored
    # the new source's cubin under the old key and served it to other processes
    k = Kernel.cuda("src")
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(k, attr, "__global__ void other() {}")
    with pytest.raises(dataclasses.FrozenInstanceError):
        delattr(k, attr)
    assert (k.source, k.digest) == ("src", Kernel.cuda("src").digest)


def test_kernels_compare_by_content_and_pickle():
    a, b = Kernel.cuda("src", options="-G"), Kernel.cuda("src", options=("-G",))
    assert a == b and hash(a) == hash(b) and a != Kernel.cuda("src") and a != "src"
    again = pickle.loads(pickle.dumps(a))
    assert again == a and (again.source, again.entry, again.options, again.digest) == (
        a.source,
        a.entry,
        a.options,
        a.digest,
    )


def test_program_flags_must_be_bools():
    err = raises(InvalidProgram, program, grid_sync="no")
    assert "'no'" in err.message
    raises(InvalidProgram, program, grid_sync=1)
    assert program(grid_sync=np.bool_(True)).grid_sync is True
    raises(InvalidProgram, program, name=3)


def test_a_single_string_option_is_not_split():
    assert Kernel.cuda("src", options="-lineinfo").options == ("-lineinfo",)
    assert Kernel.cuda("src", options=b"-G").options == ("-G",)
    assert Kernel.cuda("src", options=[b"-G", "-lineinfo"]).options == ("-G", "-lineinfo")


def test_digest_covers_kind_entry_options_and_source():
    base = Kernel.cuda("src", entry="k", options=("-a",))
    same = Kernel.cuda("src", entry="k", options=["-a"])
    variants = [
        Kernel.cuda("src2", entry="k", options=("-a",)),
        Kernel.cuda("src", entry="k2", options=("-a",)),
        Kernel.cuda("src", entry="k", options=("-b",)),
        Kernel.cuda("src", entry="k", options=("-a", "-b")),
        Kernel.cuda("src", entry="k"),
        Kernel.ptx("src", entry="k"),
    ]
    assert base.digest == same.digest and len(base.digest) == 64
    digests = {v.digest for v in variants} | {base.digest}
    assert len(digests) == len(variants) + 1


# ---------------------------------------------------------------- DispatchConfig
def test_config_defaults():
    c = DispatchConfig()
    assert (c.workgroup_override, c.grid_override, c.iterations, c.cooperative, c.label) == (None, None, 1, False, None)


_CONFIG_CHANGES = {
    "workgroup_override": 64,
    "grid_override": (8, 2),
    "fixpoint_iterations": 3,
    "cooperative": True,
    "label": "x",
    "timeout": 2.5,
    "elements": 100,
    "autotune": True,
    "stream": 7,
    "outputs": "device",
    "graph": False,
    "streamed": True,
    "device_memory_budget": 1 << 30,
}


def test_configs_equal_field_by_field_and_hash_alike():
    assert set(_CONFIG_CHANGES) == {f.name for f in dataclasses.fields(DispatchConfig)}
    base = DispatchConfig()
    for name, value in _CONFIG_CHANGES.items():
        # (an equal config that is another object: built past the interning of equal builds)
        one, two = DispatchConfig(**{name: value}), fakes.built_anew(DispatchConfig(**{name: value}))
        assert one == two and hash(one) == hash(two) and one is not two, name
        assert one != base and base != one, name
        assert {one: 1}[two] == 1
    everything = DispatchConfig(**_CONFIG_CHANGES)
    assert everything == dataclasses.replace(DispatchConfig(), **_CONFIG_CHANGES)
    assert hash(everything) == hash(dataclasses.replace(DispatchConfig(), **_CONFIG_CHANGES))
    assert DispatchConfig() != (None,) * len(_CONFIG_CHANGES)


class _Stream:
    def __init__(self, handle):
        self.handle = handle

    def __cuda_stream__(self):
        return (0, self.handle)


def test_a_stream_object_is_held_by_the_config_and_not_by_its_plan_key_copy():
    stream = _Stream(0x1234)
    gone = weakref.ref(stream)
    cfg = DispatchConfig(stream=stream, label="s")
    keyed = cfg._without_stream_object()
    assert keyed == cfg and hash(keyed) == hash(cfg) and keyed.stream == 0x1234
    assert keyed == DispatchConfig(stream=0x1234, label="s")
    del stream
    assert gone() is not None  # the config keeps the caller's stream alive
    del cfg
    assert gone() is None  # the key copy does not
    plain = DispatchConfig(stream=0x1234)
    assert plain._without_stream_object() is plain  # an int handle: nothing held, nothing copied


def test_a_pickled_config_hashes_by_the_loading_process(tmp_path):
    # str hashes are salted per process: a config must not carry its hash across
    blob = tmp_path / "cfg.pickle"
    blob.write_bytes(pickle.dumps(DispatchConfig(label="a label", outputs="device", stream=_Stream(99))))
    code = (
        "import pickle, sys; from vyre_cuda.config import DispatchConfig\n"
        "cfg = pickle.loads(open(sys.argv[1], 'rb').read())\n"
        "same = DispatchConfig(label='a label', outputs='device', stream=99)\n"
        "assert cfg == same and hash(cfg) == hash(same) and {same: 1}[cfg] == 1, (hash(cfg), hash(same))\n"
        "print('ok')\n"
    )
    for seed in ("1", "2"):
        proc = subprocess.run(
            [sys.executable, "-c", code, str(blob)],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": _PACKAGE_ROOT},
            cwd=tmp_path,  # (not the source tree: its unbuilt vyre_cuda would shadow the package under test)
        )
        assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


@pytest.mark.parametrize(
    ("value", "dims"), [(64, (64, 1, 1)), ((8, 8), (8, 8, 1)), ([2, 3, 4], (2, 3, 4)), (np.int32(5), (5, 1, 1))]
)
def test_config_dims_are_padded(value, dims):
    c = DispatchConfig(workgroup_override=value, grid_override=value)
    assert c.workgroup_override == dims and c.grid_override == dims


@pytest.mark.parametrize("value", [0, (0,), (1, 0), (1, 2, 3, 4), (), (True,), True, "x", (None,), object()])
def test_config_bad_dims(value):
    raises(ValidationError, DispatchConfig, grid_override=value)
    raises(ValidationError, DispatchConfig, workgroup_override=value)


@pytest.mark.parametrize("value", [(2.7,), (64, 1.5), 256.0, "12", b"12", {1: 2}])
def test_config_non_integer_dims(value):
    raises(ValidationError, DispatchConfig, workgroup_override=value)


@pytest.mark.parametrize("iterations", [0, -1, 2**31, 1.0, True, "3"])
def test_config_bad_iterations(iterations):
    raises(ValidationError, DispatchConfig, fixpoint_iterations=iterations)


def test_config_iterations():
    assert DispatchConfig(fixpoint_iterations=np.int16(4)).iterations == 4
    assert DispatchConfig(fixpoint_iterations=MAX_FIXPOINT_ITERATIONS).iterations == 1_000_000


@pytest.mark.parametrize("iterations", [MAX_FIXPOINT_ITERATIONS + 1, 2**31 - 1, 10**400])
def test_config_iterations_are_capped(iterations):
    # 2**31 - 1 used to enqueue 2e9 launches that nothing could interrupt
    err = raises(ValidationError, DispatchConfig, fixpoint_iterations=iterations)
    assert "1,000,000" in err.message and "loop" in err.fix


@pytest.mark.parametrize("timeout", [0, -1.0, float("nan"), True, "1", -(10**400), float("-inf"), [1]])
def test_config_bad_timeout(timeout):
    raises(ValidationError, DispatchConfig, timeout=timeout)


@pytest.mark.parametrize("timeout", [10**400, 2 * MAX_TIMEOUT_S, 1e300, np.float64(1e10)])
def test_config_timeout_past_the_longest_bound_is_refused(timeout):
    # 10**400 used to pass validation and overflow after the work was enqueued
    err = raises(ValidationError, DispatchConfig, timeout=timeout)
    assert "1e+09" in err.message and "float('inf')" in err.fix
    assert len(err.message) < 200  # a 401-digit int is shortened


@pytest.mark.parametrize(
    ("timeout", "stored"),
    [
        (float("inf"), None),
        (np.inf, None),
        (None, None),
        (2, 2.0),
        (np.float32(0.5), 0.5),
        (MAX_TIMEOUT_S, MAX_TIMEOUT_S),
    ],
)
def test_config_timeout_is_a_float_or_none(timeout, stored):
    got = DispatchConfig(timeout=timeout).timeout
    assert got == stored and (got is None or type(got) is float)


@pytest.mark.parametrize("flag", ["no", "", 1, 0, None, 1.0, np.int8(1)])
def test_config_cooperative_must_be_a_bool(flag):
    # cooperative="no" used to become True and force a cooperative launch of a plain vecadd
    err = raises(ValidationError, DispatchConfig, cooperative=flag)
    assert repr(flag) in err.message


@pytest.mark.parametrize("flag", [True, False, np.bool_(True)])
def test_config_cooperative_bools(flag):
    assert DispatchConfig(cooperative=flag).cooperative is bool(flag)


@pytest.mark.parametrize("elements", [0, -1, 2**32, 1.0, True, "5"])
def test_config_bad_elements(elements):
    raises(ValidationError, DispatchConfig, elements=elements)


def test_config_elements():
    assert DispatchConfig(elements=np.uint16(7)).elements == 7 and DispatchConfig().elements is None
    assert DispatchConfig(elements=2**32 - 1).elements == 2**32 - 1


def test_a_config_built_again_from_plain_values_is_the_first_build():
    # a config built per dispatch (the usual spelling) costs a lookup, and the plan cache then
    # meets the very object it stored
    first = DispatchConfig(graph=False, timeout=2.0, outputs="device")
    assert DispatchConfig(graph=False, timeout=2.0, outputs="device") is first
    assert DispatchConfig(graph=False, timeout=2, outputs="device") == first  # an int: another call
    assert DispatchConfig(stream=7) is DispatchConfig(stream=7) and DispatchConfig(stream=7).stream == 7

    class Stream:  # a stream object is not a plain value: built as before, equal by its handle
        ptr = 7

    s = Stream()
    held = DispatchConfig(stream=s)
    assert held == DispatchConfig(stream=7) and held is not DispatchConfig(stream=s)
    assert held._stream_source is s and "_stream_source" not in DispatchConfig(stream=7).__dict__
    # a refused value is refused every time (a call that raises is not remembered)
    for _ in range(2):
        raises(ValidationError, DispatchConfig, cooperative="no")
    assert DispatchConfig(cooperative=np.bool_(True)).cooperative is True


def test_as_config():
    assert as_config(None) == DispatchConfig()
    c = DispatchConfig(label="x")
    assert as_config(c) is c
    assert as_config({"grid_override": 4, "cooperative": True}) == DispatchConfig(
        grid_override=(4, 1, 1), cooperative=True
    )
    raises(ValidationError, as_config, {"cooperative": 1})
    raises(ValidationError, as_config, {"grid": 4})
    raises(ValidationError, as_config, [("label", "x")])
    raises(ValidationError, as_config, "label=x")
    raises(ValidationError, as_config, {"fixpoint_iterations": 0})


# ---------------------------------------------------------------- BufferDecl.zeroed
def test_outputs_start_at_zero_unless_declared_zeroed_false():
    assert BufferDecl.output("o", 0, "f32").zeroed is True
    assert BufferDecl.output("o", 0, "f32", zeroed=False).zeroed is False
    assert BufferDecl.write_only("o", 0, "f32", zeroed=False).zeroed is False


@pytest.mark.parametrize(
    "decl",
    [
        lambda: BufferDecl.read("a", 0, "f32", zeroed=False),
        lambda: BufferDecl.uniform("u", 0, "u32", 4, zeroed=False),
        lambda: BufferDecl.read_write("io", 0, "f32", zeroed=False),
        lambda: BufferDecl.workgroup("s", 0, "u32", 8, zeroed=False),
    ],
)
def test_zeroed_false_is_refused_where_nothing_is_zeroed(decl):
    with pytest.raises(InvalidProgram) as info:
        decl()
    assert "zeroed=False" in info.value.message
    assert str(info.value).splitlines()[-1].startswith("Fix: ")


@pytest.mark.parametrize("flag", [0, 1, "no", None])
def test_zeroed_must_be_a_bool(flag):
    with pytest.raises(InvalidProgram, match="zeroed must be True or False"):
        BufferDecl.output("o", 0, "f32", zeroed=flag)
