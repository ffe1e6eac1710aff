"""Large tensors to ipc peers through shared-memory slots (transport/ring.py): the receiver
sees the sender's bytes, a slot is reused only once the receiver has let go of every view of
it, full rings and other transports fall back to the socket, refs are taken only on an ipc
inbox and only to our files, and nothing is left in /dev/shm."""

import errno
import gc
import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from graphflow.transport import Endpoint, FrameError, decode_tensor
from graphflow.transport import ring as ring_module
from graphflow.transport.frames import tensor_header
from graphflow.transport.ring import MAX_SLOTS, RING_MIN_BYTES, RingViews, SendRing
from graphflow.transport.shared import SHARED_DIR, available

pytestmark = [pytest.mark.skipif(not available(), reason="no /dev/shm on this machine"),
              pytest.mark.alone]  # (they list /dev/shm, where other tests' clusters map rings)
BIG = RING_MIN_BYTES // 4  # float32 elements of a tensor just large enough for a slot


def ours() -> set[str]:
    return {n for n in os.listdir(SHARED_DIR) if n.startswith("graphflow-ring-")}


@pytest.fixture
def pair(tmp_path):
    before = ours()
    with Endpoint("a", f"ipc://{tmp_path}/a", timeout=5.0) as a, \
            Endpoint("b", f"ipc://{tmp_path}/b", timeout=5.0) as b:
        a.connect("b", b.address)
        yield a, b
    assert ours() == before  # the receiver unlinked what it mapped, the sender the rest


def test_a_large_tensor_arrives_by_a_slot_and_the_sender_may_change_its_array(pair):
    a, b = pair
    x = np.arange(3 * BIG, dtype=np.float32).reshape(3, BIG)
    assert a.send("b", "k", x, step=1) is None  # copied into the slot: no tracker to wait on
    x[:] = -1.0
    got = b.recv("k", "a", step=1)
    np.testing.assert_array_equal(got, np.arange(3 * BIG, dtype=np.float32).reshape(3, BIG))
    assert not got.flags.writeable
    assert a._rings["b"].busy() == 1


def test_a_slot_is_reused_only_after_every_view_of_it_is_gone(pair):
    a, b = pair
    a.send("b", "k", np.full(BIG, 1.0, np.float32), step=0)
    first = b.recv("k", "a")
    row = first[: BIG // 2]  # a view keeps the slot too
    del first
    gc.collect()
    a.send("b", "k", np.full(BIG, 2.0, np.float32), step=1)
    assert a._rings["b"].busy() == 2  # the first slot is held by `row`: a second one is made
    second = b.recv("k", "a")
    assert row[0] == 1.0 and second[0] == 2.0
    del row, second
    gc.collect()
    assert a._rings["b"].busy() == 0
    a.send("b", "k", np.full(BIG, 3.0, np.float32), step=2)
    assert len(a._rings["b"]._slots) == 2 and b.recv("k", "a")[0] == 3.0


def test_a_sender_that_closes_first_leaves_its_last_tensor_to_be_opened(tmp_path):
    # the receiver takes the tensor only after the sender has closed: its slot file waits for
    # it (within the sender's linger), where it had been unlinked at once
    before = ours()
    with Endpoint("b", f"ipc://{tmp_path}/b", timeout=5.0) as b:
        a = Endpoint("a", f"ipc://{tmp_path}/a", timeout=5.0, linger=2.0)
        a.connect("b", b.address)
        x = np.arange(BIG, dtype=np.float32)
        a.send("b", "last", x, step=0)
        got = []
        late = threading.Timer(0.2, lambda: got.append(b.recv("last", "a", step=0).copy()))
        late.start()
        t0 = time.monotonic()
        a.close()
        late.join()
        assert 0.1 < time.monotonic() - t0 < 2.0  # it waited for the receiver, not the linger
        np.testing.assert_array_equal(got[0], x)
    assert ours() == before


def test_a_full_ring_falls_back_to_the_socket(pair):
    a, b = pair
    held = []
    for i in range(MAX_SLOTS + 3):  # the receiver keeps every tensor: the slots run out
        a.send("b", "k", np.full(BIG, float(i), np.float32), step=i)
        held.append(b.recv("k", "a", step=i))
    assert [h[0] for h in held] == [float(i) for i in range(MAX_SLOTS + 3)]
    assert a._rings["b"].busy() == MAX_SLOTS
    by_slot = [isinstance(h.base, np.ndarray) for h in held]  # a slot's view has an array base
    assert by_slot == [True] * MAX_SLOTS + [False] * 3


def test_small_tensors_and_tcp_peers_use_the_socket(tmp_path):
    with Endpoint("a", "tcp://127.0.0.1:*", timeout=5.0) as a, \
            Endpoint("b", "tcp://127.0.0.1:*", timeout=5.0) as b, \
            Endpoint("c", f"ipc://{tmp_path}/c", timeout=5.0) as c:
        a.connect("b", b.address)
        a.connect("c", c.address)
        a.send("b", "big", np.ones(BIG, np.float32), track=False)
        a.send("c", "small", np.ones(BIG // 2, np.float32))
        assert b.recv("big", "a").sum() == BIG and c.recv("small", "a").sum() == BIG // 2
        assert a._rings == {}


def test_a_slot_reference_is_refused_where_no_ring_may_be_mapped(pair):
    a, _ = pair
    ring = SendRing()
    try:
        ref = ring.put(np.ones(BIG, np.float32))
        header = tensor_header("k", "a", "float32", (BIG,), 0, ref)
        with pytest.raises(FrameError, match="tensor 'k' from 'a': names a shared-memory slot, "
                                             "which only an ipc inbox takes"):
            decode_tensor(header, b"")
        with pytest.raises(FrameError, match="carries bytes too"):
            decode_tensor(header, b"x", RingViews().view)
        np.testing.assert_array_equal(decode_tensor(header, b"", RingViews().view)[1], 1.0)
    finally:
        ring.close()


HEX = "0123456789abcdef" * 2


@pytest.mark.parametrize("ref", [["../../etc/passwd", 0], [f"graphflow-ring-{HEX}-", MAX_SLOTS],
                                 [f"graphflow-ring-{HEX}-", -1], [f"/dev/shm/graphflow-ring-{HEX}-",
                                                                  0], "x", [1, 2, 3]])
def test_views_take_only_our_slot_names(ref):
    with pytest.raises(FrameError, match="tensor 'k': bad shared-memory slot"):
        RingViews().view(ref, "float32", [4], "tensor 'k'")


def test_a_slot_too_small_for_the_header_is_refused():
    ring = SendRing()
    try:
        ref = ring.put(np.ones(BIG, np.float32))
        with pytest.raises(FrameError, match=r"needs 131072 bytes, slot .* has 65536"):
            RingViews().view(ref, "float32", [2 * BIG], "tensor 'k'")
    finally:
        ring.close()


def test_files_are_gone_once_mapped_even_if_the_sender_is_killed(tmp_path):
    """The receiver unlinks what it maps: a sender killed before it could close leaves none."""
    before = ours()
    child = textwrap.dedent(f"""
        import sys
        import numpy as np
        from graphflow.transport import Endpoint
        a = Endpoint("a", "ipc://{tmp_path}/a", timeout=10.0)
        a.connect("b", sys.argv[1])
        for i in range(3):
            a.send("b", f"k{{i}}", np.full({BIG}, float(i + 1), np.float32))
        print("sent", flush=True)
        sys.stdin.read()  # until killed
    """)
    with Endpoint("b", f"ipc://{tmp_path}/b", timeout=10.0) as b:
        proc = subprocess.Popen([sys.executable, "-c", child, b.address], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline().strip() == "sent"
            held = [b.recv(f"k{i}", "a") for i in range(3)]
            assert [float(h[0]) for h in held] == [1.0, 2.0, 3.0]
            assert all(isinstance(h.base, np.ndarray) for h in held)  # by slots
            assert ours() == before  # the sender is alive and has not closed
        finally:
            proc.kill()
            proc.wait(timeout=30)
        assert [float(h[-1]) for h in held] == [1.0, 2.0, 3.0]  # mappings outlive the sender


def test_a_full_dev_shm_sends_by_the_socket(pair, monkeypatch):
    """/dev/shm refuses a slot (ENOSPC from posix_fallocate, say): the socket carries it."""
    a, b = pair

    def full(name, size):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ring_module, "create_ours", full)
    a.send("b", "k", np.full(BIG, 5.0, np.float32))  # no ring can even be made
    got = b.recv("k", "a")
    assert got[0] == 5.0 and not isinstance(got.base, np.ndarray)
    assert "b" not in a._local and a._rings == {}
