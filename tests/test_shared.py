"""Feeds in shared memory (transport/shared.py): references decode to the sender's bytes, only
over ipc and only for files of ours; files are unlinked once mapped and at close; a cluster of
worker processes leaves nothing in /dev/shm."""

import os
import threading
from itertools import repeat

import numpy as np
import pytest

from graphflow.runtime.inflight import FeedBuffers, SentStep
from graphflow.transport import (
    FrameError,
    RemoteError,
    RpcClient,
    RpcServer,
    decode_message,
    encode_message,
)
from graphflow.transport.frames import SharedRef
from graphflow.transport.shared import SHARE_MIN_BYTES, SHARED_DIR, SharedArrays, attach, available

pytestmark = pytest.mark.skipif(not available(), reason="no /dev/shm on this machine")


@pytest.fixture
def arrays():
    a = SharedArrays()
    yield a
    a.close()


def test_a_reference_decodes_to_the_senders_bytes(arrays):
    x = arrays.empty((3, 4), np.dtype(np.float32))
    x[:] = np.arange(12, dtype=np.float32).reshape(3, 4)
    ref = arrays.ref(x)
    assert ref is not None and ref.shape == (3, 4) and ref.dtype == "float32"
    frames = encode_message({"feeds": {"x": ref}, "small": np.ones(2, np.int32)})
    assert len(frames) == 2  # the shared array adds no frame; the small one does
    got = decode_message(frames, attach)["feeds"]["x"]
    np.testing.assert_array_equal(got, x)
    assert not got.flags.writeable
    x[0, 0] = 42.0  # the receiver sees the sender's memory, not a copy
    assert got[0, 0] == 42.0


def test_a_reference_is_refused_without_attach(arrays):
    x = arrays.empty((SHARE_MIN_BYTES,), np.dtype(np.uint8))
    with pytest.raises(FrameError, match=r"only taken over a local \(ipc\) connection"):
        decode_message(encode_message({"x": arrays.ref(x)}))


HEX = "0123456789abcdef" * 2


@pytest.mark.parametrize("name", ["../../etc/passwd", f"graphflow-shm-{HEX}-1/../../etc/passwd",
                                  "graphflow-shm-ab-1", f"/dev/shm/graphflow-shm-{HEX}-1", 7])
def test_attach_takes_only_our_names(name):
    with pytest.raises(FrameError, match="not a graphflow shared-memory name"):
        attach(name, "float32", [1])


def test_attach_checks_the_file(arrays, tmp_path):
    x = arrays.empty((4,), np.dtype(np.float32))
    ref = arrays.ref(x)
    with pytest.raises(FrameError, match="needs 32 bytes, the file has 16"):
        attach(ref.name, "float32", [8])
    with pytest.raises(FrameError, match="dtype 'object' is not allowed"):
        attach(ref.name, "object", [1])
    link, missing = ref.name[:-1] + "999", ref.name[:-1] + "998"
    (tmp_path / "target").write_bytes(b"1234")
    os.symlink(tmp_path / "target", os.path.join(SHARED_DIR, link))
    try:
        with pytest.raises(FrameError, match="cannot open"):  # a link is not followed
            attach(link, "float32", [1])
    finally:
        os.unlink(os.path.join(SHARED_DIR, link))
    with pytest.raises(FrameError, match="cannot open"):
        attach(missing, "float32", [1])
    empty = os.path.join(SHARED_DIR, missing)
    open(empty, "wb").close()
    try:
        with pytest.raises(FrameError, match="not a shared buffer of this user"):
            attach(missing, "float32", [1])
    finally:
        os.unlink(empty)
    assert arrays.ref(x[1:]) is None and arrays.ref(x.copy()) is None  # only our buffers


def test_settled_unlinks_and_the_mapping_lives_on(arrays):
    x = arrays.empty((5,), np.dtype(np.float64))
    x[:] = 1.5
    ref = arrays.ref(x)
    seen = attach(ref.name, ref.dtype, list(ref.shape))
    path = os.path.join(SHARED_DIR, ref.name)
    assert os.path.exists(path)
    arrays.settled(x)
    assert not os.path.exists(path)
    x[:] = 2.5
    assert seen.tolist() == [2.5] * 5
    y = arrays.empty((5,), np.dtype(np.float64))
    arrays.close()
    assert not os.path.exists(os.path.join(SHARED_DIR, arrays.ref(y).name))


def test_feed_buffers_share_large_feeds_one_worker_each(arrays):
    feeds = FeedBuffers(reuse=True, shared=arrays)
    big = np.arange(SHARE_MIN_BYTES // 4, dtype=np.float32)
    small = np.arange(10, dtype=np.int32)
    step = SentStep(0, {}, None, 0.0)
    assert feeds.wire(step, 0, small) is small
    r0, r1 = feeds.wire(step, 0, big), feeds.wire(step, 1, big)
    assert isinstance(r0, SharedRef) and isinstance(r1, SharedRef) and r0.name != r1.name
    np.testing.assert_array_equal(attach(r0.name, r0.dtype, list(r0.shape)), big)
    feeds.give_back(step)
    assert not os.path.exists(os.path.join(SHARED_DIR, r0.name))  # settled: mapped by now
    again = SentStep(1, {}, None, 0.0)
    assert feeds.wire(again, 1, big + 1).name == r1.name  # worker 1's buffer, not worker 0's
    assert feeds.wire(again, 0, big).name == r0.name


def _serve(address: str):
    stop = threading.Event()
    srv = RpcServer(address)
    t = threading.Thread(target=srv.serve_forever, args=({"total": lambda x: float(x.sum())},
                                                         stop), daemon=True)
    t.start()
    return srv, stop, t


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_rpc_takes_references_only_over_ipc(arrays, tmp_path, transport):
    address = f"ipc://{tmp_path}/rpc" if transport == "ipc" else "tcp://127.0.0.1:*"
    srv, stop, t = _serve(address)
    x = arrays.empty((1000,), np.dtype(np.float32))
    x[:] = 0.5
    try:
        with RpcClient(srv.address, "w0", timeout=5.0) as c:
            if transport == "ipc":
                assert c.call("total", x=arrays.ref(x)) == 500.0
            else:
                with pytest.raises(RemoteError, match=r"local \(ipc\) connection"):
                    c.call("total", x=arrays.ref(x))
    finally:
        stop.set()
        t.join(5.0)
        srv.close()


@pytest.mark.alone  # (it lists /dev/shm, where other tests' clusters map rings)
def test_a_process_cluster_feeds_through_shared_memory_and_cleans_up():
    from graphflow import models
    from graphflow.partitioners import partition
    from graphflow.runtime.cluster import Cluster

    model = models.lc_large(batch=None)  # a worker's rows of a 4-image batch: 100-200 KB
    rng = np.random.default_rng(0)
    batch = 4
    feeds = {model.x.name: rng.standard_normal((batch, *model.x.shape[1:])).astype(np.float32),
             model.y.name: rng.integers(0, int(model.logits.shape[-1]), batch).astype(np.int32)}
    plan = partition(model.graph, 2, "spatial", loss=model.loss)
    before = set(os.listdir(SHARED_DIR))
    with Cluster(plan, mode="threads", optimizer={"name": "sgd", "lr": 0.1}) as ref_cluster:
        want = [float(out[plan.loss]) for out in ref_cluster.stream(repeat(feeds, 3))]
    with Cluster(plan, mode="processes", optimizer={"name": "sgd", "lr": 0.1}) as c:
        shared = c._feed_buffers.shared
        assert shared is not None
        got = [float(out[plan.loss]) for out in c.stream(repeat(feeds, 3))]
        # each worker's rows, in a buffer for each of the two steps a stream keeps in flight
        assert len(shared) == 2 * plan.parts
        assert set(os.listdir(SHARED_DIR)) == before, "every file settled (unlinked)"
    np.testing.assert_allclose(got, want, rtol=1e-5)
