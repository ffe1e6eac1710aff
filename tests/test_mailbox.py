"""A worker's mailbox (runtime/mailbox.py): a failed step's abort notice between peers."""

import itertools
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from graphflow.runtime import mailbox
from graphflow.runtime.mailbox import Mailbox, PeerFailed
from graphflow.transport import Endpoint

_ids = itertools.count()


@pytest.fixture
def mailboxes():
    """worker:0 and worker:1 over inproc, each sending to the other, 10 s timeouts."""
    n = next(_ids)
    e0 = Endpoint("worker:0", f"inproc://mailbox-{n}-0", timeout=10.0)
    e1 = Endpoint("worker:1", f"inproc://mailbox-{n}-1", timeout=10.0)
    e0.connect("worker:1", e1.address)
    e1.connect("worker:0", e0.address)
    m0, m1 = Mailbox("worker:0", e0, 10.0), Mailbox("worker:1", e1, 10.0)
    yield m0, m1
    m0.close()
    m1.close()


WAITING = {"act": SimpleNamespace(attrs={"src": 0})}  # a recv of 'act' from worker:0


def test_an_abort_ends_a_peers_wait_at_once(mailboxes):
    m0, m1 = mailboxes
    m0.begin(5)
    m1.begin(5)
    threading.Timer(0.2, m0.abort_peers, ["ValueError: bad feed"]).start()
    t0 = time.monotonic()
    with pytest.raises(PeerFailed, match="worker:1: step 5 abandoned, worker:0 failed: "
                                         "ValueError: bad feed"):
        m1.take(5, WAITING, block=True, deadline=t0 + 10.0)
    assert time.monotonic() - t0 < 2.0


def test_a_notice_for_a_step_the_peer_has_not_begun_fails_that_step_when_it_begins(mailboxes):
    m0, m1 = mailboxes
    m1.begin(3)
    m0.begin(4)
    m0.abort_peers("worker:0 is ahead and failed step 4")
    time.sleep(0.3)  # (inproc: the notice is in worker:1's inbox by now)
    m1.arrived([], 3)  # takes it in; step 3 is not the one abandoned: no PeerFailed
    with pytest.raises(PeerFailed, match="step 4 abandoned"):
        m1.begin(4)
    m1.begin(5)  # the next step is not


def test_an_idle_receiver_sleeps_and_close_wakes_it():
    # idle workers' periodic wake-ups slowed the busy workers pinned beside them: the receiver
    # waits IDLE_WAIT at a time, and close interrupts that wait instead of sitting it out
    from graphflow.runtime import mailbox as mailbox_module

    n = next(_ids)
    endpoint = Endpoint("worker:0", f"inproc://mailbox-idle-{n}", timeout=10.0)
    waits = []
    recv_any = endpoint.recv_any
    endpoint.recv_any = lambda timeout=None: (waits.append(timeout), recv_any(timeout))[1]
    box = Mailbox("worker:0", endpoint, 10.0)
    time.sleep(0.6)
    assert waits == [mailbox_module.IDLE_WAIT] and mailbox_module.IDLE_WAIT >= 1.0
    t0 = time.monotonic()
    box.close()
    assert time.monotonic() - t0 < 1.0 < mailbox_module.IDLE_WAIT
    assert not any(t.is_alive() for t in box._threads) and endpoint._pull.closed


def test_a_post_goes_out_from_the_posting_thread_when_nothing_waits_before_it(mailboxes,
                                                                            monkeypatch):
    m0, m1 = mailboxes
    monkeypatch.setattr(m0._outbox, "put", None)  # the sender thread's queue is not touched
    m0.begin(1)
    m1.begin(1)
    m0.post("worker:1", "act", np.arange(4.0), 1, track=False)
    assert m0.sent_keys == ["act"]
    got = m1.take(1, WAITING, block=True, deadline=time.monotonic() + 10.0)
    assert [meta["key"] for meta, _ in got] == ["act"] and got[0][1].sum() == 6.0


class _HeldForTheSender:
    """A lock the test's thread takes at once and the sender thread only after `go`."""

    def __init__(self) -> None:
        self.lock, self.go = threading.Lock(), threading.Event()

    def acquire(self, blocking: bool = True) -> bool:
        return self.lock.acquire(blocking)

    def release(self) -> None:
        self.lock.release()

    def __enter__(self) -> None:
        assert self.go.wait(10.0)
        self.lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self.lock.release()


def test_a_post_behind_queued_tensors_keeps_its_place(mailboxes, monkeypatch):
    m0, m1 = mailboxes
    m0._send_lock = held = _HeldForTheSender()
    offer = m0.endpoint.offer
    monkeypatch.setattr(m0.endpoint, "offer", lambda *a, **k: (False, None))  # a full queue
    m0.post("worker:1", "first", np.zeros(2), 1, track=False)  # to the sender thread
    monkeypatch.setattr(m0.endpoint, "offer", offer)
    m0.post("worker:1", "second", np.ones(2), 1, track=False)  # must not overtake it
    held.go.set()
    m0.flush()
    assert m0.sent_keys == ["first", "second"]
    m1.begin(1)
    keys = []
    while len(keys) < 2:
        got = m1.take(1, {"first": WAITING["act"], "second": WAITING["act"]}, block=True,
                      deadline=time.monotonic() + 10.0)
        keys += [meta["key"] for meta, _ in got]
    assert keys == ["first", "second"]


def test_every_post_yields_the_core_once_the_tensor_is_handed_over(mailboxes, monkeypatch):
    # the thread that moves it must not wait behind the poster's next kernel (EEVDF lets a
    # computing thread finish its slice first): post yields after handing the tensor over
    m0, _ = mailboxes
    seen = []
    monkeypatch.setattr(mailbox, "_YIELD", lambda: seen.append((list(m0.sent_keys),
                                                                m0._outbox.unfinished_tasks)))
    m0.post("worker:1", "direct", np.zeros(2), 1, track=False)
    assert seen == [(["direct"], 0)]  # gone to zmq from this thread, then the yield
    m0._send_lock.acquire()  # as if the sender thread were mid-send: this one queues
    try:
        m0.post("worker:1", "queued", np.zeros(2), 1, track=False)
        assert seen[1] == (["direct"], 1)  # queued for the sender thread, then the yield
    finally:
        m0._send_lock.release()
    m0.flush()
    assert m0.sent_keys == ["direct", "queued"]
