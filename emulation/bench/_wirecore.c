/*
 * emulation.bench._wirecore: the wire floor's sender and receiver
 * (emulation.bench.wirefloor).
 *
 * One call, run(), sends fixed datagrams to one peer at a steady rate (a connected UDP
 * socket) and counts what arrives on another (bound) from anyone, with the GIL released
 * and no other work: no header to build, no lanes to copy or convert, no timers. What the
 * calling thread's CPU clock says afterwards is what moving those bytes through the
 * host's kernel and the network between costs a host: the floor under the CPU of any host
 * library that sends unicast UDP on the same path.
 *
 * The pacing mirrors a windowed sender: every period, one sendmmsg of `batch`
 * datagrams, then every datagram waiting (recvmmsg, not waiting), then sleep to the next
 * period's start (absolute, so a late wake-up does not lower the rate; periods that
 * began late are counted: many of them mean the host, not the link, set the pace). After
 * `seconds`, sends stop and receiving goes on until nothing came for `quiet` seconds, so
 * the datagrams still in the links are counted too. The socket's send buffer, set by the
 * caller, bounds what waits in a shaper's queue: a link slower than the rate blocks the
 * send rather than queueing without end.
 *
 * C, in the same build as hostlib's cores (a CPython extension built by pip with the
 * system compiler; optional: without it, the wire floor says it is not built).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#define MAX_BATCH 1024
#define MAX_DATAGRAM 65507 /* IPv4's largest UDP payload */

static double clock_s(clockid_t id) {
    struct timespec t;
    clock_gettime(id, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void add_ns(struct timespec *t, int64_t ns) {
    int64_t total = (int64_t)t->tv_nsec + ns;
    t->tv_sec += (time_t)(total / 1000000000);
    t->tv_nsec = (long)(total % 1000000000);
}

typedef struct {
    long long sent, received, late, periods;
    double seconds, cpu_s;
    int err; /* errno of a failed send or receive, else 0 */
} Counts;

/* Drain the socket without waiting: every datagram that is there now. */
static int drain(int fd, struct mmsghdr *rx, int batch, Counts *c) {
    for (;;) {
        int n = recvmmsg(fd, rx, (unsigned)batch, MSG_DONTWAIT, NULL);
        if (n > 0) {
            c->received += n;
            continue;
        }
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            return errno;
        return 0;
    }
}

static void run_loop(int fd, int rfd, struct mmsghdr *tx, struct mmsghdr *rx, uint8_t *out,
                     int batch, int datagram, double period, double seconds, double quiet,
                     Counts *c) {
    double cpu0 = clock_s(CLOCK_THREAD_CPUTIME_ID), t0 = clock_s(CLOCK_MONOTONIC);
    struct timespec next;
    clock_gettime(CLOCK_MONOTONIC, &next);
    uint64_t seq = 0;
    while (clock_s(CLOCK_MONOTONIC) - t0 < seconds) {
        for (int i = 0; i < batch; i++) { /* a sequence number in front: pcaps show order */
            uint8_t *p = out + (size_t)i * (size_t)datagram;
            for (int b = 7; b >= 0; b--)
                p[7 - b] = (uint8_t)(seq >> (8 * b));
            seq++;
        }
        int off = 0;
        while (off < batch) {
            int n = sendmmsg(fd, tx + off, (unsigned)(batch - off), 0);
            if (n < 0) {
                if (errno == EINTR)
                    continue;
                c->err = errno;
                goto done;
            }
            off += n;
        }
        c->sent += off;
        c->periods++;
        if ((c->err = drain(rfd, rx, batch, c)) != 0)
            goto done;
        add_ns(&next, (int64_t)(period * 1e9));
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec > next.tv_sec || (now.tv_sec == next.tv_sec && now.tv_nsec > next.tv_nsec))
            c->late++;
        else
            while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL) == EINTR) {
            }
    }
    c->seconds = clock_s(CLOCK_MONOTONIC) - t0;
    double last = clock_s(CLOCK_MONOTONIC);
    while (clock_s(CLOCK_MONOTONIC) - last < quiet) {
        long long before = c->received;
        if ((c->err = drain(rfd, rx, batch, c)) != 0)
            break;
        if (c->received != before)
            last = clock_s(CLOCK_MONOTONIC);
        struct timespec nap = {0, 1000000}; /* 1 ms */
        nanosleep(&nap, NULL);
    }
done:
    if (c->seconds == 0.0)
        c->seconds = clock_s(CLOCK_MONOTONIC) - t0;
    c->cpu_s = clock_s(CLOCK_THREAD_CPUTIME_ID) - cpu0;
}

static PyObject *wire_run(PyObject *Py_UNUSED(self), PyObject *args, PyObject *kwargs) {
    static char *names[] = {"send_fd", "recv_fd", "batch", "datagram", "rate_bps", "seconds",
                            "quiet", NULL};
    int fd, rfd, batch, datagram;
    double rate, seconds, quiet;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iiiiddd:run", names, &fd, &rfd, &batch,
                                     &datagram, &rate, &seconds, &quiet))
        return NULL;
    if (fd < 0 || rfd < 0 || batch < 1 || batch > MAX_BATCH || datagram < 8 ||
        datagram > MAX_DATAGRAM || !(rate > 0) || !(seconds > 0) || !(quiet >= 0) || quiet > 60) {
        PyErr_Format(PyExc_ValueError,
                     "run(send_fd=%d, batch=%d, datagram=%d, ...): need descriptors >= 0, "
                     "batch 1..%d, datagram 8..%d bytes, a positive rate and seconds, "
                     "quiet 0..60",
                     fd, batch, datagram, MAX_BATCH, MAX_DATAGRAM);
        return NULL;
    }
    size_t bytes = (size_t)batch * (size_t)datagram;
    uint8_t *out = calloc(bytes, 1), *in = malloc(bytes);
    struct mmsghdr *tx = calloc((size_t)batch, sizeof *tx), *rx = calloc((size_t)batch, sizeof *rx);
    struct iovec *tv = calloc((size_t)batch, sizeof *tv), *rv = calloc((size_t)batch, sizeof *rv);
    if (!out || !in || !tx || !rx || !tv || !rv) {
        free(out), free(in), free(tx), free(rx), free(tv), free(rv);
        return PyErr_NoMemory();
    }
    for (int i = 0; i < batch; i++) {
        tv[i] = (struct iovec){out + (size_t)i * (size_t)datagram, (size_t)datagram};
        rv[i] = (struct iovec){in + (size_t)i * (size_t)datagram, (size_t)datagram};
        tx[i].msg_hdr.msg_iov = &tv[i];
        tx[i].msg_hdr.msg_iovlen = 1;
        rx[i].msg_hdr.msg_iov = &rv[i];
        rx[i].msg_hdr.msg_iovlen = 1;
    }
    double period = (double)bytes * 8.0 / rate;
    Counts c = {0};
    Py_BEGIN_ALLOW_THREADS
    run_loop(fd, rfd, tx, rx, out, batch, datagram, period, seconds, quiet, &c);
    Py_END_ALLOW_THREADS
    free(out), free(in), free(tx), free(rx), free(tv), free(rv);
    if (c.err != 0) {
        errno = c.err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return Py_BuildValue("{s:L,s:L,s:L,s:L,s:d,s:d}", "sent", c.sent, "received", c.received,
                         "late_periods", c.late, "periods", c.periods, "seconds", c.seconds,
                         "cpu_s", c.cpu_s);
}

static PyMethodDef methods[] = {
    {"run", (PyCFunction)(void (*)(void))wire_run, METH_VARARGS | METH_KEYWORDS,
     "run(send_fd, recv_fd, batch, datagram, rate_bps, seconds, quiet) -> counts: send "
     "`batch` datagrams of `datagram` bytes per period at `rate_bps` on the connected UDP "
     "socket `send_fd` for `seconds`, receive on `recv_fd` all that arrives, then until "
     "`quiet` seconds pass without any"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "emulation.bench._wirecore",
    "The wire floor's sender and receiver (see emulation.bench.wirefloor).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__wirecore(void) {
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    PyObject *all = Py_BuildValue("[s]", "run");
    if (!all || PyModule_AddObject(m, "__all__", all) < 0) {
        Py_XDECREF(all);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
