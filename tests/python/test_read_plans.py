"""Read plans and state-dict publishing from Python (docs/weight_sync.md) on
the session's real daemons: boxes into numpy and torch outs, casts as torch
rounds, fused destinations, a reshard between runs, runs of a group being
published never mixed, and the refusals."""

import threading
import time

import numpy as np
import pytest
import torch

import tessera
import tessera.torch as tt


def test_plan_reads_boxes_casts_and_fused_outs(client, rows4):
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((16, 12)).astype(np.float32)
               for _ in range(3))
    for name, value in (("pq", q), ("pk", k), ("pv", v)):
        client.put(name, value, rows4)
    half = np.empty((16, 6), np.float32)
    as16 = torch.empty((16, 12), dtype=torch.float16)
    asbf = torch.empty((16, 12), dtype=torch.bfloat16)
    qkv = np.empty((48, 6), np.float32)
    plan = client.plan_reads([
        ("pq", (0, 6), (16, 6), half),
        ("pq", (0, 0), (16, 12), as16),
        ("pk", (0, 0), (16, 12), asbf),
        ([("pq", (0, 6), (16, 6), (0, 0)), ("pk", (0, 6), (16, 6), (16, 0)),
          ("pv", (0, 6), (16, 6), (32, 0))], qkv),
    ])
    assert isinstance(plan, tessera.ReadPlan)
    assert plan.bytes == 4 * (16 * 6 + 2 * 16 * 12 + 48 * 6)
    assert sorted(plan.names) == ["pk", "pq", "pv"]
    assert sum(s["bytes"] for s in plan.sources()) == plan.bytes
    assert plan.run() == 0  # unversioned
    assert (half == q[:, 6:]).all()
    assert torch.equal(as16, torch.from_numpy(q).to(torch.float16))
    assert torch.equal(asbf, torch.from_numpy(k).to(torch.bfloat16))
    assert (qkv == np.concatenate([q[:, 6:], k[:, 6:], v[:, 6:]])).all()
    assert plan.plans == 1 and not plan.replanned


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_plan_reads_into_cuda_tensors(client, rows4):
    value = np.arange(16 * 12, dtype=np.float32).reshape(16, 12)
    client.put("pc", value, rows4)
    half = torch.empty((16, 6), dtype=torch.bfloat16, device="cuda")
    whole = torch.empty((16, 12), dtype=torch.float32, device="cuda")
    plan = client.plan_reads([("pc", (0, 6), (16, 6), half),
                              ("pc", (0, 0), (16, 12), whole)])
    plan.run()
    assert torch.equal(half.cpu(),
                       torch.from_numpy(value[:, 6:]).to(torch.bfloat16))
    assert torch.equal(whole.cpu(), torch.from_numpy(value))


def test_plan_replans_after_a_reshard(client, rows4):
    value = np.arange(32 * 8, dtype=np.float32).reshape(32, 8)
    client.put("pr", value, rows4)
    out = np.zeros((10, 8), np.float32)
    plan = client.plan_reads([("pr", (11, 0), (10, 8), out)])
    plan.run()
    assert (out == value[11:21]).all()
    client.reshard("pr", tessera.chunk(1, ["rank:3/cpu", "rank:1/cpu"]))
    # The old layout may still be served while the daemons confirm the
    # reshard (the same values); once it is gone, a run plans again.
    for _ in range(100):
        out[:] = 0
        plan.run()
        assert (out == value[11:21]).all()
        if plan.replanned:
            break
        time.sleep(0.05)
    assert plan.replanned and plan.plans == 2


def test_plan_refusals(client, rows4):
    client.put("pf", np.zeros((8, 8), np.float32), rows4)
    with pytest.raises(tessera.NotFoundError, match="nope"):
        client.plan_reads([("nope", (0, 0), (2, 2), np.empty((2, 2)))])
    with pytest.raises(tessera.OutOfRangeError):
        client.plan_reads([("pf", (7, 0), (2, 2), np.empty((2, 2),
                                                           np.float32))])
    with pytest.raises(tessera.InvalidArgumentError, match="floating"):
        client.plan_reads([("pf", (0, 0), (2, 2), np.empty((2, 2),
                                                           np.int32))])
    with pytest.raises(tessera.InvalidArgumentError, match="overlap"):
        client.plan_reads([([("pf", (0, 0), (2, 2), (0, 0)),
                             ("pf", (2, 2), (2, 2), (1, 1))],
                            np.empty((4, 4), np.float32))])
    with pytest.raises(tessera.InvalidArgumentError, match="contiguous"):
        client.plan_reads([("pf", (0, 0), (2, 2),
                            np.empty((2, 4), np.float32)[:, ::2])])
    with pytest.raises(tessera.InvalidArgumentError, match="item 0"):
        client.plan_reads([("pf", (0, 0))])
    # A box into an out of another shape is a mistake, not a partial fill
    # (that is the (sources, out) form, with out_offsets).
    for out in [np.empty((3, 3), np.float32), np.empty(4, np.float32),
                torch.empty(2, 2, 1), bytearray(16)]:
        with pytest.raises(tessera.InvalidArgumentError,
                           match=r"item 0: out has shape .*box's sizes"):
            client.plan_reads([("pf", (0, 0), (2, 2), out)])
    with pytest.raises(TypeError):
        client.plan_reads("pf")
    plan = client.plan_reads([("pf", (0, 0), (2, 2),
                               np.empty((2, 2), np.float32))])
    for bad in [0, -1, float("nan"), float("inf")]:
        with pytest.raises(tessera.InvalidArgumentError, match="timeout"):
            plan.run(timeout=bad)
    with pytest.raises(tessera.InvalidArgumentError, match="negative version"):
        plan.run(version=-1)
    # A state dict's plan names the entry it refuses.
    with pytest.raises(tessera.InvalidArgumentError, match=r"like\['pf'\]"):
        tt.plan_state_dict(client, "", {"pf": torch.empty(8, 8).t()})
    # Data that is not numbers is named as such, not as a dtype.
    for bad in ["hello", [object()]]:
        with pytest.raises(TypeError, match="expected numbers"):
            client.put("pstr", bad, rows4)
        with pytest.raises(TypeError, match="expected numbers"):
            tt.publish_state_dict(client, "pstr.", {"x": bad})


def test_a_run_refuses_outs_whose_memory_moved(client, rows4):
    # A plan writes the memory its outs had when planned. An out resized or
    # given other storage since would have the run write memory it no longer
    # owns (numpy's resize frees it: the heap was corrupted) or memory its
    # caller never sees: the run refuses, writing nothing.
    client.put("pm", np.arange(64, dtype=np.float32).reshape(8, 8), rows4)
    grown = np.zeros((8, 8), np.float32)
    shrunk = np.zeros((8, 8), np.float32)
    moved = torch.zeros(8, 8)
    kept = torch.zeros(8, 8)
    plans = {name: client.plan_reads([("pm", (0, 0), (8, 8), out)])
             for name, out in [("grown", grown), ("shrunk", shrunk),
                               ("moved", moved), ("kept", kept)]}
    # Empty outs have no memory to move (torch's data_ptr() of one is 0,
    # its numpy view's is not).
    empties = client.plan_reads([("pm", (0, 0), (0, 8), torch.empty(0, 8)),
                                 ("pm", (8, 0), (0, 8), np.empty((0, 8),
                                                                 np.float32))])
    empties.run()
    grown.resize((1 << 20,), refcheck=False)
    shrunk.resize((2,), refcheck=False)
    moved.set_(torch.zeros(8, 8))
    for name in ["grown", "shrunk", "moved"]:
        with pytest.raises(tessera.InvalidArgumentError,
                           match="out of item 0 is no longer the memory it "
                                 "was planned with"):
            plans[name].run()
    assert not grown.any() and not shrunk.any() and not moved.any()
    plans["kept"].run()
    assert kept.sum() == sum(range(64))
    fresh = client.plan_reads([("pm", (0, 0), (8, 8), moved)])
    fresh.run()
    assert torch.equal(moved, kept)


def test_empty_boxes_read_nothing(client, rows4):
    # numpy gives an empty array strides of 0: not elements sharing memory.
    client.put("pe", np.ones((8, 8), np.float32), rows4)
    empty = np.empty((0, 8), np.float32)
    assert empty.strides == (0, 0)
    plan = client.plan_reads([("pe", (8, 0), (0, 8), empty)])
    assert plan.bytes == 0
    plan.run()
    fused = np.zeros((2, 8), np.float32)
    client.plan_reads([([("pe", (0, 0), (0, 8), (0, 0)),
                         ("pe", (6, 0), (2, 8), (0, 0))], fused)]).run()
    np.testing.assert_array_equal(fused, np.ones((2, 8), np.float32))
    assert client.open("pe").read_region((3, 0), (0, 8), out=empty) is empty


def test_published_state_dicts_are_read_whole_by_plans(client):
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.ReLU(),
                                torch.nn.Linear(96, 32))
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    first = tt.publish_state_dict(client, "ws.", sd)
    assert first >= 2
    # A TP=2 reader: column halves of the weights, biases whole, in bf16.
    like = {}
    for name, value in sd.items():
        if value.dim() == 2:
            cols = value.shape[1] // 2
            like[name] = (torch.empty(value.shape[0], cols,
                                      dtype=torch.bfloat16), (0, cols))
        else:
            like[name] = torch.empty(value.shape, dtype=torch.float32)
    plan = tt.plan_state_dict(client, "ws.", like)
    stop = threading.Event()
    published = []

    def trainer():
        for step in range(12):
            for value in sd.values():
                value.fill_(float(step + 10))
            published.append(tt.publish_state_dict(client, "ws.", sd))
        stop.set()

    thread = threading.Thread(target=trainer)
    thread.start()
    runs = 0
    while not stop.is_set() or runs < 3:
        n = plan.run(timeout=30)
        runs += 1
        values = set()
        for name, value in like.items():
            t = value[0] if isinstance(value, tuple) else value
            values.update(t.float().unique().tolist())
        if n != first:
            # Every tensor of the run holds the one value of its version.
            assert values == {float(n - first - 1 + 10)}, (n, values)
    thread.join()
    assert published == sorted(published)
    assert plan.run() == published[-1]
    assert plan.plans == 1 and not plan.pinned


def test_get_state_dict_never_mixes_versions(client):
    """get_state_dict read tensor by tensor: a publish landing between two
    reads gave a state dict half old, half new."""
    sd = {f"l{i}.weight": torch.zeros(48, 40) for i in range(6)}
    first = tt.publish_state_dict(client, "gs.", sd)
    like = {name: torch.empty(40, 48).t() for name in sd}  # any strides
    like["l0.weight"] = (torch.empty(8, 40, dtype=torch.bfloat16), (16, 0))
    stop = threading.Event()
    published = [first]

    def trainer():
        step = 0
        while not stop.is_set() and step < 400:
            step += 1
            for value in sd.values():
                value.fill_(float(step))
            published.append(tt.publish_state_dict(client, "gs.", sd))

    thread = threading.Thread(target=trainer)
    thread.start()
    overlapped = reads = 0
    try:
        while overlapped < 20 and thread.is_alive():
            before = len(published)
            tt.get_state_dict(client, "gs.", like)
            reads += 1
            overlapped += len(published) != before
            values = set()
            for value in like.values():
                t = value[0] if isinstance(value, tuple) else value
                values.update(t.float().unique().tolist())
            assert len(values) == 1, (reads, values)
    finally:
        stop.set()
        thread.join()
    # Reads that a publish overlapped are what this test is about.
    assert overlapped >= 20, (overlapped, reads)


def test_write_many_writes_every_box_in_one_call(client, rows4):
    client.create("wm.a", (8, 4), rows4, versions=2)
    client.create("wm.b", (6,), tessera.chunk(0, ["rank:1/cpu"]),
                  dtype="bfloat16", versions=2)
    client.create("wm.c", (3,), tessera.chunk(0, ["rank:2/cpu"]),
                  dtype="int64", versions=2)
    big = np.arange(4 * 40000, dtype=np.float32).reshape(4, 40000)
    client.create("wm.big", big.shape, rows4, versions=2)  # over 64 KiB
    with client.begin(["wm.a", "wm.b", "wm.c", "wm.big"], empty=True) as g:
        g.write_many([
            ("wm.a", (2, 0), np.full((4, 4), 3, np.float32)),
            ("wm.a", [0, 0], torch.ones(2, 4)),
            ("wm.a", (6, 0), np.full((2, 4), 7, np.float32).T.copy().T),
            ("wm.b", (0,), torch.tensor([1.5, 2, 3, 4, 5, 6.25],
                                        dtype=torch.bfloat16)),
            ("wm.c", (0,), np.array([5, 6, 7])),
            ("wm.big", (0, 0), big),
        ])
    a = client.open("wm.a").read()
    assert (a[:2] == 1).all() and (a[2:6] == 3).all() and (a[6:] == 7).all()
    assert tt.read(client.open("wm.b")).float().tolist() == [
        1.5, 2, 3, 4, 5, 6.25]
    assert client.open("wm.c").read().tolist() == [5, 6, 7]
    assert (client.open("wm.big").read() == big).all()
    # Refused before any byte moves: a name not in the group, a dtype the
    # tensor cannot take, offsets that are not integers.
    g = client.begin(["wm.a", "wm.c"])
    with pytest.raises(tessera.NotFoundError, match="wm.x"):
        g.write_many([("wm.c", (0,), np.array([9, 9, 9])),
                      ("wm.x", (0,), np.zeros(3))])
    with pytest.raises(tessera.InvalidArgumentError, match="bfloat16"):
        g.write_many([("wm.a", (0, 0), torch.zeros(8, 4,
                                                   dtype=torch.bfloat16))])
    with pytest.raises(TypeError, match="offsets"):
        g.write_many([("wm.a", (0.5, 0), np.zeros((8, 4), np.float32))])
    # A box outside its tensor fails the call, naming the tensor.
    with pytest.raises(tessera.OutOfRangeError, match="wm.a"):
        g.write_many([("wm.c", (0,), np.array([8, 8, 8])),
                      ("wm.a", (6, 0), np.zeros((4, 4), np.float32))])
    # Boxes of one tensor that share elements: written in no order, they
    # would leave those elements with either's bytes; refused whole.
    # The message names the two boxes by their place in the list.
    with pytest.raises(tessera.InvalidArgumentError,
                       match=r"box 1 \(offsets \[0, 0\], sizes \[4, 4\]\) "
                             r"and box 3 \(offsets \[3, 3\], sizes "
                             r"\[2, 1\]\) of tensor wm.a version \d+ "
                             r"overlap"):
        g.write_many([("wm.c", (0,), np.array([8, 8, 8])),
                      ("wm.a", (0, 0), np.zeros((4, 4), np.float32)),
                      ("wm.a", (4, 0), np.zeros((4, 2), np.float32)),
                      ("wm.a", (3, 3), np.zeros((2, 1), np.float32))])
    # Apart, or of different tensors, they are written.
    g.write_many([("wm.a", (0, 0), np.zeros((4, 4), np.float32)),
                  ("wm.a", (4, 0), np.zeros((4, 2), np.float32)),
                  ("wm.a", (4, 2), np.zeros((4, 2), np.float32)),
                  ("wm.c", (0,), np.array([1, 2, 3]))])
    g.abort()
    assert client.open("wm.c").read().tolist() == [5, 6, 7]


def test_a_plan_never_reads_a_version_still_open(client, rows4):
    """Two tensors numbered alike by chance: one publishes version 2 while
    the other holds its own version 2 open, written but not published. A
    run reads the first one's 2 and the second one's 1 (one point of the
    log), never the open version's bytes."""
    client.create("na.a", (8, 4), rows4, versions=2, init="zeros")
    client.create("na.b", (8, 4), rows4, versions=2, init="zeros")
    a = np.full((8, 4), -1, np.float32)
    b = np.full((8, 4), -1, np.float32)
    plan = client.plan_reads([("na.a", (0, 0), (8, 4), a),
                              ("na.b", (0, 0), (8, 4), b)])
    assert plan.run() == 1
    assert (a == 0).all() and (b == 0).all()
    open_b = client.begin(["na.b"])
    open_b.write_many([("na.b", (0, 0), np.full((8, 4), 9, np.float32))])
    with client.begin(["na.a"]) as g:
        g.write_many([("na.a", (0, 0), np.full((8, 4), 2, np.float32))])
    for _ in range(2):
        assert plan.run() == 2
        assert (a == 2).all()
        assert (b == 0).all(), "read the open version"
    open_b.abort()
    assert client.open("na.b").read().max() == 0


def test_create_many_is_one_call_all_or_none(client, rows4):
    made = client.create_many([
        {"name": f"cm.{i}", "shape": (8, 4), "spec": rows4,
         "init": "full", "fill_value": i, "versions": 2 if i % 2 else None}
        for i in range(20)])
    assert [t.name for t in made] == [f"cm.{i}" for i in range(20)]
    assert (made[7].read() == 7).all() and made[7].versioned
    assert not made[6].versioned
    with pytest.raises(tessera.AlreadyExistsError, match="cm.3"):
        client.create_many([{"name": "cn.0", "shape": (4,), "spec": rows4},
                            {"name": "cm.3", "shape": (4,), "spec": rows4}])
    with pytest.raises(tessera.InvalidArgumentError, match="named twice"):
        client.create_many([{"name": "cn.0", "shape": (4,), "spec": rows4}] * 2)
    with pytest.raises(tessera.InvalidArgumentError, match="name, shape"):
        client.create_many([{"name": "cn.0"}])
    assert "cn.0" not in {t.name for t in client.list()}


def test_delete_many_is_one_call_all_or_none(client, rows4):
    client.create_many([{"name": f"dm.{i}", "shape": (8, 4), "spec": rows4,
                         "versions": 2 if i % 2 else None}
                        for i in range(12)])
    held = lambda: sorted(t.name for t in client.list()
                          if t.name.startswith("dm."))
    # One unknown name, or one named twice: nothing is deleted.
    with pytest.raises(tessera.NotFoundError, match="dm.nope"):
        client.delete_many(["dm.0", "dm.nope", "dm.1"])
    with pytest.raises(tessera.InvalidArgumentError, match="named twice"):
        client.delete_many(["dm.2", "dm.3", "dm.2"])
    with pytest.raises(tessera.InvalidArgumentError, match="list of names"):
        client.delete_many("dm.4")
    # A name that is not a str is refused, not turned into the name of
    # another tensor ("None", "3").
    client.create_many([{"name": "None", "shape": (4,), "spec": rows4}])
    with pytest.raises(TypeError, match="each name must be a str"):
        client.delete_many(["dm.4", None])
    client.open("None").read()
    with pytest.raises(TypeError, match="tensor 1: name must be a str"):
        client.create_many([{"name": "dm.new", "shape": (4,), "spec": rows4},
                            {"name": 3, "shape": (4,), "spec": rows4}])
    with pytest.raises(tessera.NotFoundError):
        client.open("dm.new")
    client.delete("None")
    assert len(held()) == 12
    client.delete_many([])
    client.delete_many([f"dm.{i}" for i in range(10)])
    assert held() == ["dm.10", "dm.11"]
    with pytest.raises(tessera.NotFoundError):
        client.open("dm.3")
    # The names are free again, for tensors of another shape.
    client.create_many([{"name": "dm.3", "shape": (4,), "spec": rows4}])
    assert client.open("dm.3").shape == (4,)


def test_delete_many_past_one_call_says_what_it_deleted(client, rows4):
    names = [f"dx.{i}" for i in range(4100)]
    client.create_many([{"name": n, "shape": (1,), "spec": rows4}
                        for n in names[:4096]])
    client.create_many([{"name": n, "shape": (1,), "spec": rows4}
                        for n in names[4096:]])
    held = lambda: sum(t.name.startswith("dx.") for t in client.list())
    # A name in two calls' parts is refused before the first call.
    with pytest.raises(tessera.InvalidArgumentError, match="dx.1.* twice"):
        client.delete_many(names + ["dx.1"])
    assert held() == 4100
    # The second call fails: the first one's 4096 are gone, and the error
    # says so; the second call's names are all still there.
    with pytest.raises(tessera.NotFoundError,
                       match="first 4096 of 4101 names were deleted.*dx.gone"):
        client.delete_many(names + ["dx.gone"])
    assert sorted(t.name for t in client.list()
                  if t.name.startswith("dx.")) == names[4096:]
    client.delete_many(names[4096:])
    assert held() == 0


def test_put_state_dict_replaces_every_tensor(client):
    first = tt.put_state_dict(client, "pr.", {"a": torch.ones(4, 8),
                                             "b": torch.ones(8)})
    again = tt.put_state_dict(client, "pr.", {"a": torch.full((4, 8), 2.0),
                                             "b": torch.full((8,), 3.0)})
    assert first["a"].tensor_id != again["a"].tensor_id
    assert (client.open("pr.a").read() == 2).all()
    assert (client.open("pr.b").read() == 3).all()
    with pytest.raises(tessera.AlreadyExistsError, match="pr.a"):
        tt.put_state_dict(client, "pr.", {"a": torch.ones(4, 8)},
                          replace=False)


def test_a_state_dict_that_changed_shape_or_dtype_is_refused_whole(client):
    sd = {"a": torch.ones(4, 8), "b": torch.ones(8)}
    first = tt.publish_state_dict(client, "sc.", sd)
    for name, changed in [("b", torch.zeros(5)),
                          ("b", torch.zeros(8, dtype=torch.float64)),
                          ("b", torch.zeros(8, dtype=torch.bfloat16))]:
        with pytest.raises(tessera.InvalidArgumentError,
                           match=f"sc.{name} holds float32 \\[8\\]"):
            tt.publish_state_dict(client, "sc.", {"a": torch.zeros(4, 8),
                                                  name: changed})
    # Nothing was begun or written: "a" still holds the first version, and
    # the next publish is the one after it.
    assert client.open("sc.a").versions() == [first - 1, first]
    assert (client.open("sc.a").read() == 1).all()
    assert tt.publish_state_dict(client, "sc.", sd) == first + 1
    # A part outside its full shape, or nothing at all, is refused before
    # anything is created.
    for shapes, offsets in [({"a": (2, 8)}, None),
                            ({"a": (8, 8)}, {"a": (6, 0)}),
                            ({"a": (8, 8)}, {"a": (-1, 0)}),
                            ({"a": (8,)}, {"a": (0, 0)})]:
        with pytest.raises(tessera.InvalidArgumentError,
                           match="does not lie inside the full shape"):
            tt.publish_state_dict(client, "sd_part.", sd, shapes=shapes,
                                  offsets=offsets)
    with pytest.raises(tessera.InvalidArgumentError, match="empty"):
        tt.publish_state_dict(client, "sd_part.", {})
    assert not [t for t in client.list() if t.name.startswith("sd_part.")]


def test_a_published_tensor_resharded_between_runs(daemons, client):
    # Versioned tensors (a published state dict) keep their latest version
    # through a reshard (docs/versions.md, "Resharding"): the plan's next
    # run reads the same version from the new layout, and the trainer goes
    # on publishing into it.
    sd = {"w": torch.arange(24 * 8, dtype=torch.float32).reshape(24, 8),
          "b": torch.arange(8, dtype=torch.float32)}
    first = tt.publish_state_dict(client, "rs.", sd)
    out = np.zeros((24, 4), np.float32)
    plan = client.plan_reads([("rs.w", (0, 4), (24, 4), out)])
    assert plan.run() == first
    assert (out == sd["w"][:, 4:].numpy()).all()
    resharded = client.reshard("rs.w",
                               tessera.chunk(1, ["rank:2/cpu", "rank:0/cpu"]))
    assert len(resharded.shards) == 2
    # While a version is open the reshard waits (asking again) up to its
    # client's timeout, then ends ABORTED having applied nothing.
    impatient = tessera.connect(daemons.addresses[0], timeout=1.5)
    with pytest.raises(tessera.AbortedError, match="open version"):
        with client.begin(["rs.w"]):
            impatient.reshard("rs.w", tessera.chunk(0, ["rank:1/cpu"]))
    assert len(client.open("rs.w").shards) == 2
    for _ in range(100):
        out[:] = 0
        assert plan.run() == first
        assert (out == sd["w"][:, 4:].numpy()).all()
        if plan.replanned:
            break
        time.sleep(0.05)
    assert plan.replanned
    sd["w"] += 1000
    second = tt.publish_state_dict(client, "rs.", sd)
    assert second > first
    assert plan.run() == second
    assert (out == sd["w"][:, 4:].numpy()).all()
    assert client.open("rs.w").shards == resharded.shards


def test_a_reshard_waits_for_the_trainer_to_publish(client):
    # A trainer holds a version open while an operator reshards: the
    # reshard goes through once the version is published, and moves it.
    sd = {"w": torch.zeros(16, 8)}
    first = tt.publish_state_dict(client, "rw.", sd)
    opened = threading.Event()

    def trainer():
        with client.begin("rw.w") as v:
            opened.set()
            time.sleep(0.5)
            v[...] = np.full((16, 8), 7, np.float32)

    thread = threading.Thread(target=trainer)
    thread.start()
    assert opened.wait(10)
    started = time.monotonic()
    moved = client.reshard("rw.w", tessera.chunk(1, ["rank:3/cpu",
                                                     "rank:1/cpu"]))
    waited = time.monotonic() - started
    thread.join(10)
    assert waited > 0.2
    assert moved.version == first + 1
    assert len(moved.shards) == 2
    assert (moved.read() == 7).all()
