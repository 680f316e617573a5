# test/fake_hub.py — a hand-made hub (docs/protocol.md) that drives one real train_gpt replica
# through a scripted join, for test/test_replica_peers.sh: relay_peers.py's frames from the
# other side. Each scenario plays a hub that does what a real relay may do at an awkward moment
# (a donor leaving mid-catch-up) or what a broken one might send, and checks what the replica
# does next. Usage:
#     fake_hub.py SCENARIO PORT SECRET_FILE N_PARAMS
# N_PARAMS: the replica's model size (its state is 8 bytes a parameter and a header). Prints
# "hub: listening" once the port is open; exits 0 when the replica did as the protocol says,
# else 1 with one line saying what happened. Every wait has a deadline, never a fixed sleep.
import fcntl
import os
import random
import select
import socket
import struct
import sys
import termios
import time

import relay_peers as rp
from relay_peers import AUTH, CONTRIBUTE, DATA, HEARTBEAT, HELLO, JOIN, JOINED, WELCOME, mac

STATE, STATE_ABORT, STATE_END, CAUGHT_UP = 22, 23, 28, 29
KIND_STATE, KIND_CATCHUP = 2, 4
CHUNK = 1 << 20
JOINED_WAIT = 2
DEADLINE_S = 120   # the longest any wait here takes (a loaded CI machine), far beyond the usual


class Failed(Exception):
    pass


def hello(lsock, deadline):
    """A connection's handshake up to the replica's AUTH: (the connection, nonce_h, AUTH's payload)."""
    r, _, _ = select.select([lsock], [], [], max(0.0, deadline - time.time()))
    if not r:
        raise Failed("no connection from the replica")
    s, _ = lsock.accept()
    c = rp.Conn.__new__(rp.Conn)   # relay_peers' framing, on an accepted socket
    c.sock, c.buf, c.closed, c.next_beat = s, b"", False, 0
    c.key_tx = c.key_rx = bytes(32)
    c.seq_tx = c.seq_rx = 0
    nonce_h = os.urandom(32)
    c.send(HELLO, nonce_h + struct.pack("<II", 10000, 0))
    t, p = c.read(deadline)
    if t != AUTH:
        raise Failed("expected AUTH, got frame %d" % t)
    return c, nonce_h, p


def accept(lsock, secret, session, deadline):
    """One connection's handshake, the hub's side: HELLO, AUTH, WELCOME and the session keys."""
    c, nonce_h, p = hello(lsock, deadline)
    stream, streams = struct.unpack("<HH", p[4:8])
    nonce_c = p[40:72]
    fields = struct.pack("<QII", session, 10000, 0)
    c.send(WELCOME, fields + mac(secret, b"train_gpt welcome v1\0", nonce_h, nonce_c, fields))
    c.key_rx = mac(secret, b"train_gpt key client-to-hub v1\0", nonce_h, nonce_c)
    c.key_tx = mac(secret, b"train_gpt key hub-to-client v1\0", nonce_h, nonce_c)
    return c, stream, streams


class Hub:
    def __init__(self, port, secret):
        self.l = socket.socket()
        self.l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.l.bind(("127.0.0.1", port))
        self.l.listen(16)
        self.secret = secret
        self.sessions = 0

    def session(self):
        """Takes the replica's next session: its control connection, then its data streams."""
        deadline = time.time() + DEADLINE_S
        self.sessions += 1
        ctl, stream, streams = accept(self.l, self.secret, 0x1234 + self.sessions, deadline)
        if stream != 0:
            raise Failed("the session began with data stream %d" % stream)
        self.ctl, self.data = ctl, [accept(self.l, self.secret, 0x1234 + self.sessions, deadline)[0]
                                    for _ in range(streams)]

    def frame(self, until):
        """Heartbeats out; the next control frame in that is not a heartbeat, or None (the time is
        up, or the replica closed its control connection)."""
        while True:
            now = time.time()
            self.ctl.beat(0.5)
            f = self.ctl.take()
            while f and f[0] == HEARTBEAT:
                f = self.ctl.take()
            if f:
                print("hub: got frame %d %s" % (f[0], f[1][:16].hex()), flush=True)   # for a failure's log
                return f
            if self.ctl.closed or now >= until:
                return None
            socks = [self.ctl.sock] + [d.sock for d in self.data if not d.closed]
            r, _, _ = select.select(socks, [], [], 0.1)
            if self.ctl.sock in r:
                self.ctl.fill()
            for d in self.data:
                if d.sock in r:
                    d.fill()
                    d.buf = b""   # the replica's uploads: not read here

    def expect(self, ftype, what):
        f = self.frame(time.time() + DEADLINE_S)
        while f is not None and f[0] != ftype:
            f = self.frame(time.time() + DEADLINE_S)
        if f is None:
            raise Failed("no %s from the replica (its control connection %s)" %
                         (what, "closed" if self.ctl.closed else "open, silent"))
        return f[1]

    def replica_said(self, text):
        """Waits (heartbeats going) until the replica's log ($REPLICA_LOG) holds text."""
        deadline = time.time() + DEADLINE_S
        while text not in open(os.environ["REPLICA_LOG"], errors="replace").read():
            if self.frame(min(deadline, time.time() + 0.05)) is None and time.time() >= deadline:
                raise Failed("the replica's log never said '%s'" % text)

    def delivered(self, stream=0):
        """Waits until the replica's kernel has acknowledged every byte sent on a data stream."""
        deadline = time.time() + DEADLINE_S
        while True:
            left = struct.unpack("i", fcntl.ioctl(self.data[stream].sock, termios.TIOCOUTQ, b"\0\0\0\0"))[0]
            if left == 0:
                return
            if self.frame(min(deadline, time.time() + 0.05)) is None and time.time() >= deadline:
                raise Failed("the replica did not take %d bytes of data stream %d" % (left, stream + 1))

    def data_frame(self, kind, step, total, offset, body, chunk=CHUNK, stream=0):
        head = struct.pack("<IB3xqQQII", 0, kind, step, total, offset, chunk, 0)
        self.data[stream].send(DATA, head + body)

    def send_state(self, round_, state):
        self.ctl.send(STATE, struct.pack("<qQIIII", round_, len(state), CHUNK, 0, 1, 0))   # flags 1: catch-up
        for off in range(0, len(state), CHUNK):
            self.data_frame(KIND_STATE, round_, len(state), off, state[off:off + CHUNK])


def state_bytes(n, outer_step, step, tokens, seed):
    """A donor's state (diloco.c's layout, docs/protocol.md): its counters, 8 empty round records,
    θ (random, small) and no momentum (the header's with_m 0)."""
    rnd = random.Random(seed)
    head = b"TGDLSTAT" + struct.pack("<II", 7, 0) + struct.pack("<qqqqqqq", outer_step, step, tokens, n, step, 0, 0)
    head += 8 * (struct.pack("<qII", -1, 0, 0) + bytes(32))
    return head + struct.pack("<%df" % n, *[rnd.uniform(-0.05, 0.05) for _ in range(n)])


def catchup_mean(round_, step, tokens):
    """The record of a round the group closed and skipped (no mean bytes: not applied)."""
    return (b"TGDLCTCH" + struct.pack("<II", 2, 0) + struct.pack("<qqqqq", round_, 0, step, tokens, 0) +
            struct.pack("<dd", 0.0, 0.0) + bytes(32))


def scenario_abort_after_mean(hub, n):
    # A catch-up join: the first donor's state and one mean reach the joiner (handed to diloco.c),
    # then the donor leaves (STATE_ABORT); the next donor's state comes with no mean (no round
    # closed meanwhile). The joiner counted the first transfer's mean against the second and
    # exited ("applied 1 catch-up mean(s) but the hub ended its catch-up after 0"): it must
    # train on, its next frame a CONTRIBUTE.
    hub.expect(JOIN, "JOIN")
    hub.ctl.send(JOINED, struct.pack("<IIqQ", JOINED_WAIT, 0, -1, 0))
    hub.send_state(5, state_bytes(n, 5, 25, 25 * 128, 1))
    hub.expect(CAUGHT_UP, "CAUGHT_UP for the first state")
    m = catchup_mean(5, 25, 25 * 128)
    hub.data_frame(KIND_CATCHUP, 6, len(m), 0, m)   # round 6's record (landing 5 + 1)
    hub.ctl.send(STATE_END, struct.pack("<q", 9))   # rounds 7 .. 9 still to come
    hub.delivered()
    hub.ctl.send(STATE_ABORT, struct.pack("<q", 5))
    # A relay designates the next donor at a later close: the abort is taken before its state
    # comes. (The replica reads control frames on another thread than data: sent at once, the
    # new state's chunks could be taken before the abort, and mixed with the old transfer.)
    hub.replica_said("the hub aborted the state transfer")
    hub.send_state(10, state_bytes(n, 10, 50, 50 * 128, 2))
    r = struct.unpack("<q", hub.expect(CAUGHT_UP, "CAUGHT_UP for the second state"))[0]
    hub.ctl.send(STATE_END, struct.pack("<q", r))
    hub.expect(CONTRIBUTE, "CONTRIBUTE after the second state (it trained)")


def scenario_abort_in_caught_up(hub, n):
    # Several hubs (this one the primary): the catch-up state comes whole, the replica says
    # CAUGHT_UP, and the hub aborts the transfer (the donor left). The replica took that for a
    # lost hub: it cut the session and moved this hub's shares to the other. It must JOIN again
    # on the same session.
    hub.expect(JOIN, "JOIN")
    hub.ctl.send(JOINED, struct.pack("<IIqQ", JOINED_WAIT, 0, -1, 0))
    hub.send_state(5 * 64, state_bytes(n, 5, 25, 25 * 128, 1))
    hub.expect(CAUGHT_UP, "CAUGHT_UP")
    hub.ctl.send(STATE_ABORT, struct.pack("<q", 5 * 64))
    hub.expect(JOIN, "JOIN again on the same session after STATE_ABORT")


def scenario_huge_mean(hub, n):
    # A joiner waiting for its state gets the first 16 KiB of a "catch-up mean" of 64 GiB: it
    # allocated the whole of it and exited, out of memory. It must treat the session as broken
    # (a line saying why) and connect again.
    hub.expect(JOIN, "JOIN")
    hub.ctl.send(JOINED, struct.pack("<IIqQ", JOINED_WAIT, 0, -1, 0))
    hub.data_frame(KIND_CATCHUP, 6, 1 << 36, 0, bytes(16 << 10), chunk=16 << 10)
    hub.session()
    hub.expect(JOIN, "JOIN on a new session")


def squat(hub, answer):
    """Something else on the hub's port, without the secret: it takes the replica's next
    connection and answers its AUTH with REFUSE(code) ('welcome': a WELCOME whose proof is not
    of the secret), then closes it."""
    c, nonce_h, p = hello(hub.l, time.time() + DEADLINE_S)
    if answer == "welcome":
        fields = struct.pack("<QII", 0x5EED, 10000, 0)
        c.send(WELCOME, fields + bytes(32))
    else:
        text = b"refused by a squatter"
        c.send(rp.REFUSE, struct.pack("<II", answer, len(text)) + text)
    c.sock.close()


def lose_session(hub):
    """The relay dies: every connection of the session closes."""
    hub.ctl.sock.close()
    for d in hub.data:
        d.sock.close()


def scenario_squatter(hub, n):
    # The relay dies mid-join, and while it is down something without the secret holds its port
    # and answers each AUTH with a refusal that would be fatal at start (secret 1, fingerprint 2,
    # bad id 4, hub order 7) or a WELCOME without our secret's proof. The replica exited on the
    # first: anyone on the login node could end a run. It must take each for a lost hub and join
    # the relay once it is back.
    hub.expect(JOIN, "JOIN")
    lose_session(hub)
    for answer in (1, 2, 4, 7, "welcome"):
        squat(hub, answer)
    hub.session()
    hub.expect(JOIN, "JOIN on a new session after the squatter's answers")


def scenario_squatter_forever(hub, n):
    # The same refusal at every try (a relay really restarted with another secret): the replica
    # ends the run once it has lasted diloco_connect_timeout_s, saying so.
    hub.expect(JOIN, "JOIN")
    lose_session(hub)
    deadline = time.time() + DEADLINE_S
    while "error:" not in open(os.environ["REPLICA_LOG"], errors="replace").read():
        if time.time() > deadline:
            raise Failed("the replica never gave up on the refusals")
        if select.select([hub.l], [], [], 0.05)[0]:
            try:
                squat(hub, 1)
            except (rp.Closed, OSError, Failed):
                pass   # the replica gave up during this try (its log says so next)


def main():
    name, port, secret_file, n = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    hub = Hub(port, open(secret_file, "rb").read().rstrip())
    print("hub: listening", flush=True)
    try:
        hub.session()
        globals()["scenario_" + name](hub, n)
    except (Failed, rp.Closed, TimeoutError, OSError) as e:
        print("%s: %s" % (name, e))
        sys.exit(1)
    print("%s: as expected" % name)


if __name__ == "__main__":
    main()
