"""Structural program keys: equal programs (equal in every field) are one key everywhere.

Programs compare and hash by their fields (``Program._identity``), the hash is computed once when
the program is built, and every cache keyed on programs (the core's plans, the module cache, the
tuning cache, the launch-size warning) treats a rebuilt program as the first. The dispatch
scenarios run the real backend on the fake driver (tests/fakecuda/keys_child.py).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import pickle
import subprocess
import sys
import warnings

import fakes
import numpy as np
import pytest
from helpers import scenarios

import vyre_cuda
from vyre_cuda import BufferDecl, InvalidProgram, Kernel, LaunchSizeWarning, Program
from vyre_cuda import builtin_programs as bp
from vyre_cuda.planning.launch import _warn_if_undersized, _warned

CHILD = scenarios.FAKECUDA / "keys_child.py"


def every_variant():
    """``(field, a, b)`` pairs differing in one field each (fakes.field_variants), plus the
    fields of a buffer declaration one by one."""
    out = list(fakes.field_variants())
    base = fakes.scale_program()
    x, o = base.buffers
    for name, decl in (
        ("name", dataclasses.replace(x, name="x2")),
        ("binding", dataclasses.replace(x, binding=5)),
        ("access", dataclasses.replace(x, access="uniform")),
        ("dtype", dataclasses.replace(x, dtype="i32")),
        ("count", dataclasses.replace(x, count=8)),
        ("alignment", dataclasses.replace(x, alignment=64)),
    ):
        out.append((f"buffers.{name}", base, dataclasses.replace(base, buffers=(decl, o))))
    ranged = dataclasses.replace(base, buffers=(x, dataclasses.replace(o, count=16)))
    part = dataclasses.replace(ranged.buffers[1], output_byte_range=(0, 32))
    out.append(("buffers.output_byte_range", ranged, dataclasses.replace(ranged, buffers=(x, part))))
    unzeroed = dataclasses.replace(o, zeroed=False)
    out.append(("buffers.zeroed", base, dataclasses.replace(base, buffers=(x, unzeroed))))
    rw = Program(base.kernel, [BufferDecl.read_write("x", 0, "f32")])
    out.append(("buffers.is_output", rw, Program(base.kernel, [BufferDecl("x", 0, "read_write", "f32", output=True)])))
    return out


def test_every_field_and_buffer_field_is_covered():
    fields = {f for f, _, _ in every_variant()}
    assert {f.name for f in dataclasses.fields(Program)} <= fields
    # persistent buffers are refused at plan time, not built into programs here; every other field
    assert {f"buffers.{f.name}" for f in dataclasses.fields(BufferDecl)} - fields == {"buffers.persistent"}


@pytest.mark.parametrize("field, a, b", every_variant(), ids=lambda v: v if isinstance(v, str) else "")
def test_programs_differing_in_one_field_are_unequal(field, a, b):
    assert a != b and b != a and (a == b) is False, field
    assert hash(a) != hash(b), field  # (a collision is possible in principle, not for these)
    assert len({a, b}) == 2 and {a: 1, b: 2}[b] == 2


def test_programs_rebuilt_from_equal_fields_are_equal_and_hash_alike():
    for (field, a, b), (_, a2, b2) in zip(fakes.field_variants(), fakes.field_variants()):
        for p, q in ((a, fakes.built_anew(a2)), (b, fakes.built_anew(b2))):
            assert p is not q
            if callable(p.launch) and p.launch.__name__ == "<lambda>":
                assert p != q, field  # a new lambda each time: a different launch rule object
                continue
            assert p == q and hash(p) == hash(q) and {p: field}[q] == field, field
            assert dataclasses.replace(p) == p and hash(dataclasses.replace(p)) == hash(p)


def test_the_hash_is_computed_once_at_construction():
    p = fakes.built_anew(bp.vecadd_f32())  # (its own object: the test breaks its key below)
    assert hash(p) == p._hash == hash(p._key)

    # the key is not looked at again: __hash__ reads the cached attribute only
    key = p._key
    object.__setattr__(p, "_key", None)
    try:
        assert hash(p) == p._hash
    finally:
        object.__setattr__(p, "_key", key)
    assert p == bp.vecadd_f32()


def test_numpy_scalars_and_lists_normalise_to_the_same_program():
    k = Kernel.cuda("VYRE_KERNEL vyre_main() {}")
    decls = [BufferDecl.read("x", np.int64(0), "f32"), BufferDecl.output("o", 1, np.float32)]
    a = Program(k, decls, workgroup_size=np.int32(128), grid_sync=np.bool_(False), requires=["f16"])
    b = Program(k, tuple(decls), workgroup_size=(128, 1, 1), grid_sync=False, requires=("f16",))
    c = Program(k, decls, workgroup_size=[128], elementwise=["x"], align=np.int64(2))
    d = Program(k, decls, workgroup_size=128, elementwise="x", align=2)
    assert a == b and hash(a) == hash(b)
    assert c == d and hash(c) == hash(d)
    assert type(a.workgroup_size[0]) is int and type(c.align) is int and c.elementwise == ("x",)


def test_a_callable_launch_keys_by_object():
    base = fakes.launch_elems_program()

    def rule(sizes):
        return sizes["x"]

    same = (dataclasses.replace(base, launch=rule), dataclasses.replace(base, launch=rule))
    assert same[0] == same[1] and hash(same[0]) == hash(same[1])
    assert dataclasses.replace(base, launch=lambda s: s["x"]) != dataclasses.replace(base, launch=lambda s: s["x"])

    class Rule:  # equal by value and unhashable: its own == is not asked
        __hash__ = None  # type: ignore[assignment]

        def __eq__(self, other):
            return True

        def __call__(self, sizes):
            return sizes["x"]

    r = Rule()
    p, q = dataclasses.replace(base, launch=r), dataclasses.replace(base, launch=Rule())
    assert p != q and p == dataclasses.replace(base, launch=r) and len({p, q}) == 2
    partial = functools.partial(fakes.launch_by_y)
    assert dataclasses.replace(base, launch=partial) == dataclasses.replace(base, launch=partial)
    assert dataclasses.replace(base, launch=fakes.launch_by_y) != dataclasses.replace(base, launch=partial)


def test_programs_compare_only_with_programs():
    p = bp.vecadd_f32()
    assert p != p._identity() and p != p._key and p != "vecadd" and (p == object()) is False


def test_pickled_programs_are_rebuilt_with_the_hash_of_the_loading_process():
    # str hashes are salted per process: an unpickled program must not carry the sender's hash
    blob = pickle.dumps(fakes.launch_elems_program(launch=fakes.launch_by_y))
    code = (
        "import pickle, sys, fakes; p = pickle.loads(sys.stdin.buffer.read()); "
        "q = fakes.launch_elems_program(launch=fakes.launch_by_y); "
        "print(p == q and hash(p) == hash(q) and p._hash == hash(p._key))"
    )
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(os.path.abspath(vyre_cuda.__file__)))  # the vyre_cuda under test
    env = dict(os.environ, PYTHONHASHSEED="12345", PYTHONPATH=os.pathsep.join([root, tests_dir]))
    proc = subprocess.run(
        [sys.executable, "-c", code], input=blob, capture_output=True, env=env, check=False, cwd=tests_dir
    )
    assert proc.stdout.strip() == b"True", proc.stderr.decode()[-2000:]
    here = pickle.loads(blob)
    assert here == fakes.launch_elems_program(launch=fakes.launch_by_y) and hash(here) == here._hash


def test_an_unhashable_field_is_refused_by_name():
    from vyre_cuda.program import _structural_key

    p = fakes.built_anew(bp.vecadd_f32())  # (its own object: the test breaks it)
    object.__setattr__(p, "name", ["not", "hashable"])  # (validation makes this unreachable)
    with pytest.raises(InvalidProgram, match=r"Program\.name holds an unhashable value") as err:
        _structural_key(p)
    assert str(err.value).splitlines()[-1].startswith("Fix: ")


def test_the_launch_size_warning_is_once_per_equal_program():
    # the warning's WeakSet holds programs by their (structural) hash: a rebuilt one is not warned again
    from vyre_cuda.planning.binding import plan_bindings

    prog = fakes.scale_program()
    _warned.discard(prog)
    bplan = plan_bindings(prog, (4000,))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _warn_if_undersized(prog, bplan, 10, "out", "x")
        _warn_if_undersized(fakes.scale_program(), bplan, 10, "out", "x")
    assert [type(w.message) for w in caught] == [LaunchSizeWarning]
    _warned.discard(prog)


# ---------------------------------------------------------------- on the fake driver
SCENARIOS = scenarios.declared(CHILD)


@pytest.fixture(scope="module")
def results(fake_libcuda, tmp_path_factory):
    return scenarios.run_scenarios(CHILD, fake_libcuda, tmp_path_factory)


@pytest.mark.parametrize("name", SCENARIOS)
def test_on_the_fake_driver(results, name):
    result = results[name]
    scenarios.check(result)


# -- building again from the same arguments skips validation, never a refusal ---------------------
def _saxpy(**program_kw):
    return Program(
        Kernel.cuda("VYRE_KERNEL vyre_main(const float* x, float* o, const vyre_u32* p) {}"),
        [BufferDecl.read("x", 0, "f32"), BufferDecl.output("o", 1, "f32")],
        **program_kw,
    )


@pytest.mark.parametrize(
    "bad",
    [{"phases": True}, {"grid_sync": 1}, {"workgroup_size": (True, 1, 1)}, {"align": True}, {"phases": 1.0}],
)
def test_a_refused_argument_stays_refused_after_an_equal_valid_one(bad):
    # 1 == True == 1.0 as dict keys: the reuse of validated fields must tell them apart by type
    (field,) = bad
    good = {"phases": 1, "grid_sync": True, "workgroup_size": (1, 1, 1), "align": 1}[field]
    for _ in range(2):
        _saxpy(**{field: good})
        with pytest.raises(InvalidProgram):
            _saxpy(**bad)


def test_a_refused_declaration_stays_refused():
    for _ in range(2):
        BufferDecl.read("x", 1, "f32")
        with pytest.raises(InvalidProgram, match="binding"):
            BufferDecl.read("x", True, "f32")
        with pytest.raises(InvalidProgram, match="alignment"):
            BufferDecl.read("x", 1, "f32", alignment=3)
    with pytest.raises(InvalidProgram, match="NUL"):
        Kernel.cuda("VYRE_KERNEL vyre_main() {}\0")
    with pytest.raises(InvalidProgram, match="NUL"):
        Kernel.cuda("VYRE_KERNEL vyre_main() {}\0")


def test_declarations_hash_once_compare_by_fields_and_pickle_through_the_constructor():
    a = BufferDecl.read("a", 0, "f32")
    assert BufferDecl.read("a", 0, "f32") is a  # built again: the first build
    b = fakes.built_anew(a)
    assert a == b and hash(a) == hash(b) and a is not b
    for other in (
        BufferDecl.read("b", 0, "f32"),
        BufferDecl.read("a", 1, "f32"),
        BufferDecl.read("a", 0, "i32"),
        BufferDecl.read("a", 0, "f32", 4),
        BufferDecl.read_write("a", 0, "f32"),
        BufferDecl.read("a", 0, "f32", alignment=16),
    ):
        assert other != a and a != other and hash(other) != hash(a), other
    again = pickle.loads(pickle.dumps(a))
    assert again == a and hash(again) == hash(a) and again.role is a.role
    renamed = dataclasses.replace(a, name="z")
    assert renamed.name == "z" and renamed != a and renamed.role is a.role
    out = BufferDecl.output("o", 2, "f32", zeroed=False)
    assert pickle.loads(pickle.dumps(out)) == out and not dataclasses.replace(out, binding=3).zeroed
    assert (a == "a") is False and a != object()


def test_a_program_built_again_from_plain_arguments_is_the_first_build():
    first = bp.vecadd_f32()
    # its Kernel, BufferDecls and the Program itself: each call with the same arguments
    assert bp.vecadd_f32() is first
    assert Kernel.cuda(first.kernel.source) is first.kernel
    # (vecadd_f32 passes "f32"; the DType, as vecadd("f32") passes it, is another argument)
    assert BufferDecl.read("a", 0, "f32") is first.buffers[0]
    assert BufferDecl.output("out", 2, "f32", zeroed=False) is first.buffers[2]
    f32 = first.buffers[0].dtype
    assert BufferDecl.read("a", 0, f32) == first.buffers[0] and BufferDecl.read("a", 0, f32) is not first.buffers[0]
    # the generic factory builds an equal program: one structural key, so one plan
    generic = bp.vecadd("f32")
    assert generic == first and hash(generic) == hash(first) and generic.name == first.name
    assert (generic.kernel, generic.buffers, generic.workgroup_size) == (first.kernel, first.buffers, (256, 1, 1))
    renamed = dataclasses.replace(first, name="other")
    assert renamed.name == "other" and renamed != first and renamed.buffers == first.buffers
    # pickle rebuilds through the constructor with every field, replace() with every field by
    # keyword: other calls than the factory's, so equal programs, each built once
    loaded = pickle.loads(pickle.dumps(first))
    assert loaded == first and pickle.loads(pickle.dumps(first)) is loaded
    assert dataclasses.replace(first) == first and dataclasses.replace(first) is dataclasses.replace(first)
    # positional and keyword spellings are other calls: equal programs, each built once
    same = Program(first.kernel, first.buffers, (256, 1, 1), False, 1, (), "vecadd_f32")
    assert same == first and Program(first.kernel, first.buffers, (256, 1, 1), False, 1, (), "vecadd_f32") is same
    assert Program(kernel=first.kernel, buffers=first.buffers, name="vecadd_f32") == first
    # a list of buffers is keyed by its items (a list is unhashable) and stored as a tuple
    listed = Program(first.kernel, list(first.buffers), workgroup_size=256)
    assert type(listed.buffers) is tuple and listed.workgroup_size == (256, 1, 1)
    assert Program(first.kernel, list(first.buffers), workgroup_size=256) is listed
    assert bp.vecadd("f32", workgroup=128) != first


def test_arguments_that_are_not_plain_values_build_a_new_equal_program():
    first = bp.vecadd_f32()
    k, decls = first.kernel, first.buffers
    a = Program(k, decls, workgroup_size=(np.int64(256), 1, 1), name="vecadd_f32")
    b = Program(k, decls, workgroup_size=(np.int64(256), 1, 1), name="vecadd_f32")
    assert a is not b and a is not first and a == b == first and hash(a) == hash(first)
    # the derived views point at the program's own declarations, in declaration order
    assert a.inputs == (a.buffers[0], a.buffers[1]) and a.outputs[0] is a.buffers[2]
    assert type(a.workgroup_size[0]) is int

    # a subclass is built as usual, every time
    class Sub(Program):
        pass

    s1, s2 = Sub(k, decls), Sub(k, decls)
    assert s1 is not s2 and type(s1) is Sub and s1 == s2


def test_interning_stops_at_its_limit():
    # (the table and the limit are the metaclass's fields, set and restored here)
    _interned = pytest.importorskip("vyre_cuda._interned")
    values, limit = BufferDecl._interned_values, BufferDecl._interned_limit
    assert limit == 4096 and Kernel._interned_limit == 1024  # (a class body's limit is taken)
    BufferDecl._interned_values, BufferDecl._interned_limit = _interned._Table(), 2
    try:
        a, b, c = (BufferDecl.read(f"x{i}", 0, "f32") for i in range(3))
        assert BufferDecl.read("x0", 0, "f32") is a and BufferDecl.read("x1", 0, "f32") is b
        again = BufferDecl.read("x2", 0, "f32")
        assert again is not c and again == c  # past the limit: built, equal, not remembered
        assert len(BufferDecl._interned_values) == 2
    finally:
        BufferDecl._interned_values, BufferDecl._interned_limit = values, limit


def test_values_keyed_by_identity_are_held_by_their_entry():
    # a DType argument is keyed by its address: the entry keeps the object alive, so no other
    # object can take that address and be mistaken for it while the entry lives
    import gc
    import weakref

    from vyre_cuda._dtypes import DTYPES, DType

    f32 = DTYPES["f32"]
    twin = DType(f32.name, f32.itemsize, f32.numpy, f32.capability, f32.min_cc, f32.kind)
    assert twin == f32 and twin is not f32
    decl = BufferDecl.read("held", 0, twin)
    assert BufferDecl.read("held", 0, twin) is decl
    # an equal object that is another object is a miss: built, equal
    assert BufferDecl.read("held", 0, f32) == decl and BufferDecl.read("held", 0, f32) is not decl
    ref = weakref.ref(twin)
    del twin, decl
    gc.collect()
    assert ref() is not None, "the interned entry let its key's object go"
    # the table's types load as the table's objects, so unpickled declarations are interned too
    assert pickle.loads(pickle.dumps(f32)) is f32
    d = BufferDecl.read("p", 0, f32)
    loaded = pickle.loads(pickle.dumps(d))  # (built through the constructor with every field)
    assert loaded == d and pickle.loads(pickle.dumps(d)) is loaded


@pytest.mark.parametrize("via", ["class", "constructor"])
def test_a_remembered_call_is_compared_with_the_call_item_by_item(via):
    # the tables are keyed by a hash of the arguments; a lookup must still compare the entry's
    # arguments with the call's (a 64-bit collision would otherwise return another value). The
    # class's own calls and its remembered constructors (BufferDecl.read) each keep one.
    if via == "class":
        build, table = (lambda name: BufferDecl(name, 0, "read_only", "f32")), BufferDecl._interned_values
    else:
        build, table = (lambda name: BufferDecl.read(name, 0, "f32")), BufferDecl.__dict__["read"].values
    x, y = build(f"cx_{via}"), build(f"cy_{via}")
    key_x = next(k for k, e in table.items() if e.value is x)
    key_y = next(k for k, e in table.items() if e.value is y)
    saved = table[key_x]
    table[key_x] = table[key_y]  # x's hash now finds y's entry, as a collision would
    try:
        again = build(f"cx_{via}")
        assert again == x and again is not y
        assert again is not x if via == "class" else again is x  # (read() then asks the class)
        assert table[key_x] is table[key_y]
    finally:
        table[key_x] = saved
    assert build(f"cx_{via}") is x


def test_remembered_constructors_build_as_the_class_does():
    # BufferDecl.read & co. remember calls with plain arguments, as the class does its own: the
    # same value again, a subclass built anew every time, and the flag on an instance
    a = BufferDecl.read("rc", 0, "f32")
    assert BufferDecl.read("rc", 0, "f32") is a and a == BufferDecl("rc", 0, "read_only", "f32")
    assert Kernel.cuda("/* rc */") is Kernel.cuda("/* rc */")
    out = BufferDecl.output("rc_out", 1, "f32", zeroed=False)
    assert BufferDecl.output("rc_out", 1, "f32", zeroed=False) is out and out.output is True and not out.zeroed
    assert BufferDecl.output("rc_out", 1, "f32") is not out  # another call: another value

    class Sub(BufferDecl):
        pass

    s1, s2 = Sub.read("rc", 0, "f32"), Sub.read("rc", 0, "f32")
    assert type(s1) is Sub and s1 is not s2 and s1 == s2
    assert BufferDecl.read("rc", 0, "f32") is a  # (reading it on the subclass changed nothing)
    for _ in range(2):  # refused every time, never kept
        with pytest.raises(InvalidProgram):
            BufferDecl.read("rc", 0, "f99")


def test_the_two_recent_calls_differing_in_any_argument_return_their_own_values():
    # the two calls a table found last are compared first, by identity then by value: two calls
    # alternating (a function building its program calls read("a", ...), read("b", ...) each
    # time) that differ in one argument only, a keyword name or a keyword's place each keep
    # their own value, with the very objects passed again and with equal new ones
    f16, f32 = "f16", "f32"
    pairs = [  # (x's call, y's call, whether their values are equal)
        ((("ra_0", 0, f32), {}), (("ra_0", 1, f32), {}), False),  # the binding only
        ((("ra_1", 0, f32), {}), (("ra_1", 0, f16), {}), False),  # the element type only
        ((("ra_2", 0, f32), {}), (("ra_2", 0, f32, 8), {}), False),  # one argument more
        ((("ra_3", 0, f32), {"count": 4}), (("ra_3", 0, f32), {"count": 8}), False),  # a keyword's value
        ((("ra_4", 0, f32), {"count": 64}), (("ra_4", 0, f32), {"alignment": 64}), False),  # its name
        ((("ra_5", 0, f32, 4), {}), (("ra_5", 0, f32), {"count": 4}), True),  # by place, by name
    ]
    for (args_x, kw_x), (args_y, kw_y), equal in pairs:
        x, y = BufferDecl.read(*args_x, **kw_x), BufferDecl.read(*args_y, **kw_y)
        assert (x == y) is equal, (args_x, kw_x, args_y, kw_y)
        for _ in range(3):
            assert BufferDecl.read(*args_x, **kw_x) is x
            assert BufferDecl.read(*args_y, **kw_y) is y
            # equal values that are new objects (a str built at run time) find the same entries
            assert BufferDecl.read("".join(args_x[0]), *args_x[1:], **kw_x) is x
            assert BufferDecl.read("".join(args_y[0]), *args_y[1:], **kw_y) is y


def test_remembered_calls_find_their_entries_through_every_call_entry():
    # the interned classes and their constructors are called through CPython's supported
    # entries (a metaclass __call__, an object's __call__): a direct call, an explicit
    # __call__ and a partial all find the same entries. No type slot is patched.
    import pathlib

    # (read from the source tree: an installed wheel carries the compiled module, not its .pyx)
    source = (pathlib.Path(__file__).parents[1] / "vyre_cuda" / "_interned.pyx").read_text()
    for patched in ("tp_vectorcall", "PyType_Type", "tp_flags", "PyType_Modified"):
        assert patched not in source, f"_interned.pyx touches {patched}"

    class Sub(Program):
        pass

    assert Sub._interned_values is None  # (a subclass is built as usual, every time)
    first = bp.vecadd_f32()
    k, decls = first.kernel, list(first.buffers)
    kw = {"workgroup_size": (256, 1, 1), "name": "vecadd_f32"}
    assert Program(k, decls, **kw) is first
    assert type(Program).__call__(Program, k, decls, **kw) is first
    assert functools.partial(Program, k)(decls, **kw) is first
    # the keywords' order is part of the call: another order is another entry, an equal value
    swapped = Program(k, decls, name="vecadd_f32", workgroup_size=(256, 1, 1))
    assert swapped == first and swapped is not first
    assert type(Program).__call__(Program, k, decls, name="vecadd_f32", workgroup_size=(256, 1, 1)) is swapped
    f32 = first.buffers[0].dtype
    read, output = BufferDecl.read, BufferDecl.output
    assert type(read).__call__(read, "a", 0, "f32") is first.buffers[0] is read("a", 0, "f32")
    assert type(output).__call__(output, "out", 2, "f32", zeroed=False) is first.buffers[2]
    assert functools.partial(output, "out", 2)("f32", zeroed=False) is first.buffers[2]
    for call in (read, type(read).__call__.__get__(read)):  # refused through either entry
        with pytest.raises(InvalidProgram):
            call("a", 0, "f99")
    # the last two entries are compared with a call before anything is hashed: alternating calls
    # each find their own value, and a call differing from a recent one in one item is another
    a1, b1 = read("alt_a", 0, f32), read("alt_b", 1, f32)
    for _ in range(3):
        assert read("alt_a", 0, f32) is a1 and read("alt_b", 1, f32) is b1
        assert read("alt_b", 1, f32) is b1 and read("alt_a", 0, f32) is a1
        near = read("alt_a", 1, f32)
        assert near != a1 and near.binding == 1 and read("alt_a", 1, f32) is near


def test_a_list_argument_changed_after_the_call_is_another_call():
    first = bp.vecadd_f32()
    decls = list(first.buffers)
    p1 = Program(first.kernel, decls, name="listed_then_changed")
    decls[2] = BufferDecl.output("other", 2, "f32")  # the caller's list, changed afterwards
    p2 = Program(first.kernel, decls, name="listed_then_changed")
    assert p2 is not p1 and p2.buffers[2].name == "other" and p1.buffers[2].name == "out"
    assert Program(first.kernel, list(first.buffers), name="listed_then_changed") is p1
    # a tuple and a list of the same items are other calls (the type is matched), equal values
    p3 = Program(first.kernel, tuple(first.buffers), name="listed_then_changed")
    assert p3 == p1 and p3 is not p1


def test_the_interned_classes_show_their_constructors_signatures():
    # (help(), IDEs and the API reference read them through inspect: a Python-level metaclass
    # __call__ once made every one of them read (*args, **kw))
    import inspect

    assert list(inspect.signature(Program).parameters)[:3] == ["kernel", "buffers", "workgroup_size"]
    assert list(inspect.signature(BufferDecl).parameters)[:4] == ["name", "binding", "access", "dtype"]
    assert list(inspect.signature(Kernel).parameters) == ["kind", "source", "entry", "options"]


def test_threads_building_equal_programs_get_equal_values():
    # the tables are shared: threads racing to build one new value each get an equal one, and
    # once one is remembered every thread gets that object
    import threading

    dtypes = ("u8", "i16", "u32", "f32", "f64", "i64")
    wanted = {(d, w): fakes.built_anew(bp.vecadd(d, workgroup=w)) for d in dtypes for w in (64, 96)}
    errors: list = []
    start = threading.Barrier(6)

    def build(seed):
        start.wait()
        rng = np.random.default_rng(seed)
        for _ in range(400):
            key = (dtypes[rng.integers(len(dtypes))], (64, 96)[rng.integers(2)])
            got = bp.vecadd(key[0], workgroup=key[1])
            if got != wanted[key] or got is not bp.vecadd(key[0], workgroup=key[1]):
                errors.append(key)

    threads = [threading.Thread(target=build, args=(s,)) for s in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_threads_building_the_same_values_all_get_the_one_stored_first():
    # each table is one mutex's: threads racing through the same constructors (a switch every
    # microsecond) get equal values, and once stored, every thread gets the very same object
    import sys
    import threading

    names = [f"race_{k}" for k in range(40)]
    got: dict = {}
    errors: list = []
    start = threading.Barrier(8)

    def build(t):
        try:
            start.wait(5)
            mine = []
            for _ in range(20):
                for name in names:
                    decls = [BufferDecl.read("a", 0, "f32"), BufferDecl.output("out", 1, "f32")]
                    mine.append(Program(bp.vecadd_f32().kernel, decls, name=name))
            got[t] = mine
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=build, args=(t,)) for t in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        sys.setswitchinterval(old)
    assert not errors, errors[:3]
    firsts = {
        name: Program(
            bp.vecadd_f32().kernel, [BufferDecl.read("a", 0, "f32"), BufferDecl.output("out", 1, "f32")], name=name
        )
        for name in names
    }
    for mine in got.values():
        for k, p in enumerate(mine):
            name = names[k % len(names)]
            assert p == firsts[name] and p.name == name
        # the last round came after every value was stored: the same objects
        assert all(p is firsts[names[k]] for k, p in enumerate(mine[-len(names) :]))


def test_cleared_tables_build_again_and_remember_the_new_value():
    # (read() builds through the class's own call: both tables are cleared)
    tables = (BufferDecl.__dict__["read"].values, BufferDecl._interned_values)
    first = BufferDecl.read("cleared", 0, "f32")
    assert BufferDecl.read("cleared", 0, "f32") is first
    saved = [t.items() for t in tables]
    for t in tables:
        t.clear()
    try:
        assert len(tables[0]) == 0
        again = BufferDecl.read("cleared", 0, "f32")
        assert again == first and again is not first
        assert BufferDecl.read("cleared", 0, "f32") is again and len(tables[0]) == 1
    finally:
        for t, items in zip(tables, saved, strict=True):
            for h, e in items:
                t[h] = e
