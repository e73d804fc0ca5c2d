"""The tessera package against real daemons: every call, values compared to
numpy, slicing edge cases, every error class, a daemon killed mid-read,
Ctrl-C while a daemon stalls, concurrent readers."""

import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import tessera
from conftest import Daemons


def test_connect_and_health(daemons, client):
    assert client.world_size == 4
    health = client.health()
    assert [(a, r, ok) for a, r, ok in health] == [
        (daemons.addresses[r], r, True) for r in range(4)]
    os.environ["TESSERA_ADDRESS"] = daemons.addresses[2]
    try:
        assert tessera.connect().world_size == 4
    finally:
        del os.environ["TESSERA_ADDRESS"]


def test_stats_are_every_daemons_metrics(client, rows4):
    t = client.create("counted", [8, 8], rows4, init="ones")
    t[:, :]
    stats = client.stats()
    assert [s["rank"] for s in stats] == [0, 1, 2, 3]
    for s in stats:
        assert s["error"] is None
        assert f'tessera_rank {s["rank"]}' in s["metrics"]
        assert "tessera_tensors 1" in s["metrics"]


def test_request_ids_are_checked_before_any_call(daemons):
    traced = tessera.connect(daemons.addresses[1], request_id="py.trace-1")
    t = traced.create("traced", [4, 4],
                      tessera.chunk(0, ["rank:0/cpu", "rank:1/cpu"]))
    traced.delete(t.name)
    for bad in ["has space", "x" * 65, "semi;colon"]:
        with pytest.raises(tessera.InvalidArgumentError, match="request_id"):
            tessera.connect(daemons.addresses[0], request_id=bad)


def test_lanes_and_transports_read_and_write_the_same_bytes(daemons):
    # 40 MiB on one daemon: striped across lanes over the data plane (the
    # local path off), or not, each read and write agreeing with numpy.
    setup = tessera.connect(daemons.addresses[0])
    t = setup.create("laned", [40, 1 << 18], tessera.chunk(0, ["rank:1/cpu"]))
    try:
        expected = np.arange(40 * (1 << 18), dtype=np.float32).reshape(
            40, 1 << 18)
        for lanes in (1, 3, 0):
            c = tessera.connect(daemons.addresses[0], data_lanes=lanes,
                                local_path=False)
            view = c.open("laned")
            view.write((0, 0), expected * lanes)
            assert np.array_equal(view.read(), expected * lanes)
            box = view.read_region((5, 7), (30, 1000))
            assert np.array_equal(box, expected[5:35, 7:1007] * lanes)
    finally:
        setup.delete(t.name)
    for bad in (-1, 17):
        with pytest.raises(tessera.InvalidArgumentError, match="data_lanes"):
            tessera.connect(daemons.addresses[0], data_lanes=bad)


def test_request_ids_are_idempotency_keys(daemons):
    rows = tessera.chunk(0, ["rank:0/cpu", "rank:1/cpu"])
    for address in daemons.addresses[:2]:
        # The same script twice, through two daemons: applied once.
        run = tessera.connect(address, request_id="py.idem-1")
        first = run.create("idem", [4, 4], rows, init="ones")
        run.delete("idem")
        assert first.name == "idem"
    check = tessera.connect(daemons.addresses[0])
    assert "idem" not in [t.name for t in check.list()]
    created = check.operation("py.idem-1")
    assert created["state"] == "committed"
    assert created["method"] == "CreateTensor"
    assert created["tensor"] == "idem"
    assert created["log_entry"] > 0
    assert check.operation("py.idem-1.2")["method"] == "DeleteTensor"
    assert check.operation("py.never-sent")["state"] == "unknown"
    with pytest.raises(tessera.InvalidArgumentError, match="request id"):
        check.operation("has space")


def test_create_metadata_and_every_init(client, rows4):
    w = client.create("w", (1000, 64), rows4, dtype="float32", init="randn",
                      seed=7)
    assert (w.name, w.shape, w.dtype) == ("w", (1000, 64), np.dtype("float32"))
    assert w.tensor_id
    assert [s.rank for s in w.shards] == [0, 1, 2, 3]
    assert w.shards[1].offsets == (250, 0) and w.shards[1].sizes == (250, 64)
    assert w.shards[1].placement == "rank:1/cpu"
    again = client.create("w2", (1000, 64), rows4, init="randn", seed=7)
    np.testing.assert_array_equal(w.read(), again.read())
    for init, value in [("zeros", 0), ("ones", 1)]:
        t = client.create(init, (8, 3), rows4, dtype=np.int64, init=init)
        assert t.dtype == np.int64
        np.testing.assert_array_equal(t.read(), np.full((8, 3), value))
    full = client.create("full", (5,), tessera.chunk(0, ["rank:3/cpu"]),
                         dtype="float64", init="full", fill_value=2.5)
    np.testing.assert_array_equal(full.read(), np.full(5, 2.5))
    rand = client.create("rand", (100,), rows4, init="rand", seed=1).read()
    assert ((rand >= 0) & (rand < 1)).all()


def test_copies_of_every_shard(client, rows4):
    """copies counts every holder of a shard, the owner's included; the
    older keyword replicas still works but warns; below 1 is refused
    before any daemon is asked."""
    one = client.create("c1", (8, 4), rows4, init="ones")
    assert one.copies == 1
    two = client.create("c2", (8, 4), rows4, init="ones", copies=2)
    assert two.copies == 2
    np.testing.assert_array_equal(two.read(), np.ones((8, 4), np.float32))
    with pytest.warns(DeprecationWarning, match="copies"):
        old = client.create("c3", (8, 4), rows4, replicas=2)
    assert old.copies == 2
    for bad in (0, -1, 10**12):
        with pytest.raises(tessera.InvalidArgumentError,
                           match="copies must be between 1"):
            client.create("c4", (8, 4), rows4, copies=bad)
    with pytest.raises(tessera.InvalidArgumentError,
                       match="copies must be between 1 and the 4 daemons"):
        client.create("c4", (8, 4), rows4, copies=5)
    assert "c4" not in [t.name for t in client.list()]


def test_slicing_reads_only_the_box(client, rows4):
    values = np.arange(40 * 6, dtype=np.float32).reshape(40, 6)
    w = client.put("w", values, rows4)
    for key in [np.s_[5:25, 1:4], np.s_[3], np.s_[-1], np.s_[..., 2],
                np.s_[-5:], np.s_[:, -2:], np.s_[10:10], np.s_[30:100],
                np.s_[7, 5], np.s_[...], np.s_[:, :]]:
        np.testing.assert_array_equal(w[key], values[key], err_msg=str(key))
    assert w[10:10].shape == (0, 6)
    with pytest.raises(tessera.OutOfRangeError) as e:
        w[40]
    assert isinstance(e.value, IndexError)
    with pytest.raises(tessera.OutOfRangeError):
        w[-41]
    with pytest.raises(tessera.OutOfRangeError):
        w[1, 2, 3]
    with pytest.raises(tessera.InvalidArgumentError, match="has step 2\\)"):
        w[::2]
    # The step as written, not as clamped to ssize_t.
    with pytest.raises(tessera.InvalidArgumentError,
                       match=f"has step {2**64}\\)"):
        w[:, ::2**64]
    with pytest.raises(tessera.OutOfRangeError):  # checked before allocating
        w.read_region((0, 0), (10**9, 10**9))
    with pytest.raises(tessera.InvalidArgumentError):
        w[[1, 2]]
    np.testing.assert_array_equal(w[np.int64(3), np.int32(-1)], values[3, -1])
    assert w[-1, -1].shape == () and w[0:0, 2].shape == (0,)
    assert w[..., 1:3].shape == (40, 2) and w[2, ...].shape == (6,)
    for bad in [True, None, 1.0, "1", (..., ...), (slice(0, 2), [0, 1])]:
        with pytest.raises(tessera.InvalidArgumentError):
            w[bad]
        with pytest.raises(tessera.InvalidArgumentError):
            w[bad] = 1
    for bad in [2**70, -2**70, (0, 6), (0, -7)]:
        with pytest.raises(tessera.OutOfRangeError):
            w[bad]
    np.testing.assert_array_equal(w.read(), values)  # nothing was written


def test_writes_and_reads_in_place(client, rows4):
    w = client.create("w", (12, 8), rows4, init="zeros")
    expected = np.zeros((12, 8), np.float32)
    w[0:2, 0:8] = np.ones((2, 8), np.float32)
    expected[0:2, 0:8] = 1
    w[5, :] = 7  # broadcast, across the boundary of shards 1 and 2
    expected[5, :] = 7
    w[2:9, 3] = np.arange(7)
    expected[2:9, 3] = np.arange(7)
    # Leading dimensions of size 1 are dropped, as numpy does.
    w[6] = np.full((1, 8), 4, np.float32)
    expected[6] = np.full((1, 8), 4, np.float32)
    w[7:9, 0:2] = np.full((1, 1, 2, 2), 5, np.float32)
    expected[7:9, 0:2] = np.full((1, 1, 2, 2), 5, np.float32)
    for bad in (np.ones((2, 8)), np.ones((2, 1, 8))):
        with pytest.raises(ValueError, match="could not broadcast"):
            w[6] = bad
    w.write((10, 4), np.full((2, 4), 3, np.float32))
    expected[10:12, 4:8] = 3
    np.testing.assert_array_equal(w.read(), expected)
    out = np.empty((12, 8), np.float32)
    assert w.read(out=out) is out
    np.testing.assert_array_equal(out, expected)
    box = np.empty((3, 2), np.float32)
    w.read_region((4, 2), (3, 2), out=box)
    np.testing.assert_array_equal(box, expected[4:7, 2:4])
    strided = np.empty((12, 16), np.float32)[:, ::2]
    w.read(out=strided)
    np.testing.assert_array_equal(strided, expected)
    # A strided out is checked as strictly as a dense one: no broadcast, no
    # silent conversion.
    with pytest.raises(tessera.InvalidArgumentError, match="shape"):
        w.read_region((0, 0), (1, 8), out=strided)
    with pytest.raises(tessera.InvalidArgumentError, match="dtype"):
        w.read(out=np.empty((12, 16), np.float64)[:, ::2])
    # Non-contiguous sources are written as they are.
    w.write((0, 0), expected.T.copy().T)
    np.testing.assert_array_equal(w.read(), expected)
    with pytest.raises(tessera.InvalidArgumentError):
        w.read(out=np.empty((12, 8), np.float64))
    with pytest.raises(tessera.InvalidArgumentError):
        w.write((0, 0), np.zeros((2, 2), np.int32))
    with pytest.raises(tessera.OutOfRangeError):
        w.write((11, 0), np.zeros((2, 8), np.float32))


def test_remote_shards_list_open_delete_reshard(client, rows4):
    values = np.arange(16 * 4, dtype=np.int32).reshape(16, 4)
    client.put("b", values, rows4)
    client.put("a", values[:4], tessera.chunk(0, ["rank:1/cpu"]))
    assert [t.name for t in client.list()] == ["a", "b"]
    b = client.open("b")
    offsets, sizes, shard = b.remote_shards()[2].to_here()
    assert offsets == (8, 0) and sizes == (4, 4)
    np.testing.assert_array_equal(shard, values[8:12])
    spec2 = tessera.parse_spec("chunk:dim=1:rank:0/cpu,rank:1/cpu")
    c = client.reshard("b", spec2)
    assert c.tensor_id != b.tensor_id and len(c.shards) == 2
    np.testing.assert_array_equal(c.read(), values)
    # The old layout leaves once every daemon confirmed the reshard; b's
    # reads then come from the new one, each value in its place, and its
    # old shards are not served.
    for _ in range(100):
        np.testing.assert_array_equal(b.read(), values)
        np.testing.assert_array_equal(b[3:9, 1:3], values[3:9, 1:3])
        try:
            b.remote_shards()[2].to_here()
        except tessera.NotFoundError:
            break
        time.sleep(0.05)
    else:
        pytest.fail("the old layout is still served")
    client.delete("a")
    with pytest.raises(tessera.NotFoundError) as e:
        client.open("a")
    assert isinstance(e.value, KeyError) and e.value.code == "NOT_FOUND"
    np.testing.assert_array_equal(client.gather("b"), values)


def test_reshard_to_any_layout(client):
    """3 shards on 4 ranks to 4; to several shards per rank with a rank
    holding none; to explicit uneven boxes: the values stay each time."""
    values = np.arange(10 * 7, dtype=np.float32).reshape(10, 7)
    t = client.put("any", values, tessera.chunk(
        0, ["rank:0/cpu", "rank:1/cpu", "rank:2/cpu"]))
    for spec, ranks in [
            (tessera.chunk(0, [f"rank:{r}/cpu" for r in (3, 2, 1, 0)]),
             [3, 2, 1, 0]),
            (tessera.chunk(1, [f"rank:{r}/cpu" for r in (3, 0, 3, 0, 2)]),
             [3, 0, 3, 0, 2]),
            (tessera.parse_spec("enum:0,0:3,5@rank:2/cpu;0,5:3,2@rank:2/cpu;"
                                "3,0:7,7@rank:1/cpu"), [2, 2, 1])]:
        t = client.reshard("any", spec)
        assert [s.rank for s in t.shards] == ranks
        np.testing.assert_array_equal(t.read(), values)
    with pytest.raises(tessera.InvalidArgumentError):
        client.reshard("any", tessera.chunk(0, ["rank:9/cpu"]))
    assert client.open("any").tensor_id == t.tensor_id
    client.delete("any")


def test_save_and_load(client, rows4):
    values = np.random.default_rng(3).standard_normal((20, 5))
    client.put("w", values, rows4)
    assert client.save("ckpt-py") == ["w"]
    with pytest.raises(tessera.AlreadyExistsError):
        client.save("ckpt-py")
    client.save("ckpt-py", overwrite=True)
    client.delete("w")
    spec2 = tessera.parse_spec("chunk:dim=1:rank:0/cpu,rank:1/cpu")
    [loaded] = client.load("ckpt-py", names=["w"], as_names=["v"], spec=spec2)
    assert loaded.name == "v" and len(loaded.shards) == 2
    np.testing.assert_array_equal(loaded.read(), values)
    with pytest.raises(tessera.AlreadyExistsError):
        client.load("ckpt-py", names=["w"], as_names=["v"])
    client.load("ckpt-py", names=["w"], as_names=["v"], replace=True)
    with pytest.raises(tessera.NotFoundError):
        client.load("no-such-checkpoint")


def test_bfloat16_reads_with_cast_and_writes_rounded(client, rows4):
    # numpy has no bfloat16: values go in as numbers (rounded to nearest
    # even, as torch does) and come out with cast=, or as bits.
    values = np.array([[1.0, -2.5, 3.140625, 65504.0],
                       [1e-3, np.inf, -np.inf, 0.0]] * 4, np.float32)
    w = client.create("w", values.shape, rows4, dtype="bfloat16")
    w.write((0, 0), values)
    expected = np.array([[1.0, -2.5, 3.140625, 65536.0],
                         [0.00099945068359375, np.inf, -np.inf, 0.0]] * 4,
                        np.float32)
    got = w.read(cast="float32")
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(w.read(cast=np.float64), expected)
    np.testing.assert_array_equal(
        w.read_region((1, 1), (2, 2), cast="float32"), expected[1:3, 1:3])
    bits = np.empty(values.shape, np.uint16)
    assert w.read(out=bits) is bits
    assert bits[0, 0] == 0x3F80  # 1.0
    out = np.empty(values.shape, np.float32)
    assert w.read(out=out, cast="float32") is out
    np.testing.assert_array_equal(out, expected)
    with pytest.raises(tessera.InvalidArgumentError, match="cast"):
        w.read(cast="no-such-dtype")
    with pytest.raises(tessera.InvalidArgumentError, match="shape"):
        w.read_region((0, 0), (1, 4), out=out, cast="float32")  # no broadcast
    _, _, shard = w.remote_shards()[1].to_here(cast="float32")
    np.testing.assert_array_equal(shard, expected[2:4])
    w[0, 0] = 7.0
    w[1, :] = np.nan
    got = w.read(cast="float32")
    assert got[0, 0] == 7.0 and np.isnan(got[1]).all()
    # Integers are numbers, not bits.
    w.write((0, 0), np.full(values.shape, 3, np.int16))
    np.testing.assert_array_equal(w.read(cast="float32"),
                                  np.full(values.shape, 3, np.float32))


def test_every_error_class(client, rows4):
    client.create("t", (4, 4), rows4)
    with pytest.raises(tessera.AlreadyExistsError):
        client.create("t", (4, 4), rows4)
    with pytest.raises(tessera.InvalidArgumentError) as e:
        client.create("bad name!", (4,), rows4)
    assert isinstance(e.value, ValueError)
    with pytest.raises(tessera.InvalidArgumentError):
        tessera.parse_spec("chunk:dim=0")
    with pytest.raises(tessera.InvalidArgumentError):
        client.create("u", (4,), rows4, dtype="no-such-dtype")
    with pytest.raises(tessera.InvalidArgumentError):
        client.create("u", (4,), rows4, init="no-such-init")
    # As torch.full: a fill value the dtype cannot hold is refused.
    for dtype, value in [("int8", 300), ("int32", float("nan")),
                         ("float16", 70000), ("uint8", 256)]:
        with pytest.raises(tessera.InvalidArgumentError,
                           match="without overflow"):
            client.create("u", (4,), rows4, dtype=dtype, init="full",
                          fill_value=value)
    with pytest.raises(tessera.InvalidArgumentError):
        client.create("u", (4,), tessera.chunk(0, ["rank:9/cpu"]))
    b16 = client.create("b16", (4,), rows4, dtype="bfloat16")
    assert b16.dtype_name == "bfloat16"
    for call in [lambda: b16.read(), lambda: b16[0:2], lambda: b16.dtype,
                 lambda: b16.remote_shards()[0].to_here()]:
        with pytest.raises(tessera.InvalidArgumentError, match="cast="):
            call()
    with pytest.raises(tessera.UnavailableError):
        tessera.connect("127.0.0.1:1", timeout=2)
    with pytest.raises(tessera.PermissionDeniedError, match="outside"):
        client.save("/definitely/outside/the/root")
    # A view made before a reshard writes into the new layout.
    stale = client.open("t")
    client.reshard("t", tessera.chunk(1, ["rank:0/cpu", "rank:1/cpu"]))
    stale.write((0, 0), np.full((4, 4), 5, np.float32))
    assert (client.open("t")[0:4, 0:4] == 5).all()
    published = client.create("fp", (4, 4), rows4, versions=2)
    with pytest.raises(tessera.FailedPreconditionError, match="read-only"):
        published.write((0, 0), np.zeros((4, 4), np.float32))
    for cls in [tessera.NotFoundError, tessera.AlreadyExistsError,
                tessera.InvalidArgumentError, tessera.OutOfRangeError,
                tessera.UnavailableError, tessera.DeadlineExceededError,
                tessera.DataLossError, tessera.FailedPreconditionError]:
        assert issubclass(cls, tessera.Error)


def test_timeouts_and_leases_must_be_positive_finite_seconds(daemons, client,
                                                            rows4):
    # 0, below 0 and NaN used to mean "the default"; infinity no deadline.
    t = client.put("deadlines", np.ones((4, 4), np.float32), rows4)
    client.create("deadlines_v", (4, 4), rows4, init="zeros", versions=2)
    client.begin("deadlines_v").publish()
    calls = {
        "timeout": [
            lambda v: tessera.connect(daemons.addresses[0], timeout=v),
            lambda v: t.read(timeout=v),
            lambda v: t.write((0, 0), np.ones((4, 4), np.float32),
                              timeout=v),
            lambda v: client.gather("deadlines", timeout=v),
        ],
        "lease": [lambda v: client.snapshot("deadlines_v", lease=v).release(),
                  lambda v: client.begin("deadlines_v", lease=v).publish()],
    }
    for what, tried in calls.items():
        for call in tried:
            for bad in [0, -1, float("nan"), float("inf"), 1e8, "soon"]:
                with pytest.raises(tessera.InvalidArgumentError, match=what):
                    call(bad)
            call(None)
            call(5)
    for bad in [0, -1, float("nan"), float("inf"), 1e8]:
        with pytest.raises(tessera.InvalidArgumentError, match="timeout"):
            client.watch("deadlines_v", timeout=bad)
    assert next(client.watch("deadlines_v", timeout=0.5), None) is None
    np.testing.assert_array_equal(t.read(), np.ones((4, 4), np.float32))


def test_counts_and_indices_must_be_ints_not_truncated(client, rows4):
    # int() turned 2.5 elements into 2 and version 1.9 into 1, silently.
    client.create("ints_v", (4, 4), rows4, init="zeros", versions=2)
    client.begin("ints_v").publish()
    out = np.empty((2, 2), np.float32)
    calls = [
        ("shape", lambda: client.create("ints_bad", (2.5, 4), rows4)),
        ("shape", lambda: client.create_many(
            [{"name": "ints_bad", "shape": (4, 4.0), "spec": rows4}])),
        ("versions", lambda: client.create("ints_bad", (4, 4), rows4,
                                           versions=2.5)),
        ("seed", lambda: client.create("ints_bad", (4, 4), rows4,
                                       init="randn", seed=1.5)),
        ("copies", lambda: client.create("ints_bad", (4, 4), rows4,
                                         copies=1.5)),
        ("dim", lambda: tessera.chunk(0.5, ["rank:0/cpu"])),
        ("version", lambda: client.open("ints_v").at(1.9)),
        ("versions", lambda: client.snapshot("ints_v", versions=[1.0])),
        ("offsets", lambda: client.plan_reads([("ints_v", (0.5, 0), (2, 2),
                                                out)])),
        ("sizes", lambda: client.plan_reads([("ints_v", (0, 0), ("2", 2),
                                              out)])),
        ("version", lambda: client.plan_reads(
            [("ints_v", (0, 0), (2, 2), out)]).run(version=1.0)),
        ("offsets", lambda: client.open("ints_v").read_region((0.5, 0), (2, 2))),
        ("sizes", lambda: client.open("ints_v").read_region((0, 0), (2, 2.0))),
        ("offsets", lambda: client.open("ints_v").write((0, 1.0), out)),
        ("offsets", lambda: client.open("ints_v").read_region(3, (2, 2))),
    ]
    for what, call in calls:
        with pytest.raises(TypeError, match=what):
            call()
    assert "ints_bad" not in [t.name for t in client.list()]
    # numpy integers are ints.
    plan = client.plan_reads([("ints_v", (np.int64(0), 0), (2, np.int32(2)),
                               out)])
    assert plan.run(version=np.int64(1)) == 1


def test_ints_beyond_what_the_native_calls_hold_are_refused_in_words(
        daemons, client, rows4):
    # 2**64 reached pybind11, whose TypeError listed the native signatures.
    client.create("wide_v", (4, 4), rows4, init="zeros", versions=2)
    client.begin("wide_v").publish()
    out = np.empty((2, 2), np.float32)
    v = client.open("wide_v")
    calls = [
        ("shape", lambda big: client.create("wide_bad", (big, 4), rows4)),
        ("seed", lambda big: client.create("wide_bad", (4, 4), rows4,
                                           init="randn", seed=big)),
        ("dim", lambda big: tessera.chunk(big, ["rank:0/cpu"])),
        ("data_lanes", lambda big: tessera.connect(daemons.addresses[0],
                                                   data_lanes=big)),
        ("after", lambda big: client.watch("wide_v", after=big)),
        ("versions", lambda big: client.snapshot("wide_v", versions=[big])),
        ("version", lambda big: v.at(big)),
        ("offsets", lambda big: v.read_region((big, 0), (2, 2))),
        ("sizes", lambda big: v.read_region((0, 0), (2, big))),
        ("version", lambda big: client.plan_reads(
            [("wide_v", (0, 0), (2, 2), out)]).run(version=big)),
        ("versions", lambda big: client.load("no-such-checkpoint",
                                             versions=big)),
    ]
    for what, call in calls:
        for big in [2**64, -2**64] + ([] if what == "seed" else [2**63]):
            with pytest.raises(tessera.InvalidArgumentError,
                               match=f"{what} must be an integer from"):
                call(big)
    # Those with ranges of their own keep their words.
    with pytest.raises(tessera.InvalidArgumentError,
                       match="versions must be between 1 and 64"):
        client.create("wide_bad", (4, 4), rows4, versions=2**64)
    with pytest.raises(tessera.InvalidArgumentError,
                       match="copies must be between 1"):
        client.create("wide_bad", (4, 4), rows4, copies=2**64)
    assert "wide_bad" not in [t.name for t in client.list()]
    # The widest a native int holds still goes through to its own check.
    with pytest.raises(tessera.OutOfRangeError, match="leaves the tensor"):
        v.read_region((2**63 - 1, 0), (1, 1))


def test_errors_quoting_megabytes_of_input_stay_short(client):
    """A parser quoting what it was given (a spec, a dtype, an address, a
    name of a megabyte) raises an error of at most 2 KiB, cut in its
    middle, as a daemon's errors reach a client."""
    huge = "q" * (1 << 20)
    calls = [lambda: tessera.parse_spec(huge),
             lambda: client.create("ok", (4,), tessera.chunk(0, ["rank:0/cpu"]),
                                   dtype=huge),
             lambda: tessera.connect(huge, timeout=5),
             lambda: client.open(huge)]
    for call in calls:
        with pytest.raises(tessera.Error) as e:
            call()
        assert len(str(e.value)) <= 2100, str(e.value)[:200]
    with pytest.raises(tessera.InvalidArgumentError, match="bytes cut"):
        tessera.parse_spec(huge)


def test_concurrent_readers(client, rows4):
    values = np.arange(64 * 256, dtype=np.float64).reshape(64, 256)
    w = client.put("w", values, rows4)
    failures = []

    def reader(seed):
        rng = np.random.default_rng(seed)
        for _ in range(30):
            r, c = int(rng.integers(0, 60)), int(rng.integers(0, 250))
            got = w[r:r + 4, c:c + 6]
            if not np.array_equal(got, values[r:r + 4, c:c + 6]):
                failures.append((r, c))

    threads = [threading.Thread(target=reader, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []


def test_a_daemon_killed_mid_read_is_an_exception_within_the_deadline():
    cluster = Daemons(world=2)
    try:
        c = tessera.connect(cluster.addresses[0], timeout=10)
        spec = tessera.chunk(0, ["rank:0/cpu", "rank:1/cpu"])
        w = c.create("big", (8192, 4096), spec, init="ones")  # 128 MiB
        result = {}

        def read():
            start = time.monotonic()
            try:
                for _ in range(50):
                    w.read(timeout=8)
            except tessera.Error as e:
                result["error"] = e
            result["seconds"] = time.monotonic() - start

        t = threading.Thread(target=read)
        t.start()
        time.sleep(0.3)
        cluster.kill(1)
        t.join(timeout=30)
        assert not t.is_alive()
        assert isinstance(result.get("error"),
                          (tessera.UnavailableError,
                           tessera.DeadlineExceededError)), result
        assert "rank 1" in str(result["error"])
    finally:
        cluster.stop()


# A child process reads and writes while the owner of half the tensor is
# stalled (SIGSTOP) and gets a real SIGINT 0.5 s into each call: every one
# ends with KeyboardInterrupt at once, not at its (default, 300 s) deadline,
# and neither write lands when the daemon resumes (its bytes sat in the
# daemon's socket buffer, over the data plane and over gRPC).
CTRL_C_CHILD = r"""
import os, signal, sys, threading, time
import numpy as np
import tessera

c = tessera.connect(sys.argv[1], timeout=60)
w = c.open("w")
print("ready", flush=True)
sys.stdin.readline()

def interrupted(label, call):
    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
    start = time.monotonic()
    try:
        call()
        print(label, "finished", flush=True)
    except KeyboardInterrupt:
        print(label, "interrupted", round(time.monotonic() - start, 2),
              flush=True)

interrupted("4KiB-read", lambda: w[1500, :])
interrupted("8MiB-read", lambda: w.read())
interrupted("to_here", lambda: w.remote_shards()[1].to_here())
interrupted("4KiB-write", lambda: w.__setitem__(1500, 2.0))
# A column box is no dense run of the shard: it goes through gRPC's
# WriteRegion, not the data plane.
interrupted("column-write",
            lambda: w.__setitem__((slice(1600, 1604), 0), 2.0))
print("done", flush=True)
"""


def test_ctrl_c_stops_a_transfer_waiting_on_a_stalled_daemon():
    cluster = Daemons(world=2, extra=["--timeout", "60"])
    child = None
    try:
        c = tessera.connect(cluster.addresses[0], timeout=30)
        spec = tessera.chunk(0, ["rank:0/cpu", "rank:1/cpu"])
        w = c.create("w", (2048, 1024), spec, init="ones")  # 8 MiB
        child = subprocess.Popen(
            [sys.executable, "-c", CTRL_C_CHILD, cluster.addresses[0]],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True)
        assert child.stdout.readline().strip() == "ready"
        try:
            cluster.pause(1)
            child.stdin.write("go\n")
            child.stdin.flush()
            out, _ = child.communicate(timeout=60)
        finally:
            cluster.resume(1)
        print(out)  # shown with -s: how long each took to stop
        lines = out.split("\n")
        assert "done" in lines, out
        for label in ["4KiB-read", "8MiB-read", "to_here", "4KiB-write",
                      "column-write"]:
            line = next(l for l in lines if l.startswith(label + " "))
            _, verdict, *seconds = line.split()
            assert verdict == "interrupted", out
            assert float(seconds[0]) < 5, out
        # Resumed, the stalled daemon's rows read and write again.
        w[1500, :] = 3.0
        np.testing.assert_array_equal(w[1499:1501, 0], [1.0, 3.0])
        # The daemon had time to apply the interrupted column write (the
        # write above came after it); it did not.
        time.sleep(0.5)
        np.testing.assert_array_equal(w[1599:1605, 0], np.ones(6))
    finally:
        if child is not None and child.poll() is None:
            child.kill()
        cluster.stop()


def test_an_interrupted_transfer_stops_and_the_client_goes_on(client, rows4):
    # What Ctrl-C does: Python's signal handler raises KeyboardInterrupt
    # while the transfer runs; the progress callback raises it the same
    # way, at the first look (50 ms in), deterministically.
    data = np.ones((64 * 1024, 1024), np.float32)  # 256 MiB
    w = client.create("w", data.shape, rows4, init="zeros")
    seen = []

    def interrupt(done, total):
        seen.append((done, total))
        raise KeyboardInterrupt

    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        w._native.write([0, 0], data, 60.0, interrupt)
    assert seen and seen[0][1] == data.nbytes
    assert time.monotonic() - start < 30
    with pytest.raises(KeyboardInterrupt):
        w._native.read_region([0, 0], list(data.shape), None, 60.0, interrupt)
    # Nothing is left broken: the next transfers work.
    w[0:4] = np.full((4, 1024), 2, np.float32)
    np.testing.assert_array_equal(w[0:4], np.full((4, 1024), 2, np.float32))


def test_progress_reports_every_byte(client, rows4, capsys):
    pytest.importorskip("tqdm", reason="python3-tqdm is not installed")
    data = np.arange(4 * 1024 * 1024, dtype=np.float32).reshape(-1, 1024)
    w = client.put("w", data, rows4)
    seen = []
    w._native.read_region([0, 0], list(data.shape), None, 60.0,
                          lambda done, total: seen.append((done, total)))
    assert seen[-1] == (data.nbytes, data.nbytes)
    np.testing.assert_array_equal(w.read(progress=True), data)
    w.write((0, 0), data, progress=True)


FORK_CHILD = r"""
import os, sys, time, numpy as np, tessera
address = sys.argv[1]
c = tessera.connect(address, timeout=30)
t = c.open("fork_t")
out = np.empty(t.shape, np.float32)
plan = c.plan_reads([("fork_t", (0, 0), t.shape, out)])
plan.run()
watch = c.watch("fork_t")
pid = os.fork()
if pid == 0:
    for label, call in [("connect", lambda: tessera.connect(address)),
                        ("open", lambda: c.open("fork_t")),
                        ("read", lambda: t.read()),
                        ("plan", lambda: plan.run()),
                        ("watch", lambda: next(watch))]:
        start = time.monotonic()
        try:
            call()
            print(label, "worked", flush=True)
        except tessera.FailedPreconditionError as e:
            ok = "forked" in str(e) and time.monotonic() - start < 5
            print(label, "refused" if ok else "slow", flush=True)
    sys.exit(0)  # the interpreter's own exit: inherited clients destroyed
_, status = os.waitpid(pid, 0)
print("child status", status, flush=True)
plan.run()
assert (out == 1).all() and (t.read() == 1).all()
print("parent goes on", flush=True)
"""


def test_a_child_forked_after_connecting_is_refused_not_hung(daemons, client,
                                                             rows4):
    # gRPC does not survive fork(): such a child's calls waited forever
    # (past their deadlines), and its interpreter's exit aborted.
    client.create("fork_t", (256, 64), rows4, init="ones", versions=2)
    client.begin("fork_t").publish()
    done = subprocess.run([sys.executable, "-c", FORK_CHILD,
                           daemons.addresses[0]],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.split("\n")[:-1] == [
        "connect refused", "open refused", "read refused", "plan refused",
        "watch refused", "child status 0", "parent goes on"], done.stdout
