"""tessera.torch: torch tensors in and out without copies, specs both
ways, state dicts (skipped when torch is absent)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")

import tessera  # noqa: E402
import tessera.torch as tt  # noqa: E402

try:
    from torch.distributed._shard.sharding_spec import (
        ChunkShardingSpec, EnumerableShardingSpec)
    from torch.distributed._shard.metadata import ShardMetadata
    SHARD_ERROR = None
except Exception as e:  # Debian's torch 1.13 under Python 3.11
    SHARD_ERROR = e


# Stand-ins with the attributes of torch's classes (spec_from_torch reads
# only those), so the conversion is checked where torch.distributed._shard
# does not import.
class _RemoteDevice:
    def __init__(self, text):
        self.text = text

    def __str__(self):
        return self.text


class _ShardMetadata:
    def __init__(self, offsets, sizes, placement):
        self.shard_offsets, self.shard_sizes = offsets, sizes
        self.placement = None if placement is None else _RemoteDevice(
            placement)


def test_spec_from_torch_reads_torchs_attributes():
    chunk = type("ChunkShardingSpec", (), {})()
    chunk.dim = 1
    chunk.placements = [_RemoteDevice("rank:0/cpu"),
                        _RemoteDevice("worker1/cuda:0")]
    assert tt.spec_from_torch(chunk) == tessera.parse_spec(
        "chunk:dim=1:rank:0/cpu,worker1/cuda:0")
    enum = type("EnumerableShardingSpec", (), {})()
    enum.shards = [_ShardMetadata([0, 0], [2, 4], "rank:0/cpu"),
                   _ShardMetadata([2, 0], [2, 4], "rank:1/cpu")]
    assert tt.spec_from_torch(enum) == tessera.parse_spec(
        "enum:0,0:2,4@rank:0/cpu;2,0:2,4@rank:1/cpu")
    chunk.dim = "rows"  # a named dimension, as torch refuses it
    with pytest.raises(tessera.Error, match="named"):
        tt.spec_from_torch(chunk)
    with pytest.raises(tessera.InvalidArgumentError, match="only Chunk"):
        tt.spec_from_torch(object())
    enum.shards = [_ShardMetadata([0, 0], [2, 4], "rank:0/cpu"),
                   _ShardMetadata([1, 0], [2, 4], "rank:1/cpu")]  # overlap
    with pytest.raises(tessera.InvalidArgumentError):
        tt.spec_from_torch(enum)


@pytest.mark.skipif(SHARD_ERROR is not None,
                    reason=f"torch.distributed._shard does not import: "
                    f"{SHARD_ERROR}")
def test_specs_both_ways():
    chunk = ChunkShardingSpec(dim=1, placements=["rank:0/cpu", "rank:1/cpu"])
    spec = tt.spec_from_torch(chunk)
    assert spec == tessera.parse_spec("chunk:dim=1:rank:0/cpu,rank:1/cpu")
    back = tt.spec_to_torch(spec)
    assert isinstance(back, ChunkShardingSpec) and back.dim == 1
    assert [str(p) for p in back.placements] == ["rank:0/cpu", "rank:1/cpu"]
    enum = EnumerableShardingSpec([
        ShardMetadata([0, 0], [2, 4], "rank:0/cpu"),
        ShardMetadata([2, 0], [2, 4], "rank:1/cpu")])
    spec = tt.spec_from_torch(enum)
    assert spec == tessera.parse_spec(
        "enum:0,0:2,4@rank:0/cpu;2,0:2,4@rank:1/cpu")
    back = tt.spec_to_torch(spec)
    assert [s.shard_offsets for s in back.shards] == [[0, 0], [2, 0]]


def test_tensors_in_and_out_in_place(client, rows4):
    source = torch.arange(32 * 8, dtype=torch.float32).reshape(32, 8)
    w = client.put("w", source, rows4)
    out = torch.empty(32, 8)
    pointer = out.data_ptr()
    assert tt.read(w, out=out) is out and out.data_ptr() == pointer
    assert torch.equal(out, source)
    w[0:2] = torch.zeros(2, 8)
    box = torch.empty(4, 3)
    tt.read(w, out=box, offsets=(0, 2))
    assert torch.equal(box, torch.cat([torch.zeros(2, 3), source[2:4, 2:5]]))
    assert torch.equal(tt.read(w)[2:], source[2:])
    # Without offsets, out is the whole tensor: a smaller one is refused,
    # not filled from the corner.
    small = torch.full((4, 3), -1.0)
    with pytest.raises(tessera.InvalidArgumentError,
                       match=r"out has shape \(4, 3\) but tensor w is "
                             r"\(32, 8\); give offsets="):
        tt.read(w, out=small)
    assert bool((small == -1).all())


def test_bfloat16_tensors_in_and_out(client, rows4):
    source = torch.randn(16, 8).to(torch.bfloat16)
    w = client.put("w", source, rows4)
    assert w.dtype_name == "bfloat16"
    got = tt.read(w)
    assert got.dtype == torch.bfloat16 and torch.equal(got, source)
    out = torch.zeros(4, 8, dtype=torch.bfloat16)
    assert tt.read(w, out=out, offsets=(6, 0)) is out
    assert torch.equal(out, source[6:10])
    strided = torch.zeros(8, 16, dtype=torch.bfloat16).t()  # not contiguous
    tt.read(w, out=strided)
    assert torch.equal(strided, source)
    # numpy sees the same values as float32, exactly.
    np.testing.assert_array_equal(w.read(cast="float32"),
                                  source.float().numpy())
    # float32 written into a bfloat16 tensor rounds as torch does.
    values = torch.randn(16, 8)
    w.write((0, 0), values)
    assert torch.equal(tt.read(w), values.to(torch.bfloat16))
    w.write((0, 0), source.t().contiguous().t())  # any layout
    assert torch.equal(tt.read(w), source)
    with pytest.raises(tessera.InvalidArgumentError, match="bfloat16"):
        client.create("f", (16, 8), rows4).write((0, 0), source)
    with pytest.raises(tessera.InvalidArgumentError):
        tt.read(w, out=torch.zeros(16, 8))  # float32 out of a bfloat16


def test_state_dict_weight_sync(client, rows4):
    model = torch.nn.Linear(8, 16)
    state = model.state_dict()
    tt.put_state_dict(client, "m.", state,
                      lambda name, t: tessera.chunk(0, ["rank:0/cpu",
                                                        "rank:1/cpu"]))
    assert sorted(t.name for t in client.list()) == ["m.bias", "m.weight"]
    tt.put_state_dict(client, "m.", state, lambda n, t: rows4)  # replaces
    like = {"weight": torch.zeros(16, 8), "bias": torch.zeros(16)}
    tt.get_state_dict(client, "m.", like)
    assert torch.equal(like["weight"], state["weight"])
    assert torch.equal(like["bias"], state["bias"])
    # An inference rank takes only its slice: rows 8..16 of the weight.
    mine = torch.zeros(8, 8)
    tt.get_state_dict(client, "m.", {"weight": (mine, (8, 0))})
    assert torch.equal(mine, state["weight"][8:])
    # Another floating dtype is converted as torch converts, as plans do;
    # an integer one is still refused.
    for dtype in [torch.bfloat16, torch.float16, torch.float64]:
        like = {"weight": (torch.zeros(8, 8, dtype=dtype), (8, 0)),
                "bias": torch.zeros(16, dtype=dtype)}
        tt.get_state_dict(client, "m.", like)
        assert torch.equal(like["weight"][0], state["weight"][8:].to(dtype))
        assert torch.equal(like["bias"], state["bias"].to(dtype))
    with pytest.raises(tessera.InvalidArgumentError,
                       match="m.bias: tensor of float32 into an out of int32"):
        tt.get_state_dict(client, "m.",
                          {"bias": torch.zeros(16, dtype=torch.int32)})


def test_a_whole_tensor_of_another_shape_is_a_size_mismatch(client):
    """A tensor given alone to get_state_dict (or plan_state_dict) means
    the whole stored tensor: one of another shape is refused, as torch's
    load_state_dict refuses it, and nothing is read into it; a box is
    asked for with (tensor, offsets)."""
    tt.put_state_dict(client, "sm.", {"t": torch.arange(64.0).reshape(8, 8),
                                      "b": torch.ones(8)})
    for shape in [(4, 4), (8, 4), (1, 8)]:
        out = torch.full(shape, -1.0)
        with pytest.raises(tessera.InvalidArgumentError,
                           match=r"size mismatch for t: sm.t has shape "
                                 r"\[8, 8\]"):
            tt.get_state_dict(client, "sm.", {"b": torch.zeros(8), "t": out})
        assert bool((out == -1).all()), shape
        with pytest.raises(tessera.InvalidArgumentError,
                           match="size mismatch for t"):
            tt.plan_state_dict(client, "sm.", {"t": out})
    # Larger than the tensor, or of another rank: refused by the plan.
    for shape, error in [((8, 9), tessera.OutOfRangeError),
                         ((64,), tessera.InvalidArgumentError),
                         ((), tessera.InvalidArgumentError)]:
        out = torch.full(shape, -1.0)
        with pytest.raises(error):
            tt.get_state_dict(client, "sm.", {"t": out})
        assert bool((out == -1).all()), shape
    box = torch.zeros(4, 4)
    tt.get_state_dict(client, "sm.", {"t": (box, (4, 4))})
    assert torch.equal(box, torch.arange(64.0).reshape(8, 8)[4:, 4:])
    whole = torch.zeros(8, 8)
    plan = tt.plan_state_dict(client, "sm.", {"t": whole})
    assert plan.shapes == [(8, 8)]
    plan.run()
    assert torch.equal(whole, torch.arange(64.0).reshape(8, 8))


def test_state_dict_keys_and_prefix_must_be_str(client):
    for call in [lambda sd: tt.put_state_dict(client, "k.", sd),
                 lambda sd: tt.publish_state_dict(client, "k.", sd),
                 lambda sd: tt.get_state_dict(client, "k.", sd),
                 lambda sd: tt.plan_state_dict(client, "k.", sd)]:
        with pytest.raises(TypeError, match="state dict keys must be str, "
                                            "not int 3"):
            call({3: torch.zeros(4)})
        with pytest.raises(TypeError, match="must be a mapping"):
            call([torch.zeros(4)])
    with pytest.raises(TypeError, match="prefix must be a str, not NoneType"):
        tt.put_state_dict(client, None, {"a": torch.zeros(4)})
    assert not [t for t in client.list() if t.name.startswith("k.")]


def test_state_dict_default_layout(client):
    """Without a layout: big tensors in dim-0 chunks over every daemon,
    small ones (and 0-d ones) whole, one daemon after another."""
    state = {
        "weight": torch.randn(1024, 256),  # 1 MiB: chunked
        "bias": torch.randn(1024),
        "scale": torch.randn(8),
        "steps": torch.tensor(3),  # 0-d, as BatchNorm's num_batches_tracked
        "wide": torch.randn(2, 256 * 1024 // 2 + 8),  # > 1 MiB, 2 rows < 4
    }
    put = tt.put_state_dict(client, "m.", state)
    assert [s.rank for s in put["weight"].shards] == [0, 1, 2, 3]
    assert [s.sizes for s in put["weight"].shards] == [(256, 256)] * 4
    assert [s.placement for s in put["weight"].shards] == [
        f"rank:{r}/cpu" for r in range(4)]
    for name, rank in [("bias", 0), ("scale", 1), ("steps", 2), ("wide", 3)]:
        assert [s.rank for s in put[name].shards] == [rank], name
        assert put[name].shape == tuple(state[name].shape)
    like = {name: torch.zeros_like(t) for name, t in state.items()}
    tt.get_state_dict(client, "m.", like)
    for name, t in state.items():
        assert torch.equal(like[name], t), name
    # Again: replaced, laid out the same way (a fresh round-robin).
    again = tt.put_state_dict(client, "m.", state)
    assert [s.rank for s in again["bias"].shards] == [0]
    # The threshold is a knob; a layout asked directly goes on in turn.
    layout = tt.default_layout(client, chunk_bytes=64)
    assert layout("a", torch.zeros(8, 4)) == tessera.chunk(
        0, [f"rank:{r}/cpu" for r in range(4)])
    assert layout("b", torch.zeros(3, 100)) == tessera.chunk(0, ["rank:0/cpu"])
    assert layout("c", np.zeros(4, np.float32)) == tessera.chunk(
        0, ["rank:1/cpu"])
    # A threshold that is no byte count is refused when the layout is made,
    # not when it is first asked.
    with pytest.raises(tessera.InvalidArgumentError,
                       match="chunk_bytes must be an integer of at least 0, "
                       "not -5"):
        tt.default_layout(client, chunk_bytes=-5)
    with pytest.raises(TypeError, match="chunk_bytes must be an int"):
        tt.default_layout(client, chunk_bytes="1MiB")


@pytest.mark.skipif(SHARD_ERROR is None,
                    reason="torch.distributed._shard imports here")
@pytest.mark.skipif(SHARD_ERROR is None,
                    reason="torch.distributed._shard imports here")
def test_spec_to_torch_says_why_it_cannot():
    with pytest.raises(tessera.FailedPreconditionError,
                       match="torch.distributed._shard cannot be imported"):
        tt.spec_to_torch(tessera.parse_spec("chunk:dim=0:rank:0/cpu"))
