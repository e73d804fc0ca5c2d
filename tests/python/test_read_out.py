"""read(out=) and read_region(out=) fill what a user hands them in place: a
numpy array, a CPU torch tensor, any writable buffer or a __dlpack__ object,
any strides; a wrong one is refused before a byte moves."""

import array

import numpy as np
import pytest

import tessera

try:
    import torch
except ImportError:
    torch = None

needs_torch = pytest.mark.skipif(torch is None,
                                 reason="torch is not installed")


class Exporter:
    """Only DLPack: what a library other than numpy and torch hands over."""

    def __init__(self, tensor):
        self.tensor = tensor

    def __dlpack__(self, stream=None):
        return self.tensor.__dlpack__()

    def __dlpack_device__(self):
        return self.tensor.__dlpack_device__()


@pytest.fixture()
def w(client, rows4):
    return client.put("w", np.arange(12 * 8, dtype=np.float32).reshape(12, 8),
                      rows4)


VALUES = np.arange(12 * 8, dtype=np.float32).reshape(12, 8)


@needs_torch
def test_torch_tensors_in_place(client, rows4, w):
    out = torch.empty(12, 8)
    pointer = out.data_ptr()
    assert w.read(out=out) is out and out.data_ptr() == pointer
    assert torch.equal(out, torch.from_numpy(VALUES))
    box = torch.zeros(3, 2)
    assert w.read_region((4, 2), (3, 2), out=box) is box
    assert torch.equal(box, torch.from_numpy(VALUES[4:7, 2:4]))
    # Any strides, as a numpy out: filled in place.
    strided = torch.zeros(8, 12).t()
    assert w.read(out=strided) is strided
    assert torch.equal(strided, torch.from_numpy(VALUES))
    # A parameter is filled as torch.no_grad() + copy_ would fill it.
    weight = torch.nn.Parameter(torch.zeros(12, 8))
    w.read(out=weight)
    assert torch.equal(weight.detach(), torch.from_numpy(VALUES))
    # torch.bfloat16 from a bfloat16 tensor, and from float32 with cast=
    # (rounded as torch rounds).
    source = torch.randn(12, 8).to(torch.bfloat16)
    b = client.put("b", source, rows4)
    out = torch.empty(12, 8, dtype=torch.bfloat16)
    assert b.read(out=out) is out and torch.equal(out, source)
    box = torch.empty(2, 8, dtype=torch.bfloat16)
    b.read_region((5, 0), (2, 8), out=box)
    assert torch.equal(box, source[5:7])
    values = torch.randn(12, 8)
    w.write((0, 0), values)
    rounded = torch.empty(12, 8, dtype=torch.bfloat16)
    assert w.read(out=rounded, cast="float32") is rounded
    assert torch.equal(rounded, values.to(torch.bfloat16))


def test_buffers_and_dlpack_objects_in_place(client, rows4, w):
    # A writable buffer: array.array through a 2-D memoryview.
    floats = array.array("f", [0.0] * 6)
    view = memoryview(floats).cast("B").cast("f", [3, 2])
    assert w.read_region((4, 2), (3, 2), out=view) is view
    assert list(floats) == VALUES[4:7, 2:4].ravel().tolist()
    raw = bytearray(16)
    u8 = client.put("u8", np.arange(16, dtype=np.uint8), rows4)
    u8.read(out=raw)
    assert raw == bytes(range(16))
    # A __dlpack__ object (here over numpy memory, strided too).
    target = np.zeros((12, 8), np.float32)
    assert isinstance(w.read(out=Exporter(target)), Exporter)
    np.testing.assert_array_equal(target, VALUES)
    strided = np.zeros((8, 12), np.float32).T
    w.read(out=Exporter(strided))
    np.testing.assert_array_equal(strided, VALUES)
    if torch is not None:  # torch's DLPack export, bfloat16 as its bits
        t = torch.zeros(2, 8)
        w.read_region((3, 0), (2, 8), out=Exporter(t))
        assert torch.equal(t, torch.from_numpy(VALUES[3:5]))
        source = torch.randn(4, 8).to(torch.bfloat16)
        b = client.put("b", source, rows4)
        out = torch.zeros(4, 8, dtype=torch.bfloat16)
        b.read(out=Exporter(out))
        assert torch.equal(out, source)


def test_zero_dim_tensors_round_trip(client):
    s = client.put("s", np.array(2.5, np.float32),
                   tessera.parse_spec("enum::@rank:1/cpu"))
    assert s.shape == () and s.read() == 2.5
    out = np.zeros((), np.float32)
    assert s.read(out=out) is out and out == 2.5


def _refused(w, out, error, match):
    with pytest.raises(error, match=match):
        w.read(out=out)


def test_wrong_outs_are_refused_before_a_byte_moves(w):
    sentinel = np.full((12, 8), -1, np.float32)
    read_only = sentinel.copy()
    read_only.flags.writeable = False
    read_only_strided = np.full((12, 16), -1, np.float32)[:, ::2]
    read_only_strided.flags.writeable = False
    cases = [
        (np.full((12, 8), -1, np.float64), "dtype"),
        (np.full((12, 4), -1, np.float32), "shape"),
        (read_only, "not writeable"),
        (read_only_strided, "not writeable"),
        (np.broadcast_to(np.float32(-1), (12, 8)), "not writeable"),
        (memoryview(sentinel.tobytes()).cast("f", [12, 8]), "not writeable"),
    ]
    if torch is not None:
        cases += [
            (torch.full((12, 8), -1, dtype=torch.float64), "dtype"),
            (torch.full((12, 8), -1, dtype=torch.bfloat16), "bfloat16"),
            (torch.full((8, 12), -1.0), "shape"),
            (torch.full((12, 1), -1.0).expand(12, 8), "share memory"),
            (torch.full((12, 16), -1.0)[:, ::2].t(), "shape"),
            (Exporter(torch.full((12, 8), -1, dtype=torch.int32)), "dtype"),
        ]
    for out, match in cases:
        # InvalidArgumentError is a ValueError.
        _refused(w, out, ValueError, match)
        _refused(w, out, tessera.InvalidArgumentError, match)
        values = out.tensor if isinstance(out, Exporter) else out
        values = (values.float().numpy() if torch is not None and
                  isinstance(values, torch.Tensor) else np.asarray(values))
        assert (values == -1).all(), f"{match}: written into"
    for out in [[0.0] * 96, "out", 3.0, object()]:
        with pytest.raises(TypeError, match="out must be a numpy array"):
            w.read(out=out)
    with pytest.raises(TypeError):
        w.read_region((0, 0), (1, 1), out=[[0.0]])
