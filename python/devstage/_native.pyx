# SPDX-License-Identifier: Apache-2.0
# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""The C calls of a step, compiled (see _calls.py, which chooses this module or ctypes and
documents the functions): each is the C call and the conversion of its ints, with the GIL
released around the calls that may block. The library's functions are not linked: init() is
given their addresses in the libdevstage_c that _lib loaded, so there is one library in the
process (and one handle table). Their types mirror include/devstage/c/devstage.h, handles and
pointers as void*."""
from cpython.buffer cimport PyBUF_C_CONTIGUOUS, PyBUF_FORMAT, PyObject_GetBuffer, PyBuffer_Release
from libc.stdint cimport uintptr_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy, strchr

ctypedef int (*f_create)(void*, const void*, size_t, void**) nogil
ctypedef int (*f_slot)(const void*, size_t*) nogil
ctypedef int (*f_hosts)(const void*, void**, size_t*, size_t) nogil
ctypedef int (*f_one)(void*) nogil
ctypedef int (*f_bind)(void*, const void*, size_t, void**) nogil
ctypedef int (*f_bind_on)(void*, const void*, size_t, void*, void**) nogil
ctypedef int (*f_bind_frame)(void*, const void*, void**) nogil
ctypedef int (*f_bind_frame_on)(void*, const void*, void*, void**) nogil
ctypedef int (*f_device_args)(const void*, void**, size_t) nogil
ctypedef int (*f_finish)(void*, void*, int) nogil
ctypedef int (*f_finish_on)(void*, void*, void*, int, void**) nogil
ctypedef int (*f_ready)(void*, int*) nogil
ctypedef void (*host_function)(void*)
ctypedef int (*f_launch)(void*, void*, host_function, void*) nogil

cdef f_create c_frame_create = NULL
cdef f_slot c_frame_slot = NULL
cdef f_hosts c_frame_hosts = NULL
cdef f_one c_frame_destroy = NULL
cdef f_bind c_bind = NULL
cdef f_bind_on c_bind_on = NULL
cdef f_bind_frame c_bind_frame = NULL
cdef f_bind_frame_on c_bind_frame_on = NULL
cdef f_slot c_run_slot = NULL
cdef f_device_args c_run_device_args = NULL
cdef f_one c_run_destroy = NULL
cdef f_finish c_finish = NULL
cdef f_finish_on c_finish_on = NULL
cdef f_one c_completion_wait = NULL
cdef f_ready c_completion_ready = NULL
cdef f_one c_completion_destroy = NULL
cdef f_launch c_launch = NULL

cdef object error_of = None     # (status, call) -> the exception, with this thread's message
cdef object run_function = None  # key -> runs the host function launched under it


def init(dict functions, error, run):
    """Takes the library's functions (name -> address), the error maker and the host-function
    runner of _calls."""
    global c_frame_create, c_frame_slot, c_frame_hosts, c_frame_destroy, c_bind, c_bind_on, c_bind_frame
    global c_bind_frame_on, c_run_slot, c_run_device_args, c_run_destroy, c_finish, c_finish_on
    global c_completion_wait, c_completion_ready, c_completion_destroy, c_launch, error_of, run_function
    c_frame_create = <f_create><uintptr_t>functions["devstage_frame_create"]
    c_frame_slot = <f_slot><uintptr_t>functions["devstage_frame_slot"]
    c_frame_hosts = <f_hosts><uintptr_t>functions["devstage_frame_hosts"]
    c_frame_destroy = <f_one><uintptr_t>functions["devstage_frame_destroy"]
    c_bind = <f_bind><uintptr_t>functions["devstage_bind"]
    c_bind_on = <f_bind_on><uintptr_t>functions["devstage_bind_on"]
    c_bind_frame = <f_bind_frame><uintptr_t>functions["devstage_bind_frame"]
    c_bind_frame_on = <f_bind_frame_on><uintptr_t>functions["devstage_bind_frame_on"]
    c_run_slot = <f_slot><uintptr_t>functions["devstage_run_slot"]
    c_run_device_args = <f_device_args><uintptr_t>functions["devstage_run_device_args"]
    c_run_destroy = <f_one><uintptr_t>functions["devstage_run_destroy"]
    c_finish = <f_finish><uintptr_t>functions["devstage_finish"]
    c_finish_on = <f_finish_on><uintptr_t>functions["devstage_finish_on"]
    c_completion_wait = <f_one><uintptr_t>functions["devstage_completion_wait"]
    c_completion_ready = <f_ready><uintptr_t>functions["devstage_completion_ready"]
    c_completion_destroy = <f_one><uintptr_t>functions["devstage_completion_destroy"]
    c_launch = <f_launch><uintptr_t>functions["devstage_launch_host_function"]
    error_of = error
    run_function = run


cdef inline void* p(object value) except? NULL:
    return <void*><uintptr_t>value


cdef inline int check(int status, object call) except -1:
    """Raises the library's error for a call that failed (status not 0), named `call`."""
    if status:
        raise error_of(status, call)
    return 0


cdef tuple pointers(const void* handle, size_t count, bint hosts):
    """A frame's host addresses (hosts) or a run's device addresses, `count` of them."""
    cdef void* fixed[16]
    cdef void** data = fixed
    cdef size_t i
    if count > 16:
        data = <void**>malloc(count * sizeof(void*))
        if data == NULL:
            raise MemoryError()
    try:
        if hosts:
            check(c_frame_hosts(handle, data, NULL, count), None)
        else:
            check(c_run_device_args(handle, data, count), None)
        return tuple([<uintptr_t>data[i] for i in range(count)])
    finally:
        if data != fixed:
            free(data)


def frame_create(stager, shapes, size_t count, call):
    cdef void* out = NULL
    cdef void* s = p(stager)
    cdef const void* table = p(shapes)
    cdef int status
    with nogil:
        status = c_frame_create(s, table, count, &out)
    check(status, call)
    return <uintptr_t>out


def frame_open(stager, shapes, size_t count, call, list memories):
    """frame_create, then its slot and every tensor's place: (frame, slot, places). `places` is
    the `hosts` tuple of memories[slot] itself (a SlotMemory, or None) when the places are the same
    ones: nothing is built for a slot framed again."""
    cdef void* out = NULL
    cdef void* s = p(stager)
    cdef const void* table = p(shapes)
    cdef int status
    cdef size_t slot = 0
    cdef void* fixed[16]
    cdef void** data = fixed
    cdef size_t i
    cdef tuple kept
    with nogil:
        status = c_frame_create(s, table, count, &out)
    check(status, call)
    try:
        check(c_frame_slot(out, &slot), call)
        if count > 16:
            data = <void**>malloc(count * sizeof(void*))
            if data == NULL:
                raise MemoryError()
        check(c_frame_hosts(out, data, NULL, count), call)
        memory = memories[slot] if slot < <size_t>len(memories) else None
        if memory is not None:
            kept = memory.hosts
            if <size_t>len(kept) == count:
                i = 0
                while i < count and <uintptr_t>kept[i] == <uintptr_t>data[i]:
                    i += 1
                if i == count:
                    return <uintptr_t>out, slot, kept
        return <uintptr_t>out, slot, tuple([<uintptr_t>data[i] for i in range(count)])
    except BaseException:
        c_frame_destroy(out)
        raise
    finally:
        if data != fixed:
            free(data)


def frame_slot(frame):
    cdef size_t slot = 0
    check(c_frame_slot(p(frame), &slot), None)
    return slot


def frame_hosts(frame, size_t count):
    return pointers(p(frame), count, True)


def frame_destroy(frame):
    return c_frame_destroy(p(frame))


def bind(stager, args, size_t count, stream, call):
    cdef void* out = NULL
    cdef void* s = p(stager)
    cdef const void* table = p(args)
    cdef void* on = p(stream)
    cdef int status
    with nogil:
        if on != NULL:
            status = c_bind_on(s, table, count, on, &out)
        else:
            status = c_bind(s, table, count, &out)
    check(status, call)
    return <uintptr_t>out


def bind_frame(stager, frame, stream, call):
    """Binds the frame and, once bound, destroys its handle (a view the run no longer needs)."""
    cdef void* out = NULL
    cdef void* s = p(stager)
    cdef void* f = p(frame)
    cdef void* on = p(stream)
    cdef int status
    with nogil:
        if on != NULL:
            status = c_bind_frame_on(s, f, on, &out)
        else:
            status = c_bind_frame(s, f, &out)
        if status == 0:
            c_frame_destroy(f)
    check(status, call)
    return <uintptr_t>out


def run_slot(run):
    cdef size_t slot = 0
    check(c_run_slot(p(run), &slot), None)
    return slot


def run_device_args(run, size_t count):
    return pointers(p(run), count, False)


def run_destroy(run):
    cdef void* r = p(run)
    cdef int status
    with nogil:
        status = c_run_destroy(r)
    return status


def finish(stager, run, int execution):
    cdef void* s = p(stager)
    cdef void* r = p(run)
    cdef int status
    with nogil:
        status = c_finish(s, r, execution)
    return status


def finish_on(stager, run, stream, int execution):
    cdef void* out = NULL
    cdef void* s = p(stager)
    cdef void* r = p(run)
    cdef void* on = p(stream)
    cdef int status
    with nogil:
        status = c_finish_on(s, r, on, execution, &out)
    return status, <uintptr_t>out


def completion_wait(completion):
    cdef void* c = p(completion)
    cdef int status
    with nogil:
        status = c_completion_wait(c)
    return status


def completion_ready(completion):
    # Without the GIL, as every call that may wait on a stream: a Python host function queued
    # there needs it to run.
    cdef void* c = p(completion)
    cdef int ready = 0
    cdef int status
    with nogil:
        status = c_completion_ready(c, &ready)
    check(status, None)
    return ready != 0


def completion_destroy(completion):
    cdef void* c = p(completion)
    cdef int status
    with nogil:
        status = c_completion_destroy(c)
    return status


cdef void trampoline(void* user) with gil:
    try:
        run_function(<uintptr_t>user)
    except BaseException:
        pass  # the runner reports its function's failures itself


def launch_host_function(backend, stream, key):
    return c_launch(p(backend), p(stream), trampoline, p(key))


def write(size_t address, size_t nbytes, value, const char* chars, Py_ssize_t itemsize, tuple shape):
    """Copies `value` to `address` when it has a C-contiguous buffer whose elements are of
    `itemsize` bytes and a format character among `chars` (a byte-order prefix @, = or < aside),
    of shape `shape`: True. False, writing nothing, otherwise (the caller says what differs)."""
    cdef Py_buffer view
    cdef bint same
    try:
        PyObject_GetBuffer(value, &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)
    except (TypeError, BufferError):
        return False
    try:
        same = _fits(&view, chars, itemsize, nbytes, shape)
        if same and nbytes:
            with nogil:
                memcpy(<void*>address, view.buf, nbytes)
    finally:
        PyBuffer_Release(&view)
    return same


cdef bint _fits(Py_buffer* view, const char* chars, Py_ssize_t itemsize, size_t nbytes, tuple shape):
    cdef const char* format = view.format
    cdef Py_ssize_t i
    if format == NULL:
        format = "B"
    if format[0] == b'@' or format[0] == b'=' or format[0] == b'<':
        format += 1
    if not (format[0] != 0 and format[1] == 0 and chars[0] != 0 and strchr(chars, format[0]) != NULL and
            view.itemsize == itemsize and view.ndim == len(shape) and <size_t>view.len == nbytes):
        return False
    for i in range(view.ndim):
        if view.shape[i] != shape[i]:
            return False
    return True


def write_all(tuple hosts, tuple nbytes, tuple chars, tuple itemsizes, tuple shapes, Py_ssize_t first, values):
    """write() of values[k] into tensor first + k, for every k: True once all are copied; False,
    writing nothing, when one does not fit (or has no C-contiguous buffer)."""
    cdef Py_ssize_t count = len(values), taken = 0, k
    cdef Py_buffer fixed[16]
    cdef Py_buffer* views = fixed
    cdef bint fits = True
    if first < 0 or first + count > len(hosts):
        return False
    if count > 16:
        views = <Py_buffer*>malloc(count * sizeof(Py_buffer))
        if views == NULL:
            raise MemoryError()
    try:
        for k in range(count):
            try:
                PyObject_GetBuffer(values[k], &views[k], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)
            except (TypeError, BufferError):
                fits = False
                break
            taken += 1
            if not _fits(&views[k], <bytes>chars[first + k], itemsizes[first + k], nbytes[first + k], shapes[first + k]):
                fits = False
                break
        if fits:
            for k in range(count):
                if views[k].len:
                    memcpy(<void*><uintptr_t>hosts[first + k], views[k].buf, <size_t>views[k].len)
        return fits
    finally:
        for k in range(taken):
            PyBuffer_Release(&views[k])
        if views != fixed:
            free(views)


cdef class HostBuffer:
    """Host memory as the buffer protocol gives it: C-contiguous and writable, as _expose() says
    (address, bytes, format, item size, shape); refused (BufferError) before that, after _shut(),
    and for a format of "" (no buffer form) or no bytes. A frame's HostView is one, so that NumPy
    makes an array of it without asking for its other protocols."""
    cdef void* _buf
    cdef Py_ssize_t _len
    cdef Py_ssize_t _itemsize
    cdef int _ndim
    cdef bytes _format
    cdef Py_ssize_t* _dims  # the shape, then the strides
    cdef bint _open

    def _expose(self, size_t address, Py_ssize_t nbytes, bytes format, Py_ssize_t itemsize, tuple shape):
        cdef int i
        cdef Py_ssize_t stride = itemsize
        free(self._dims)
        self._dims = NULL
        self._open = False
        self._ndim = len(shape)
        if self._ndim:
            self._dims = <Py_ssize_t*>malloc(2 * self._ndim * sizeof(Py_ssize_t))
            if self._dims == NULL:
                raise MemoryError()
            for i in range(self._ndim - 1, -1, -1):
                self._dims[i] = shape[i]
                self._dims[self._ndim + i] = stride
                stride *= shape[i]
        self._buf = <void*>address
        self._len = nbytes
        self._itemsize = itemsize
        self._format = format
        self._open = address != 0 and nbytes > 0 and len(format) > 0

    def _shut(self):
        self._open = False

    def __getbuffer__(self, Py_buffer* view, int flags):
        if not self._open:
            raise BufferError("devstage: this frame view's memory was given back (or it has no buffer form)")
        view.buf = self._buf
        view.obj = self
        view.len = self._len
        view.readonly = 0
        view.itemsize = self._itemsize
        view.format = <char*>self._format if flags & PyBUF_FORMAT else NULL
        view.ndim = self._ndim
        view.shape = self._dims
        view.strides = self._dims + self._ndim if self._dims != NULL else NULL
        view.suboffsets = NULL
        view.internal = NULL

    def __releasebuffer__(self, Py_buffer* view):
        pass

    def __dealloc__(self):
        free(self._dims)


cdef class Guard:
    """One call at a time on a stager: enter() takes it, False when a call (on another thread, the
    GIL released around its C call) holds it; leave() gives it back. A check and a set under the
    GIL, which enter() never releases: so no second thread gets in between."""
    cdef bint _held

    def enter(self):
        if self._held:
            return False
        self._held = True
        return True

    def leave(self):
        self._held = False
