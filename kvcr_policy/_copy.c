/* Descriptor copies in one call, the GIL released: kvcr_policy._copy.copy_many.
 *
 * Issuing each copy from Python costs about 0.3 us (ctypes.memmove); for 16 KiB fragments
 * that is a fifth of the copy itself. Looping here removes that cost for every profile.
 *
 * Copies of at least `stream_from` bytes (0: never) use non-temporal stores: the destination
 * lines are not read first (no read-for-ownership), so a memory-bound copy moves two bytes of
 * DRAM traffic per byte instead of three. glibc's memcpy does the same only above
 * x86_non_temporal_threshold (240 MiB on our machines, glibc tunables), far above the 16 MiB
 * runs a coalesced KV restore is made of.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) || defined(_M_X64)
#include <emmintrin.h> /* SSE2: part of every x86-64 CPU */
#define KVCR_HAVE_STREAM 1
#else
#define KVCR_HAVE_STREAM 0
#endif

static void stream_copy(char *dst, const char *src, size_t n)
{
#if KVCR_HAVE_STREAM
    size_t head = (64 - ((uintptr_t)dst & 63)) & 63; /* align stores to a cache line */
    if (head > n)
        head = n;
    memcpy(dst, src, head);
    dst += head;
    src += head;
    n -= head;
    size_t body = n & ~(size_t)63;
    for (size_t i = 0; i < body; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(src + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(src + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(src + i + 32));
        __m128i d = _mm_loadu_si128((const __m128i *)(src + i + 48));
        _mm_stream_si128((__m128i *)(dst + i), a);
        _mm_stream_si128((__m128i *)(dst + i + 16), b);
        _mm_stream_si128((__m128i *)(dst + i + 32), c);
        _mm_stream_si128((__m128i *)(dst + i + 48), d);
    }
    /* No fence here: copy_many fences once, after its last copy. A fence per copy waits for
     * the write-combining buffers to drain at every fragment of a scattered restore. */
    memcpy(dst + body, src + body, n - body);
#else
    memcpy(dst, src, n);
#endif
}

static int overlaps(uintptr_t a, uintptr_t b, size_t n)
{
    return a < b + n && b < a + n;
}

static PyObject *copy_many(PyObject *self, PyObject *args)
{
    unsigned long long dst_base, src_base;
    long long stream_from;
    Py_buffer dst, src, len;
    (void)self;
    if (!PyArg_ParseTuple(args, "KKy*y*y*L", &dst_base, &src_base, &dst, &src, &len,
                          &stream_from))
        return NULL;
    PyObject *result = NULL;
    if (dst.len != src.len || dst.len != len.len || dst.len % 8 != 0) {
        PyErr_Format(PyExc_ValueError,
                     "copy_many: dst, src and length must be int64 arrays of one length "
                     "(got %zd, %zd and %zd bytes)",
                     dst.len, src.len, len.len);
        goto done;
    }
    Py_ssize_t count = dst.len / 8;
    const int64_t *d = (const int64_t *)dst.buf, *s = (const int64_t *)src.buf,
                  *l = (const int64_t *)len.buf;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (d[i] < 0 || s[i] < 0 || l[i] < 0) {
            PyErr_Format(PyExc_ValueError, "copy_many: negative offset or length at %zd", i);
            goto done;
        }
    }
    Py_BEGIN_ALLOW_THREADS
    int streamed = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        char *to = (char *)(uintptr_t)(dst_base + (unsigned long long)d[i]);
        const char *from = (const char *)(uintptr_t)(src_base + (unsigned long long)s[i]);
        size_t n = (size_t)l[i];
        if (stream_from > 0 && n >= (size_t)stream_from &&
            !overlaps((uintptr_t)to, (uintptr_t)from, n)) {
            stream_copy(to, from, n);
            streamed = 1;
        } else {
            memmove(to, from, n);
        }
    }
#if KVCR_HAVE_STREAM
    if (streamed)
        _mm_sfence(); /* streamed stores are visible to other threads before we return */
#else
    (void)streamed;
#endif
    Py_END_ALLOW_THREADS
    Py_INCREF(Py_None);
    result = Py_None;
done:
    PyBuffer_Release(&dst);
    PyBuffer_Release(&src);
    PyBuffer_Release(&len);
    return result;
}

static PyMethodDef methods[] = {
    {"copy_many", copy_many, METH_VARARGS,
     "copy_many(dst_base, src_base, dst_offsets, src_offsets, lengths, stream_from)\n"
     "Copy every descriptor (int64 arrays), the GIL released; copies of at least\n"
     "stream_from bytes (0: none) use non-temporal stores."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_copy", "Descriptor copies in native code.", -1, methods,
};

PyMODINIT_FUNC PyInit__copy(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "HAVE_STREAM", KVCR_HAVE_STREAM) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
