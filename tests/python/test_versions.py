"""Versions from Python (docs/versions.md) on the session's real daemons:
begin / join / publish / abort, snapshots, reading a given version, the
kept versions, and a writer process joined by id."""

import os
import re
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import tessera


def test_begin_write_publish_and_read_versions(client, rows4):
    w = client.create("vw", (8, 4), rows4, init="zeros", versions=3)
    assert w.versioned and w.version == 1 and w.versions() == [1]
    with w.begin() as v:
        v[0:8] = np.full((8, 4), 2, np.float32)
        # Readers still see version 1 until it is published.
        assert (w.read() == 0).all()
        assert w.last_version == 1
    assert w.version == 2
    assert (w.read() == 2).all() and w.last_version == 2
    v = w.begin(empty=True)
    v.write((0, 0), np.full((8, 4), 3, np.float32))
    assert v.publish() == 3
    assert w.versions() == [1, 2, 3]
    assert (w.read(version=2) == 2).all()
    assert (w[2:4, 1:3] == 3).all()
    # An exception in the block aborts the version: nothing published.
    with pytest.raises(RuntimeError):
        with w.begin() as v:
            v[0] = np.ones(4, np.float32)
            raise RuntimeError("trainer step failed")
    assert w.version == 3
    assert client.open("vw").versions() == [1, 2, 3]
    # The aborted version's number (4) is not reused.
    with client.begin("vw") as v:
        v[...] = 4
    assert v.number == 5
    assert w.versions() == [2, 3, 5]
    with pytest.raises(tessera.NotFoundError, match="not kept"):
        w.read(version=1)
    # Published versions and the tensor itself are read-only.
    with pytest.raises(tessera.FailedPreconditionError, match="read-only"):
        w[0:1] = np.zeros((1, 4), np.float32)


def test_versions_with_copies(client, rows4):
    # Every version has its copies: the owners' and the replicas' agree.
    w = client.create("vc", (8, 4), rows4, init="zeros", versions=2,
                      copies=2)
    with w.begin() as v:
        v[...] = 5
    with w.begin() as v:
        v[0:4] = 6
    assert w.versions() == [2, 3]
    assert (w.read(version=2) == 5).all()
    latest = w.read()
    assert (latest[0:4] == 6).all() and (latest[4:8] == 5).all()


def test_snapshots_pin_versions(client, rows4):
    w = client.create("vs", (8, 4), rows4, init="zeros", versions=2)
    with w.snapshot() as s:
        assert s.version == 1
        for value in (1, 2, 3):
            with w.begin() as v:
                v[...] = value
        # Beyond the 2 kept, still readable while pinned.
        assert (s.read() == 0).all()
        assert (s[0:2] == 0).all()
    with pytest.raises(tessera.NotFoundError):
        w.read(version=1)


def test_a_group_is_published_together(client, rows4):
    for name in ("ga", "gb", "gc"):
        client.create(name, (8, 4), rows4, init="zeros", versions=2)
    group = client.begin(["ga", "gb", "gc"])
    for i, name in enumerate(group):
        group[name][...] = i + 1
    assert group.publish() == {"ga": 2, "gb": 2, "gc": 2}
    with client.snapshot(["ga", "gb", "gc"]) as s:
        assert s.versions == {"ga": 2, "gb": 2, "gc": 2}
        assert [float(s[n].read()[0, 0]) for n in ("ga", "gb", "gc")] == [
            1.0, 2.0, 3.0]


def test_skip_zeroing_leaves_a_reused_versions_values(client, rows4):
    w = client.create("vz", (8, 4), rows4, init="zeros", versions=2)
    for value in (2, 3, 4):  # version 2's memory (all 2) kept for reuse
        with w.begin(empty=True) as v:
            v[0:8] = value
    # Writers that promise every element: the daemons do not zero it.
    with w.begin(empty=True, skip_zeroing=True) as v:
        v[0:4] = 5
    got = w.read()
    assert (got[0:4] == 5).all() and (got[4:8] == 2).all()
    with pytest.raises(tessera.InvalidArgumentError,
                       match="skip_zeroing without empty"):
        w.begin(skip_zeroing=True)
    assert w.version == 5 and (w.read()[0:4] == 5).all()


def test_a_writer_process_joins_by_id(daemons, client, rows4):
    w = client.create("vj", (8, 4), rows4, init="zeros", versions=2)
    v = w.begin(empty=True)
    v[0:4] = 5
    # Another process writes the other half into the same version.
    code = (
        "import sys, tessera\n"
        "c = tessera.connect(sys.argv[1])\n"
        "v = c.join(sys.argv[2])\n"
        "v[4:8] = 6\n")
    subprocess.run([sys.executable, "-c", code, daemons.addresses[2], v.id],
                   check=True, timeout=60,
                   env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert v.publish() == 2
    got = w.read()
    assert (got[0:4] == 5).all() and (got[4:8] == 6).all()


def test_a_version_still_open_is_read_by_its_writer_only(client, rows4):
    """Daemons hold an open version under its number's id; a read by that
    number (a view at it, a plan run at it, a shard of it) reads published
    versions only, never a writer's bytes, half written or not."""
    w = client.create("vo", (8, 4), rows4, init="zeros", versions=2)
    plan_out = np.zeros((8, 4), np.float32)
    plan = client.plan_reads([("vo", (0, 0), (8, 4), plan_out)])
    v = w.begin()
    v.write((0, 0), np.full((8, 4), 9, np.float32))
    assert v.number == 2
    assert (v.read() == 9).all()  # the writer reads its own
    not_published = "not published|has not published"
    with pytest.raises(tessera.FailedPreconditionError, match=not_published):
        w.read(version=2)
    with pytest.raises(tessera.FailedPreconditionError, match=not_published):
        w.at(2).read()
    with pytest.raises(tessera.FailedPreconditionError, match=not_published):
        plan.run(version=2)
    with pytest.raises(tessera.FailedPreconditionError, match=not_published):
        w.at(2).remote_shards()[1].to_here()
    assert plan.run() == 1 and (plan_out == 0).all()
    assert v.publish() == 2
    assert (w.read(version=2) == 9).all()
    assert plan.run(version=2) == 2 and (plan_out == 9).all()
    assert (w.at(2).remote_shards()[1].to_here()[2] == 9).all()


def test_refusals(client, rows4):
    plain = client.create("plain", (8, 4), rows4)
    with pytest.raises(tessera.FailedPreconditionError, match="no versions"):
        plain.begin()
    with pytest.raises(tessera.InvalidArgumentError):
        client.create("bad", (8, 4), rows4, versions=65)
    with pytest.raises(tessera.NotFoundError):
        client.begin("nothing")
    w = client.create("va", (8, 4), rows4, versions=2)
    v = w.begin()
    v.abort()
    with pytest.raises(tessera.FailedPreconditionError, match="not open"):
        v.publish()
    with pytest.raises(tessera.FailedPreconditionError, match="not open"):
        client.join(v.id)
    # A write into it names the version, not the shards it no longer has.
    not_open = f"version {v.number} is not open: it was aborted"
    with pytest.raises(tessera.FailedPreconditionError, match=not_open):
        v.write((0, 0), np.ones((8, 4), np.float32))


def test_watch_sees_each_published_version(client, rows4):
    w = client.create("vwatch", (8, 4), rows4, versions=4)
    seen = []
    versions = w.watch(timeout=10)  # from now on

    def watch():
        for number in versions:
            seen.append(number)
            if number == 4:
                return

    thread = threading.Thread(target=watch)
    thread.start()
    for _ in range(3):
        with w.begin() as v:
            v[...] = 1
    thread.join(timeout=30)
    assert seen == [2, 3, 4]


def test_watch_after_a_number_reports_those_kept_first(client, rows4):
    w = client.create("vafter", (8, 4), rows4, versions=3)
    for _ in range(3):
        with w.begin() as v:
            v[...] = 1
    # Versions 3 and 4 are kept; 2 is gone. A watcher that had 2 sees 3, 4.
    assert list(w.watch(timeout=1, after=2)) == [3, 4]
    with pytest.raises(tessera.InvalidArgumentError, match="negative"):
        next(w.watch(after=-1))


def test_watch_ends_when_the_tensor_is_deleted(client, rows4):
    w = client.create("vgone", (8, 4), rows4, versions=2)
    watching = w.watch(timeout=10)
    with w.begin() as v:
        v[...] = 1
    assert next(watching) == 2
    client.delete("vgone")
    with pytest.raises(tessera.NotFoundError, match="deleted"):
        next(watching)
    with pytest.raises(tessera.FailedPreconditionError):
        next(client.create("vplain", (8, 4), rows4).watch(timeout=1))


def test_an_abandoned_version_is_dropped_when_its_lease_ends(daemons, client,
                                                            rows4):
    w = client.create("vlease", (8, 4), rows4, versions=2)
    code = (
        "import sys, time, tessera\n"
        "c = tessera.connect(sys.argv[1])\n"
        "v = c.open('vlease').begin(lease=1)\n"
        "v[0:2] = 7\n"
        "print(v.number, flush=True)\n"
        "time.sleep(60)\n")
    writer = subprocess.Popen(
        [sys.executable, "-c", code, daemons.addresses[1]],
        stdout=subprocess.PIPE, text=True,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    number = int(writer.stdout.readline())
    assert client.open("vlease")._native.open_versions() == [number]
    writer.kill()
    writer.wait()
    deadline = time.monotonic() + 10
    while client.open("vlease")._native.open_versions():
        assert time.monotonic() < deadline
        time.sleep(0.1)
    with pytest.raises(tessera.FailedPreconditionError, match="not open"):
        client.join(f"vlease@{number}")
    assert (w.read() == 0).all() or w.version == 1


def test_a_renewed_version_lives_with_its_writer_and_ends_after_it(
        daemons, client, rows4):
    # The default lease is renewed by the writer's process (a short one
    # here, as renew=True makes it): a version outlives its lease while its
    # writer lives, and ends within it once the writer is killed; a live
    # writer's version is published after several leases.
    w = client.create("vrenew", (8, 4), rows4, versions=2)
    with w.begin(lease=1, renew=True) as v:
        v[...] = 3
        time.sleep(3)
    assert w.version == 2 and (w.read() == 3).all()
    writer = subprocess.Popen(
        [sys.executable, "-c", (
            "import sys, time, tessera\n"
            "c = tessera.connect(sys.argv[1])\n"
            "v = c.open('vrenew').begin(lease=1, renew=True)\n"
            "v[0:2] = 7\n"
            "print(v.number, flush=True)\n"
            "time.sleep(60)\n"), daemons.addresses[1]],
        stdout=subprocess.PIPE, text=True,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    number = int(writer.stdout.readline())
    time.sleep(3)
    assert client.open("vrenew")._native.open_versions() == [number]
    writer.kill()
    writer.wait()
    _until(lambda: not client.open("vrenew")._native.open_versions(),
           seconds=5)
    with pytest.raises(tessera.FailedPreconditionError, match="not open"):
        client.join(f"vrenew@{number}")
    assert w.version == 2 and (w.read() == 3).all()


def _held(client):
    """Each daemon's reserved memory budget and bytes of shards held."""
    held = []
    for s in client.stats():
        metrics = s["metrics"]
        used = re.search(r"^tessera_memory_budget_used_bytes (\S+)$", metrics,
                         re.M)
        cpu = re.search(r'^tessera_shard_bytes\{device="cpu"\} (\S+)$',
                        metrics, re.M)
        held.append((float(used.group(1)), float(cpu.group(1))))
    return held


def _spawn(daemons, code):
    """A client process on rank 1 running ``code``; its first line."""
    process = subprocess.Popen(
        [sys.executable, "-c", code, daemons.addresses[1]],
        stdout=subprocess.PIPE, text=True,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    return process, process.stdout.readline().strip()


def _until(condition, seconds=10, what=lambda: None):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what()
        time.sleep(0.1)


def test_killed_writers_and_readers_leave_nothing_behind(daemons, client,
                                                         rows4):
    # A writer killed holding an open version and a reader killed holding a
    # pin, of a tensor with two copies of each shard: once their leases
    # end, every daemon holds and reserves what it did before they came.
    w = client.create("vkill", (64, 64), rows4, init="zeros", versions=2,
                      copies=2)
    with w.begin() as v:
        v[...] = 1
    before = _held(client)
    writer, number = _spawn(daemons, (
        "import sys, time, tessera\n"
        "c = tessera.connect(sys.argv[1])\n"
        "v = c.open('vkill').begin(lease=4)\n"
        "v[0:2] = 7\n"
        "print(v.number, flush=True)\n"
        "time.sleep(60)\n"))
    reader, pinned = _spawn(daemons, (
        "import sys, time, tessera\n"
        "c = tessera.connect(sys.argv[1])\n"
        "s = c.open('vkill').snapshot(lease=4)\n"
        "print(s.version, flush=True)\n"
        "time.sleep(60)\n"))
    assert int(pinned) == 2
    assert client.open("vkill")._native.open_versions() == [int(number)]
    for value in (3, 4, 5):
        with w.begin() as v:
            v[...] = value
    # The pinned version outlives the 2 kept, and the open one holds its
    # bytes, while their processes live.
    assert 2 in w.versions()
    assert all(now[0] > then[0] for now, then in zip(_held(client), before))
    writer.kill()
    reader.kill()
    writer.wait()
    reader.wait()
    _until(lambda: not client.open("vkill")._native.open_versions()
           and w.versions() == [5, 6],
           what=lambda: f"versions {w.versions()}")

    def freed():
        # Each daemon ends leases by its own clock: until every holder
        # has, a read of version 2 finds a copy somewhere.
        try:
            w.read(version=2)
        except tessera.NotFoundError as e:
            assert "not kept" in str(e)
            return True
        return False

    _until(freed)
    # Two versions kept (5 and 6; the writer's took 3), as versions 1 and 2
    # were before: the same bytes.
    _until(lambda: _held(client) == before,
           what=lambda: f"held {_held(client)}, before {before}")
    assert (w.read() == 5).all()


def test_save_a_kept_or_pinned_version_and_load_it_versioned(client, rows4):
    w = client.create("vsave", (8, 4), rows4, init="zeros", versions=3)
    for value in (1, 2):
        with w.begin() as v:
            v[...] = value
    with w.snapshot() as s:
        assert s.version == 3
        with w.begin() as v:
            v[...] = 3
        assert client.save("vsave_two", ["vsave"], versions={"vsave": 2}) \
            == ["vsave"]
        assert s.save("vsave_pinned") == ["vsave"]
    with pytest.raises(tessera.NotFoundError, match="not kept"):
        client.save("vsave_gone", ["vsave"], versions={"vsave": 1})
    for number in (0, -1):  # Numbers start at 1; not "version -1 not kept".
        with pytest.raises(tessera.InvalidArgumentError,
                           match="version must be an integer from 1 to"):
            client.save("vsave_gone", ["vsave"], versions={"vsave": number})
    # Loaded as it was saved: versioned, keeping 3; or in place when told.
    (two,) = client.load("vsave_two", as_names=["vsave_2"], names=["vsave"])
    assert (two.read() == 1).all() and two.versioned and two.version == 1
    with two.begin() as v:
        v[0:1] = 5
    for _ in range(3):
        with two.begin():
            pass
    assert two.versions() == [3, 4, 5]
    (flat,) = client.load("vsave_two", as_names=["vsave_f"], names=["vsave"],
                          versions=1)
    assert (flat.read() == 1).all() and not flat.versioned
    (pinned,) = client.load("vsave_pinned", names=["vsave"],
                            as_names=["vsave_p"], versions=2)
    assert (pinned.read() == 2).all() and pinned.version == 1
    with pinned.begin() as v:
        v[0:2] = 9
    assert pinned.version == 2
    assert (pinned[0:2] == 9).all() and (pinned[2:8] == 2).all()


def test_a_checkpoint_keeps_how_its_tensors_were_held(client, rows4):
    # Versions kept and copies of each shard come back with a load.
    client.create("held_r", (8, 4), rows4, init="ones", copies=2)
    client.create("held_v", (8, 4), rows4, init="ones", versions=4, copies=3)
    client.create("held_p", (8, 4), rows4, init="ones")
    assert sorted(client.save("held", ["held_r", "held_v", "held_p"])) == \
        ["held_p", "held_r", "held_v"]
    for name in ("held_r", "held_v", "held_p"):
        client.delete(name)
    loaded = {t.name: t for t in client.load("held")}
    assert loaded["held_r"].copies == 2 and not loaded["held_r"].versioned
    assert loaded["held_v"].copies == 3 and loaded["held_v"].versioned
    assert loaded["held_p"].copies == 1 and not loaded["held_p"].versioned
    v = client.open("held_v")
    assert v.copies == 3 and v.version == 1
    for _ in range(5):
        with v.begin():
            pass
    assert len(v.versions()) == 4
    for t in loaded.values():
        assert (t.read() == 1).all()


def test_bytes_nobody_wrote_read_as_zeros(client, rows4):
    # An empty create and an empty version whose writers miss half of it
    # never show older bytes of the daemons' memory (another tensor's).
    # Small shards live on the daemons' heap, large ones in memory files.
    for shape in [(8, 4), (1024, 512)]:
        for i in range(3):
            client.put(f"junk{i}", np.full(shape, 1234.5, np.float32), rows4)
            client.delete(f"junk{i}")
        assert (client.create("ez", shape, rows4).read() == 0).all()
        w = client.create("vz", shape, rows4, init="ones", versions=2)
        v = w.begin(empty=True)
        half = shape[0] // 2
        v.write((0, 0), np.full((half, shape[1]), 7, np.float32))
        v.publish()
        got = client.open("vz").read()
        assert (got[:half] == 7).all() and (got[half:] == 0).all(), shape
        client.delete("ez")
        client.delete("vz")
